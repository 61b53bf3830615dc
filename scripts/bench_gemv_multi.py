#!/usr/bin/env python3
"""Batch-1 decode GEMVs: the engine's separate launches vs one gemv_multi launch (a benchmark, not a test).

For each group of linears of one input at the real geometry (hidden 2048, bf16 x; random weights in the
checkpoint's formats) it times
  old     what the decode step launches today: fp8_gemv / nvfp4_gemv (fp32) + .to(bf16) per FP8 / NVFP4 weight
          (engine/quant/linear.py QuantLinear), F.linear per bf16 weight
  new     gemv_multi over the group, choose_config's launch config
  <cfg>   gemv_multi under a small grid around that config (block_n, num_warps x 1/2, 1, 2; warps_k 1 / 2), or
          with --grid persistent: persistent programs (one wave: SMs x programs an SM holds, x 1 / 2) over
          smaller tiles (block_n x 1/4, 1/2, 1; num_warps x 1/2, 1), the rows 0 / 1 / 2 / 4 turns ahead asked of L2
and prints microseconds per call, weight bytes, GB/s and % of 4.8 TB/s, the error of the new output against
gemv_multi_reference (relative to its max), and whether the group's output equals the single-weight gemv calls
byte for byte (same config). On CUDA each time is a CUDA graph of --calls calls (the decode step is replayed
as a graph) cycling over enough weight copies to spill the 50 MB L2 (a layer's weights are not in L2 when it
runs), median of --repeat replays, divided by --calls. The per-step totals multiply by the layers.

    python scripts/bench_gemv_multi.py                    # H200: about a minute, most of it compiling
    python scripts/bench_gemv_multi.py --grid none        # old vs new only
    python scripts/bench_gemv_multi.py --grid persistent  # the persistent kernel's configs (gemv_multi.PERSISTENT)
    python scripts/bench_gemv_multi.py --fp8-cvt          # FP8 through the hardware conversion (gemv_multi.FP8_CVT)
    python scripts/bench_gemv_multi.py --fp8-cvt --grid none --hot   # the weights L2-resident: an upper bound
    TRITON_INTERPRET=1 python scripts/bench_gemv_multi.py --device cpu    # smoke run, tiny shapes (~5 s)
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch
import torch.nn.functional as F

from qwenlocal.engine.kernels.fp8_triton import fp8_gemv
from qwenlocal.engine.kernels import gemv_multi as gm
from qwenlocal.engine.kernels.gemv_multi import choose_config, gemv, gemv_multi, gemv_multi_reference
from qwenlocal.engine.kernels.nvfp4_triton import nvfp4_gemv

PEAK = 4.8e12  # H200 HBM3e, bytes/s
L2_SPILL = 192 * 2**20  # weight copies per group: at least this many bytes in the cycle

# (name, format, [(N, K) per part], layers per decode step)
GROUPS = [("gdn in_proj_qkv+z", "fp8", [(8192, 2048), (4096, 2048)], 30),
          ("attn q+k+v", "fp8", [(8192, 2048), (512, 2048), (512, 2048)], 10),
          ("out_proj / o_proj", "fp8", [(2048, 4096)], 40),
          ("router+shared gate", "dense", [(256, 2048), (1, 2048)], 40),
          ("gdn in_proj_b+a", "dense", [(32, 2048), (32, 2048)], 30),
          ("lm_head", "nvfp4", [(248320, 2048)], 1),
          ("shared gate+up", "nvfp4", [(512, 2048), (512, 2048)], 40),
          ("shared down", "nvfp4", [(2048, 512)], 40)]
SMALL = [("fp8 pair", "fp8", [(12, 64), (5, 64)], 1), ("dense pair", "dense", [(9, 64), (1, 64)], 1),
         ("nvfp4 one", "nvfp4", [(7, 64)], 1)]


def random_part(fmt: str, n: int, k: int, dev) -> object:
    """Weights with random codes (the time does not depend on the values): FP8 E4M3 bytes without the NaN
    pattern, NVFP4 random nibbles with block scales in 2^-3 .. 2^3 (E4M3 bytes 0x20-0x4f)."""
    if fmt == "dense":
        return (torch.randn(n, k, device=dev) / k ** 0.5).to(torch.bfloat16)
    if fmt == "fp8":
        b = torch.randint(0, 256, (n, k), device=dev, dtype=torch.int32).to(torch.uint8)
        b = torch.where((b & 127) == 127, b ^ 1, b)
        return {"weight": b.view(torch.float8_e4m3fn), "weight_scale": torch.tensor(0.01, device=dev)}
    packed = torch.randint(0, 256, (n, k // 2), device=dev, dtype=torch.int32).to(torch.uint8)
    scale = torch.randint(0x20, 0x50, (n, k // 16), device=dev, dtype=torch.int32).to(torch.uint8)
    return {"weight": packed, "weight_scale": scale.view(torch.float8_e4m3fn),
            "weight_scale_2": torch.tensor(1e-3, device=dev)}


def nbytes(parts) -> int:
    return sum(t.numel() * t.element_size() for p in parts for t in (p.values() if isinstance(p, dict) else [p]))


def old_path(x: torch.Tensor, parts):
    """The engine's decode today: one GEMV (+ one cast) per weight."""
    outs = []
    for p in parts:
        if isinstance(p, dict) and "weight_scale_2" in p:
            outs.append(nvfp4_gemv(x[0], p["weight"], p["weight_scale"], p["weight_scale_2"]).to(x.dtype))
        elif isinstance(p, dict):
            outs.append(fp8_gemv(x[0], p["weight"], p["weight_scale"]).to(x.dtype))
        else:
            outs.append(F.linear(x, p))
    return outs


def timed(calls: list, repeat: int, cuda: bool) -> float:
    """Seconds per call of the callables in `calls`, run in turn (one weight copy each)."""
    for fn in calls:  # compile / warm up outside any capture
        fn()
    if not cuda:
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            for fn in calls:
                fn()
            times.append((time.perf_counter() - t0) / len(calls))
        return statistics.median(times)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in calls:
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / len(calls))
    return statistics.median(times)


def config_grid(base) -> list:
    out = [base]
    for bn in (base.block_n // 2, base.block_n, base.block_n * 2):
        for nw in (base.num_warps // 2, base.num_warps, base.num_warps * 2):
            for wk in (1, 2):
                cfg = dataclasses.replace(base, block_n=bn, num_warps=nw, warps_k=wk)
                if 1 <= bn <= 64 and wk <= nw <= 16 and cfg not in out:
                    out.append(cfg)
    return out


def persistent_grid(base, n_total: int, dev) -> list:
    """Persistent configs around base: smaller tiles (more turns a program), one or two waves of programs, the
    L2 prefetch 0 / 1 / 2 / 4 turns ahead. base itself first (one program a tile: the reference time)."""
    out = [base]
    for bn in (max(1, base.block_n // 4), max(1, base.block_n // 2), base.block_n):
        for nw in (max(base.warps_k, base.num_warps // 2), base.num_warps):
            tile = dataclasses.replace(base, block_n=bn, num_warps=nw)
            one_wave = gm.persistent_config(tile, dev)
            for waves in (1, 2):
                for ahead in ((0, 1, 2, 4) if dev.type == "cuda" else (0,)):
                    cfg = dataclasses.replace(one_wave, programs=waves * one_wave.programs, l2_ahead=ahead)
                    if -(-n_total // bn) > cfg.programs and cfg not in out:  # fewer programs than tiles
                        out.append(cfg)
    return out


def kwargs(cfg) -> dict:
    return dict(block_n=cfg.block_n, block_k=cfg.block_k, num_warps=cfg.num_warps, warps_k=cfg.warps_k,
                programs=cfg.programs, l2_ahead=cfg.l2_ahead)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--grid", choices=("none", "small", "persistent"), help="default: small on CUDA, none on the CPU")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--calls", type=int, default=32, help="calls per timed CUDA graph (CPU: one per copy)")
    ap.add_argument("--only", default="", help="substring of the group names to run")
    ap.add_argument("--hot", action="store_true",
                    help="every call over the same weights, so they stay in L2 (what a prefetch of a layer's weights "
                         "into L2 ahead of its GEMV could give at best); default: copies that spill L2")
    ap.add_argument("--fp8-cvt", action="store_true", help="FP8 codes through the hardware conversion (gm.FP8_CVT)")
    args = ap.parse_args()
    gm.FP8_CVT = args.fp8_cvt
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    groups = GROUPS if cuda else SMALL
    repeat = args.repeat if cuda else 1
    print(f"{'group':20} {'fmt':5} {'MB':>7} {'old us':>8} {'new us':>8} {'GB/s':>6} {'%peak':>5} {'best us':>8} "
          f"{'%peak':>5} {'best config':70} {'err':>8} {'split==':>7}")
    totals = {"old": 0.0, "new": 0.0, "best": 0.0}
    for name, fmt, shapes, layers in groups:
        if args.only and args.only not in name:
            continue
        gen_parts = [random_part(fmt, n, k, dev) for n, k in shapes]
        size = nbytes(gen_parts)
        copies = max(1, min(1024, -(-L2_SPILL // size))) if cuda and not args.hot else 1
        banks = [gen_parts] + [[random_part(fmt, n, k, dev) for n, k in shapes] for _ in range(copies - 1)]
        k = shapes[0][1]
        x = torch.randn(1, k, device=dev).to(torch.bfloat16)
        order = [banks[i % copies] for i in range(max(args.calls, copies) if cuda else copies)]
        t_old = timed([lambda b=b: old_path(x, b) for b in order], repeat, cuda)
        n_total = sum(n for n, _ in shapes)
        base = choose_config(fmt, n_total, k)
        grid = args.grid or ("small" if cuda else "none")
        configs = {"small": lambda: config_grid(base), "none": lambda: [base],
                   "persistent": lambda: persistent_grid(base, n_total, dev)}[grid]()
        results = []
        for cfg in configs:
            try:
                t = timed([lambda b=b, c=cfg: gemv_multi(x, b, **kwargs(c)) for b in order], repeat, cuda)
            except Exception as e:  # a config that does not compile (registers, shared memory): skip it
                print(f"    {cfg}: {type(e).__name__}: {str(e)[:80]}")
                continue
            results.append((t, cfg))
        t_new = results[0][0]
        t_best, best = min(results, key=lambda r: r[0])
        ref = gemv_multi_reference(x, gen_parts, torch.float32)
        y = gemv_multi(x, gen_parts, out_dtype=torch.float32)
        err = ((y - ref).abs().max() / ref.abs().max().clamp(min=1e-30)).item()
        split = torch.equal(gemv_multi(x, gen_parts, **kwargs(base)),
                            torch.cat([gemv(x, p, **kwargs(base)) for p in gen_parts], dim=-1))
        # the best config (persistent or not) against one program a tile of its own tile shape: the same bytes
        one_each = dataclasses.replace(best, programs=0, l2_ahead=0)
        split = split and torch.equal(gemv_multi(x, gen_parts, **kwargs(best)),
                                      gemv_multi(x, gen_parts, **kwargs(one_each)))
        moved = size + x.numel() * 2 + sum(n for n, _ in shapes) * 2
        print(f"{name:20} {fmt:5} {size / 2**20:7.2f} {t_old * 1e6:8.1f} {t_new * 1e6:8.1f} {moved / t_new / 1e9:6.0f} "
              f"{100 * moved / t_new / PEAK:5.1f} {t_best * 1e6:8.1f} {100 * moved / t_best / PEAK:5.1f} "
              f"{str(kwargs(best)):70} {err:8.1e} {str(split):>7}   (x{layers}, {len(shapes)} -> 1 launch)")
        for key, t in (("old", t_old), ("new", t_new), ("best", t_best)):
            totals[key] += t * layers
    print("per decode step, these linears: " + ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in totals.items()))


if __name__ == "__main__":
    main()
