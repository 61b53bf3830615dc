#!/usr/bin/env python3
"""How fast the batch-1 expert kernels' bytes can be read at all: the gate/up and down rows of the top-8 + shared
experts read with the expert kernels' access pattern and nothing else (a benchmark, not a test). Prints a table.

Why: expert_gate_up takes 9.35 us for its 10.6 MB (1.1 TB/s, a quarter of the H200's HBM speed), and a kernel
with half its instructions a code was slower (docs/RESULTS.md session 13), so issue is not what bounds it. This
separates the memory side: each program reads the rows expert_gate_up's program reads (block_n gate rows and
the same up rows of expert ids[j], the whole K row) or expert_down_parts' (block_m rows of one expert's down),
XOR-folds the words (so that no load is dead) and writes one word. If this alone takes most of the 9.35 us at the
kernel's grid, the grid and the rows' layout are the bound; the rows below say which grid and which load width
would lift it:
  aligned=False  the bank as it is: rows 1,769,484 B apart, 4-byte aligned, 32-bit loads
  aligned=True   the same rows copied to a stride padded to 16 B (1,769,488), so 16-byte loads are possible
                 (vec 4: four words a thread in one load)
Each row: microseconds a call (a CUDA graph of --inner calls over other expert ids, so L2 does not hold the rows
between calls; median of --repeat replays), MB read, GB/s, % of 4.8 TB/s.

    python scripts/bench_expert_stream.py                # H200: under a minute
    python scripts/bench_expert_stream.py --device cpu   # smoke run (Triton interpreter, a small geometry)
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys
import time

import torch

HBM = 4.8e12


def build_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def stream_rows_kernel(words_ptr, ids_ptr, out_ptr, ROW_WORDS: tl.constexpr, AT: tl.constexpr,
                           ROWS: tl.constexpr, K_WORDS: tl.constexpr, SECOND: tl.constexpr, K_ROUTED: tl.constexpr,
                           BLOCK_N: tl.constexpr, VEC: tl.constexpr):
        """Program (j, q): rows q * BLOCK_N .. of expert ids[j]'s matrix at word AT of its row (ROWS rows of
        K_WORDS words), and with SECOND the same rows ROWS / 2 further (gate/up's up rows)."""
        j = tl.program_id(0)
        e = tl.load(ids_ptr + tl.minimum(j, K_ROUTED - 1)).to(tl.int64)
        base = words_ptr + e * ROW_WORDS + AT
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        w = tl.max_contiguous(tl.multiple_of(tl.arange(0, K_WORDS), VEC), VEC)
        offs = n[:, None] * K_WORDS + w[None, :]
        acc = tl.load(base + offs)
        if SECOND:
            acc = acc ^ tl.load(base + (ROWS // 2) * K_WORDS + offs)
        folded = tl.xor_sum(acc, axis=1)
        tl.store(out_ptr + (j * tl.num_programs(1) + tl.program_id(1)) * BLOCK_N + tl.arange(0, BLOCK_N), folded)

    return stream_rows_kernel


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--inner", type=int, default=None, help="calls (other ids) per graph (default 16; CPU 1)")
    ap.add_argument("--repeat", type=int, default=None, help="graph replays per row (default 50; CPU 1)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    cuda = args.device == "cuda"
    if not cuda:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    elif not torch.cuda.is_available():
        print("no CUDA device: run with --device cpu for a smoke run", file=sys.stderr)
        return 2
    import triton

    sys.path.insert(0, os.path.dirname(__file__))
    from bench_nvfp4_experts_decode import graph_timed  # the same graph timing as the expert kernels' bench
    from qwenlocal.engine.kernels.nvfp4_experts_decode import _row_offsets
    from qwenlocal.engine.quant.nvfp4_rows import nvfp4_expert_row_bytes

    kernel = build_kernel()
    h, i, experts, k = (2048, 512, 256, 8) if cuda else (256, 64, 12, 3)
    inner, repeat = args.inner or (16 if cuda else 1), args.repeat or (50 if cuda else 1)
    dev = torch.device(args.device)
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    row_bytes = nvfp4_expert_row_bytes(h, i)
    padded = -(-row_bytes // 16) * 16
    bank = torch.randint(0, 2 ** 31 - 1, (experts + 1, padded // 4), generator=gen, device=dev, dtype=torch.int32)
    layouts = {False: bank.view(torch.uint8).reshape(-1)[:(experts + 1) * row_bytes].view(experts + 1, row_bytes),
               True: bank.view(torch.uint8)}  # the same bytes at the real stride, and at a 16-byte stride
    ids = [torch.randperm(experts, generator=gen, device=dev)[:k + 1].reshape(1, -1) for _ in range(inner)]
    off = _row_offsets(h, i)
    # (name, word offset in the row, rows, words a row, two regions, MB read a call)
    parts = [("gate_up", 0, 2 * i, h // 8, True, (k + 1) * 2 * i * h / 2 / 1e6),
             ("down", off["dn_at"], h, i // 8, False, (k + 1) * h * i / 2 / 1e6)]
    print(f"# {torch.cuda.get_device_name() if cuda else 'cpu (Triton interpreter)'}; hidden {h}, inter {i}, "
          f"top-{k} + 1 rows; packed codes only (scales: +1/8); {inner} calls a graph, median of {repeat}")
    print(f"{'part':<8} {'aligned':>7} {'vec':>3} {'block_n':>7} {'warps':>5} {'programs':>8} {'us':>8} "
          f"{'MB':>6} {'GB/s':>7} {'% HBM':>6}", flush=True)
    grid_n = (2, 4, 8, 16, 32) if cuda else (16,)
    warps = (2, 4, 8) if cuda else (4,)
    for (name, at, rows, k_words, second, mb), aligned, vec, block_n, nw in itertools.product(
            parts, (False, True), (1, 4), grid_n, warps):
        if vec > 1 and not aligned:
            continue  # 16-byte loads need 16-byte aligned rows
        mat_rows = rows // 2 if second else rows
        if block_n > mat_rows:
            continue
        words = layouts[aligned].view(torch.int32)
        out = torch.empty((k + 1) * mat_rows, device=dev, dtype=torch.int32)
        programs = (k + 1, triton.cdiv(mat_rows, block_n))

        def call(ids_t, words=words, out=out, programs=programs, block_n=block_n, nw=nw, vec=vec):
            kernel[programs](words, ids_t, out, ROW_WORDS=words.stride(0), AT=at, ROWS=rows, K_WORDS=k_words,
                             SECOND=second, K_ROUTED=k + 1, BLOCK_N=block_n, VEC=vec, num_warps=nw)

        try:
            sec = graph_timed([lambda t=t: call(t) for t in ids], repeat, cuda)
        except Exception as exc:  # noqa: BLE001 (a config that does not compile: say why, go on)
            print(f"skip {name} aligned={aligned} vec={vec} block_n={block_n} warps={nw}: "
                  f"{type(exc).__name__}: {str(exc).splitlines()[0][:100]}", flush=True)
            continue
        print(f"{name:<8} {str(aligned):>7} {vec:>3} {block_n:>7} {nw:>5} {programs[0] * programs[1]:>8} "
              f"{sec * 1e6:>8.2f} {mb:>6.2f} {mb * 1e6 / sec / 1e9:>7.1f} {100 * mb * 1e6 / sec / HBM:>6.1f}",
              flush=True)
    return 0


if __name__ == "__main__":
    t0 = time.perf_counter()
    rc = main()
    print(f"# {time.perf_counter() - t0:.1f} s")
    sys.exit(rc)
