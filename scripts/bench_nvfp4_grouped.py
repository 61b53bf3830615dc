#!/usr/bin/env python3
"""The NVFP4 grouped prefill MoE's launch configurations, timed (a benchmark, not a test). Prints a table.

At the real geometry (hidden 2048, inter 512, 256 experts, top-8, bf16 activations), T tokens routed to
random distinct top-8 experts each, synthetic NVFP4 rows (random codes and block scales), it times:
  bf16 moe_grouped    engine/kernels/moe_triton.moe_grouped on the bank dequantized to bf16: the target
  dequant+bf16        dequantize the whole 256-expert bank to bf16 once (torch, timed) + that moe_grouped
  nvfp4 <config>      nvfp4_moe_grouped under a grid of GroupedConfigs (block_m 256 with narrow tiles; then
                      block_m 32/64/128 x num_warps 4/8 x num_stages 2/3/4 x three tile sets; nearest to
                      choose_config's defaults first), then the best two with the strided-activation /
                      per-byte-scale code paths. A config that fails to compile is skipped with the reason;
                      the grid stops starting configs after --budget s.
Each row: the median of --repeat timed calls (CUDA events) after two warm-up calls, TFLOP/s = 2*T*k*3*H*I /
time, and the output's max error against nvfp4_moe_grouped_reference relative to the reference's max (once per
config and T). The best config per T and overall (sum over the T's) come last.

    python scripts/bench_nvfp4_grouped.py                # H200: about 100 s
    python scripts/bench_nvfp4_grouped.py --device cpu --tokens 64 --small    # smoke run (Triton interpreter)
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import statistics
import sys
import time

import torch

from bench_resident import timed as cuda_timed  # scripts/ is on sys.path when this runs as a script

REAL = dict(hidden=2048, inter=512, experts=256, top_k=8)
SMALL = dict(hidden=64, inter=32, experts=8, top_k=2)
TILES = [dict(gu_block_n=64, gu_block_k=128, dn_block_n=128, dn_block_k=64),
         dict(gu_block_n=64, gu_block_k=128, dn_block_n=64, dn_block_k=128),
         dict(gu_block_n=128, gu_block_k=64, dn_block_n=128, dn_block_k=128)]
# 256-row blocks (8,192-token chunks give 256 pairs an expert: each weight tile decoded once, not twice) with the
# narrow tiles whose sm_90 code has no spills (Triton 3.6: gate_up 210 registers, down 143 / 210).
TILES_256 = [dict(gu_block_n=32, gu_block_k=64, dn_block_n=32, dn_block_k=64),
             dict(gu_block_n=32, gu_block_k=64, dn_block_n=64, dn_block_k=64)]
MAX_ERR = 3e-2  # a bf16 output against the fp32 reference; more means a wrong config


def timed(fn, repeat: int, cuda: bool) -> tuple[float, object]:
    """(median seconds of `repeat` calls after two warm-up calls, the first call's result)."""
    out = fn()
    if cuda:
        return cuda_timed(fn, repeat), out  # one more warm-up, then CUDA events
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def max_rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref).abs().max() / ref.abs().max().clamp(min=1e-30)).item()


def grid(cuda: bool, num_pairs: list[int], experts: int, choose_config, GroupedConfig) -> list:
    """Phase-1 configs, the defaults choose_config picks for these T's first, then by distance to the default
    of the same block_m (so a cut by the time budget drops the far corners of the grid)."""
    defaults = {}
    for p in num_pairs:
        d = choose_config(p, experts, gpu=cuda)
        defaults.setdefault(d.block_m, d)
    if not cuda:  # the interpreter ignores warps and stages: vary what changes the computation
        out = list(defaults.values())
        for bm in (32, 64, 128):
            cfg = dataclasses.replace(choose_config(0, 1, gpu=False), block_m=bm)
            if cfg not in out:
                out.append(cfg)
        return out
    configs = [GroupedConfig(block_m=256, num_warps=8, num_stages=stages, **tiles)
               for tiles, stages in itertools.product(TILES_256, (2, 3))]
    for bm, tiles, warps, stages in itertools.product((128, 64, 32), TILES, (4, 8), (2, 3, 4)):
        configs.append(GroupedConfig(block_m=bm, num_warps=warps, num_stages=stages, **tiles))
    first = list(defaults.values())
    by_block_m = {choose_config(avg, 1, gpu=True).block_m: choose_config(avg, 1, gpu=True) for avg in range(1, 257)}

    def distance(c):
        base = defaults.get(c.block_m) or by_block_m.get(c.block_m, c)
        return sum(getattr(c, f.name) != getattr(base, f.name) for f in dataclasses.fields(c))

    rest = sorted((c for c in configs if c not in first), key=lambda c: (distance(c), -c.block_m))
    return first + rest


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--tokens", default="2048,8192,16384", help="comma-separated T values (8,192: the GPU's chunk)")
    ap.add_argument("--small", action="store_true", help=f"tiny geometry {SMALL} (smoke runs)")
    ap.add_argument("--repeat", type=int, default=None, help="timed calls per row (default 10 on CUDA, 1 on CPU)")
    ap.add_argument("--budget", type=float, default=90.0, help="start no config after this many seconds")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t_start = time.perf_counter()
    cuda = args.device == "cuda"
    if not cuda:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
    elif not torch.cuda.is_available():
        print("no CUDA device: run with --device cpu --small for a smoke run", file=sys.stderr)
        return 2
    from qwenlocal.engine.kernels.moe_triton import moe_grouped
    from qwenlocal.engine.kernels.nvfp4_grouped import (
        GroupedConfig, choose_config, dequant_nvfp4_rows, nvfp4_moe_grouped, nvfp4_moe_grouped_reference,
        random_nvfp4_rows,
    )

    geo = SMALL if args.small else REAL
    h, i, e, k = geo["hidden"], geo["inter"], geo["experts"], geo["top_k"]
    tokens = [int(t) for t in args.tokens.split(",")]
    repeat = args.repeat or (10 if cuda else 1)
    # The interpreter matmuls bf16 as raw bits (see nvfp4_grouped._dot): moe_grouped needs fp32 there.
    dtype = torch.bfloat16 if cuda else torch.float32
    dev = torch.device(args.device)
    torch.manual_seed(args.seed)
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    rows = random_nvfp4_rows(e, h, i, dev, gen)
    problems = {}
    for t in tokens:
        x = torch.randn(t, h, device=dev, generator=gen).to(dtype)
        ids = torch.rand(t, e, device=dev, generator=gen).topk(k, dim=1).indices  # k distinct experts a token
        w = torch.softmax(torch.randn(t, k, device=dev, generator=gen), dim=1).to(dtype)
        problems[t] = (x, w, ids, nvfp4_moe_grouped_reference(x, w, ids, rows, h, i))
    flops = {t: 2 * t * k * 3 * h * i for t in tokens}
    print(f"# {torch.cuda.get_device_name() if cuda else 'cpu (Triton interpreter)'}; hidden {h}, inter {i}, "
          f"{e} experts, top-{k}, {dtype}; T = {tokens}; median of {repeat} "
          f"(setup {time.perf_counter() - t_start:.1f} s)")
    print(f"{'what':<58} {'T':>6} {'ms':>9} {'TFLOP/s':>8} {'max rel err':>11}")
    sys.stdout.flush()

    def row(what, t, sec, err):
        shown = "-" if err is None else f"{err:.2e}"  # None: the row's output is the row above's
        print(f"{what:<58} {t:>6} {sec * 1e3:>9.3f} {flops[t] / sec / 1e12:>8.2f} {shown:>11}", flush=True)

    # The target: BF16 experts through moe_grouped, and the dequantize-once option.
    deq_sec, (gate_up, down) = timed(lambda: dequant_nvfp4_rows(rows, h, i, dtype, chunk=64), repeat, cuda)
    print(f"dequantize all {e} experts to {dtype} once: {deq_sec * 1e3:.3f} ms "
          f"({(gate_up.numel() + down.numel()) * gate_up.element_size() / 2**30:.2f} GiB)", flush=True)
    dense = "bf16" if dtype == torch.bfloat16 else "fp32"
    bf16 = {}
    for bm in (32, 64, 128):
        for t in tokens:
            x, w, ids, ref = problems[t]
            sec, out = timed(lambda: moe_grouped(x, w, ids, gate_up, down, block_m=bm), repeat, cuda)
            bf16[bm, t] = sec
            row(f"{dense} moe_grouped block_m={bm}" + (" (engine default)" if bm == 32 else ""), t, sec,
                max_rel(out, ref))
    for t in tokens:
        row(f"dequant+{dense}: dequantize bank + moe_grouped block_m=32", t, deq_sec + bf16[32, t], None)

    results = {}  # config -> {t: seconds}

    def run(cfg) -> None:
        try:
            for t in tokens:
                x, w, ids, ref = problems[t]
                sec, out = timed(lambda: nvfp4_moe_grouped(x, w, ids, rows, h, i, config=cfg), repeat, cuda)
                err = max_rel(out, ref)
                row(f"nvfp4 {cfg.label()}" + (" WRONG" if not err <= MAX_ERR else ""), t, sec, err)
                if not err <= MAX_ERR:
                    return
                results.setdefault(cfg, {})[t] = sec
        except Exception as exc:  # a config that does not compile (shared memory, registers, ...): say why
            msg = str(exc).strip().splitlines()
            print(f"skip nvfp4 {cfg.label()}: {type(exc).__name__}: {msg[0][:160] if msg else ''}", flush=True)

    configs = grid(cuda, [t * k for t in tokens], e, choose_config, GroupedConfig)
    deadline1 = t_start + 0.8 * args.budget  # leave room for phase 2
    for n, cfg in enumerate(configs):
        if time.perf_counter() > deadline1:
            print(f"# time budget: {len(configs) - n} grid configs not tried", flush=True)
            break
        run(cfg)

    def total(c):
        return sum(results[c].values()) if len(results[c]) == len(tokens) else float("inf")

    # Phase 2: the other code paths on the two best configs so far.
    top = sorted(results, key=total)[:2]
    variants = [dataclasses.replace(c, split_a=sa, group_scales=gs) for c in top
                for sa, gs in ((False, True), (True, False), (False, False))]
    for n, cfg in enumerate(variants):
        if time.perf_counter() > t_start + args.budget:
            print(f"# time budget: {len(variants) - n} path variants not tried", flush=True)
            break
        if cfg not in results:
            run(cfg)

    print()
    complete = [c for c in results if len(results[c]) == len(tokens)]
    if not complete:
        print("no nvfp4 config ran correctly")
        return 1
    for t in tokens:
        default = choose_config(t * k, e, gpu=cuda)
        d = f"; default {default.label()}: {results[default][t] * 1e3:.3f} ms" if default in results else ""
        best = min(complete, key=lambda c: results[c][t])
        print(f"best T={t}: {best.label()}: {results[best][t] * 1e3:.3f} ms, "
              f"{flops[t] / results[best][t] / 1e12:.2f} TFLOP/s ({dense} moe_grouped m32 {bf16[32, t] * 1e3:.3f} ms, "
              f"x{results[best][t] / bf16[32, t]:.2f}){d}")
    best = min(complete, key=total)
    print(f"best overall (sum over T): {best.label()}: {total(best) * 1e3:.3f} ms  "
          f"config={dataclasses.asdict(best)}")
    print(f"# {len(results)} configs timed in {time.perf_counter() - t_start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
