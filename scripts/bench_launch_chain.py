#!/usr/bin/env python3
"""What a chain of batch-1 decode kernels can reach on this GPU, apart from any GEMV's arithmetic (a benchmark, not
a test): the floor under the decode step's kernel split.

Two tables, each a CUDA graph of launches in a row (at least `--chain`; the reads cycle over >= 200 MB of buffers,
so that no launch finds its bytes in L2, as in the step), median of `--repeat` replays, with programmatic
dependent launch (PDL: each kernel waits on the previous one as the step's kernels do) and without:
  empty   a kernel that waits, then bumps one int32 a program: the cost of one more launch in the step's chain,
          for grids of 1 / 132 / 800 programs.
  read    a kernel that reads S bytes (16 B loads, all of a program's loads issued before its sum) and writes one
          int32 a program: how long a kernel of S bytes takes at the least, for the step's kernel sizes (the
          experts' down 5.4 MB, gate/up 10.6, out_proj 8.4, q+k+v 18.9, in_proj 25.5, attention's KV 33.6, the
          LM head 286). GB/s and the fraction of the peak given (--peak, default the H200's 4.8 TB/s); "early":
          the same with PDL and the loads issued before the wait (the most a weight prefetch ahead of the wait
          can give a chain of pure reads; the GEMVs' version lost, docs/RESULTS.md session 19).
With the read table, the step's floor for its current kernels is each kernel's bytes at the read time of its
size plus the launches of the latency kernels at the empty time; docs/RESULTS.md holds that sum.

    python scripts/bench_launch_chain.py [--chain 40] [--repeat 20]
    TRITON_INTERPRET=1 python scripts/bench_launch_chain.py --device cpu   # smoke run: small sizes, no graph
"""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from bench_nvfp4_experts_decode import graph_timed  # scripts/ is on the path when this runs as a script
from qwenlocal.engine.kernels.launch import gdc_prologue, pdl_launch, programmatic_launch

MB = 1e6
SIZES_MB = (1.0, 2.5, 5.4, 8.4, 10.6, 18.9, 25.5, 33.6, 286.0)  # the step's kernel sizes (docs/RESULTS.md s18)


@triton.jit
def bump_kernel(buf_ptr, USE_GDC: tl.constexpr = False):
    """Wait on the previous kernel, then add 1 to this program's int32: a launch that does nothing else."""
    gdc_prologue(USE_GDC)
    pid = tl.program_id(0)
    tl.store(buf_ptr + pid, tl.load(buf_ptr + pid) + 1)


@triton.jit
def read_kernel(src_ptr, out_ptr, n_words, WORDS: tl.constexpr, STEPS: tl.constexpr, USE_GDC: tl.constexpr = False,
                EARLY: tl.constexpr = False):
    """Program p sums the int32 words p * STEPS * WORDS ... of src (STEPS loads of WORDS words a thread-block,
    unrolled, so that all of them are in flight before the sum) and stores the sum: a read of the bytes and
    nothing else. EARLY: the loads are issued before the PDL wait (as weights could be: nothing writes them), so
    that they overlap the previous launch's tail; the sum and the store after it."""
    if not EARLY:
        gdc_prologue(USE_GDC)
    base = tl.program_id(0).to(tl.int64) * (STEPS * WORDS)
    offs = tl.arange(0, WORDS)
    acc = tl.zeros([WORDS], dtype=tl.int32)
    for s in tl.static_range(STEPS):
        idx = base + s * WORDS + offs
        acc += tl.load(src_ptr + idx, mask=idx < n_words, other=0)
    if EARLY:
        gdc_prologue(USE_GDC)
    tl.store(out_ptr + tl.program_id(0), tl.sum(acc, axis=0))


def chain_time(launch, chain: int, repeat: int, cuda: bool) -> float:
    """Seconds per launch of `launch(i)` for i in 0..chain-1: one CUDA graph of the chain (graph_timed)."""
    return graph_timed([lambda i=i: launch(i) for i in range(chain)], repeat, cuda)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chain", type=int, default=40, help="launches in one graph (a step has 40 layers)")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--peak", type=float, default=4.8e12, help="bytes/s the fractions are of")
    ap.add_argument("--words", type=int, default=1024, help="int32 words a load step of a program (4 KB)")
    ap.add_argument("--steps", type=int, default=4, help="load steps a program (16 KB a program by default)")
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    cuda = args.device == "cuda"
    dev = torch.device(args.device)
    chain = args.chain if cuda else 3
    sizes = SIZES_MB if cuda else (0.05, 0.2)
    grids = (1, 132, 800) if cuda else (1, 5)

    print(f"== empty: one launch in a chain of {chain} (us a launch) ==")
    print(f"{'programs':>8} {'plain':>8} {'PDL':>8}")
    for grid in grids:
        bufs = [torch.zeros(grid, device=dev, dtype=torch.int32) for _ in range(chain)]
        row = []
        for pdl in (False, True):
            with programmatic_launch(pdl):
                kw = pdl_launch(dev)
                row.append(1e6 * chain_time(lambda i: bump_kernel[(grid,)](bufs[i], **kw), chain, args.repeat, cuda))
        print(f"{grid:>8} {row[0]:>8.2f} {row[1]:>8.2f}")

    per_program = 4 * args.words * args.steps
    print(f"\n== read: S bytes a launch, {per_program // 1024} KB a program, {args.warps} warps (chains of >= {chain}, "
          f">= 200 MB) ==")
    print(f"{'S (MB)':>7} {'programs':>8} {'plain us':>9} {'PDL us':>8} {'PDL GB/s':>9} {'of peak':>8} "
          f"{'early us':>9}")
    for size in sizes:
        n_words = int(size * MB) // 4
        programs = triton.cdiv(n_words, args.words * args.steps)
        # buffers that together spill L2 (50 MB on an H200) and a chain that reads them all, so that no launch
        # finds its bytes in L2 from the replay before: >= 200 MB a replay
        copies = max(2, triton.cdiv(int(200 * MB), n_words * 4)) if cuda else 2
        launches = max(chain, copies) if cuda else chain
        srcs = [torch.randint(0, 7, (n_words,), device=dev, dtype=torch.int32) for _ in range(copies)]
        out = torch.empty(programs, device=dev, dtype=torch.int32)
        read_kernel[(programs,)](srcs[0], out, n_words, WORDS=args.words, STEPS=args.steps, num_warps=args.warps)
        if int(out.long().sum()) != int(srcs[0].long().sum()):  # every byte read once, or the figures mean nothing
            raise SystemExit(f"read_kernel summed {int(out.long().sum())}, the buffer holds {int(srcs[0].long().sum())}")
        row = []
        for pdl, early in ((False, False), (True, False), (True, True)):
            with programmatic_launch(pdl):
                kw = pdl_launch(dev)
                row.append(1e6 * chain_time(
                    lambda i: read_kernel[(programs,)](srcs[i % copies], out, n_words, WORDS=args.words,
                                                       STEPS=args.steps, EARLY=early, num_warps=args.warps, **kw),
                    launches, args.repeat, cuda))
        gbps = size * MB / (row[1] * 1e-6) / 1e9
        print(f"{size:>7.1f} {programs:>8} {row[0]:>9.2f} {row[1]:>8.2f} {gbps:>9.0f} {gbps * 1e9 / args.peak:>8.1%} "
              f"{row[2]:>9.2f}")


if __name__ == "__main__":
    main()
