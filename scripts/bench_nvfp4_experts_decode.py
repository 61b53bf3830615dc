#!/usr/bin/env python3
"""The batch-1 NVFP4 MoE block (routed top-k + the gated shared expert), old kernels vs new, timed (a
benchmark, not a test). Prints a table.

At the real geometry (hidden 2048, inter 512, 256 expert rows, top-8, bf16 x), synthetic NVFP4 rows and shared
expert (random codes and block scales, engine/kernels/nvfp4_grouped.random_nvfp4_rows), it times:
  old              what the model runs today: nvfp4_moe_decode (two kernels + torch sum), the shared expert as
                   QuantLinear does it (three nvfp4_gemv, SiLU * up, casts), sigmoid(shared gate), mul, add
  new              sigmoid(shared gate) + nvfp4_moe_decode_fused (two launches) at the best configs found
  gate_up <cfg>    expert_gate_up alone (routed + shared gate/up) over a grid of launch configs (persistent
                   programs: block_n x num_warps x one / two waves; then block_n x num_warps x x_split, scales and
                   K steps), defaults first; the other decodes last
  down <cfg>       expert_down alone (routed + shared down, extra_scale) likewise (block_m x num_warps x x_split, ...)
Each row: microseconds per call (CUDA: a CUDA graph of --inner calls, each on its own instance: other expert
ids and another shared expert, so that the 50 MB L2 does not hold the weights between calls; median over
--repeat replays), the weight bytes the call must read, GB/s and % of 4.8 TB/s, and the output's max error
relative to the torch reference (expert_*_reference), once per row.

    python scripts/bench_nvfp4_experts_decode.py               # H200: a few minutes (compiles ~70 configs)
    python scripts/bench_nvfp4_experts_decode.py --device cpu  # smoke run (Triton interpreter, tiny shape)
"""
from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

REAL = dict(hidden=2048, inter=512, experts=256, top_k=8)
SMALL = dict(hidden=64, inter=32, experts=8, top_k=3)
HBM = 4.8e12  # H200 bytes/s


def random_linear(n: int, k: int, dev, gen) -> tuple:
    """An NVFP4 linear [n, k] as QuantLinear holds it: packed, E4M3 scales, fp32 global."""
    packed = torch.randint(0, 256, (n, k // 2), generator=gen, device=dev, dtype=torch.int32).to(torch.uint8)
    scale = (torch.rand(n, k // 16, generator=gen, device=dev) * 1.75 + 0.25).to(torch.float8_e4m3fn)
    return packed, scale, torch.tensor(1 / (3 * k ** 0.5), device=dev)


def graph_timed(calls: list, repeat: int, cuda: bool) -> float:
    """Seconds per call: the calls in one CUDA graph, replayed `repeat` times (median / len(calls)); on the
    CPU, one eager pass per repeat."""
    for fn in calls:  # compile and warm up
        fn()
    if not cuda:
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            for fn in calls:
                fn()
            times.append((time.perf_counter() - t0) / len(calls))
        return statistics.median(times)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for fn in calls:
            fn()
    torch.cuda.current_stream().wait_stream(side)
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


def max_rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).abs().max() / ref.float().abs().max().clamp(min=1e-30)).item()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--small", action="store_true", help=f"tiny geometry {SMALL} (the default on the CPU)")
    ap.add_argument("--inner", type=int, default=None, help="instances (calls) per graph (default 16; CPU 1)")
    ap.add_argument("--repeat", type=int, default=None, help="graph replays per row (default 50; CPU 1)")
    ap.add_argument("--budget", type=float, default=240.0, help="start no grid config after this many seconds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--grids", default="gate_up,down,parts",
                    help="which sweeps to run: gate_up, down (expert_down), parts (expert_down_parts, the sum left "
                         "to the next add_rms_norm: timed with and without that norm)")
    args = ap.parse_args()
    t_start = time.perf_counter()
    cuda = args.device == "cuda"
    if not cuda:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
    elif not torch.cuda.is_available():
        print("no CUDA device: run with --device cpu for a smoke run", file=sys.stderr)
        return 2
    from qwenlocal.engine.kernels.nvfp4_experts_decode import (
        expert_down, expert_down_reference, expert_gate_up, expert_gate_up_reference, nvfp4_moe_decode_fused,
        persistent_programs,
    )
    from qwenlocal.engine.kernels.decode_norm import add_rms_norm
    from qwenlocal.engine.kernels.nvfp4_experts_parts import expert_down_parts, expert_down_parts_reference
    from qwenlocal.engine.kernels.nvfp4_grouped import random_nvfp4_rows
    from qwenlocal.engine.kernels.nvfp4_triton import nvfp4_gemv, nvfp4_moe_decode

    geo = SMALL if (args.small or not cuda) else REAL
    h, i, e, k = geo["hidden"], geo["inter"], geo["experts"], geo["top_k"]
    inner = args.inner or (16 if cuda else 1)
    repeat = args.repeat or (50 if cuda else 1)
    dev, dt = torch.device(args.device), torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    rows = random_nvfp4_rows(e, h, i, dev, gen)
    probs = []
    for _ in range(inner):
        shared = (random_linear(i, h, dev, gen), random_linear(i, h, dev, gen), random_linear(h, i, dev, gen))
        x = torch.randn(1, h, device=dev, generator=gen).to(dt)
        p = dict(x=x, ids=torch.rand(1, e, device=dev, generator=gen).topk(k, dim=1).indices,
                 w=torch.softmax(torch.randn(1, k, device=dev, generator=gen), dim=1).to(dt), shared=shared,
                 gate_w=(torch.randn(1, h, device=dev, generator=gen) / h ** 0.5).to(dt))
        p["scale"] = torch.sigmoid(F.linear(x, p["gate_w"])).float()
        p["act"] = expert_gate_up_reference(x, p["ids"], rows, h, i, shared[0] + shared[1])
        probs.append(p)
    p0 = probs[0]
    ref_out = expert_down_reference(p0["act"], p0["w"], p0["ids"], rows, h, i, p0["shared"][2], p0["scale"],
                                    out_dtype=torch.float32)
    mat = lambda n, kk: n * kk // 2 + n * kk // 16  # noqa: E731 (packed + scale bytes of one matrix)
    gu_bytes = (k + 1) * 2 * mat(i, h)
    dn_bytes = (k + 1) * mat(h, i)
    print(f"# {torch.cuda.get_device_name() if cuda else 'cpu (Triton interpreter)'}; hidden {h}, inter {i}, "
          f"{e} rows, top-{k} + shared, {dt} x; {inner} instances per graph, median of {repeat} "
          f"(setup {time.perf_counter() - t_start:.1f} s)")
    print(f"{'what':<58} {'us':>9} {'MB':>7} {'GB/s':>8} {'% HBM':>6} {'max rel err':>11}")
    sys.stdout.flush()

    def row(what, sec, nbytes, err):
        print(f"{what:<58} {sec * 1e6:>9.2f} {nbytes / 1e6:>7.2f} {nbytes / sec / 1e9:>8.1f} "
              f"{100 * nbytes / sec / HBM:>6.1f} {'-' if err is None else f'{err:.2e}':>11}", flush=True)

    def old(p):
        routed = nvfp4_moe_decode(p["x"], p["w"], p["ids"], rows, h, i)
        x = p["x"]
        g, u = (nvfp4_gemv(x[0], *t).to(dt)[None] for t in p["shared"][:2])
        d = nvfp4_gemv((F.silu(g) * u)[0], *p["shared"][2]).to(dt)[None]
        return routed + torch.sigmoid(F.linear(x, p["gate_w"])) * d

    def new(p, gu_cfg=None, dn_cfg=None):
        scale = torch.sigmoid(F.linear(p["x"], p["gate_w"]))
        return nvfp4_moe_decode_fused(p["x"], p["w"], p["ids"], rows, h, i, p["shared"], scale, gu_cfg, dn_cfg)

    def measure(label, fn, nbytes, ref, **cfg):
        try:
            err = max_rel(fn(p0, **cfg), ref)
            sec = graph_timed([lambda p=p: fn(p, **cfg) for p in probs], repeat, cuda)
        except Exception as exc:  # a config that does not compile (registers, ...): say why
            msg = str(exc).strip().splitlines()
            print(f"skip {label}: {type(exc).__name__}: {msg[0][:120] if msg else ''}", flush=True)
            return None
        row(label, sec, nbytes, err)
        return sec

    measure("old: moe_decode + 3 gemv shared + torch", lambda p: old(p), gu_bytes + dn_bytes, ref_out)
    measure("new, default configs (2 launches + gate)", lambda p: new(p), gu_bytes + dn_bytes, ref_out)

    def gate_up(p, **cfg):
        return expert_gate_up(p["x"], p["ids"], rows, h, i, p["shared"][0] + p["shared"][1], **cfg)

    def down(p, **cfg):
        return expert_down(p["act"], p["w"], p["ids"], rows, h, i, p["shared"][2], p["scale"],
                           out_dtype=torch.float32, **cfg)

    def parts(p, **cfg):
        return expert_down_parts(p["act"], p["w"], p["ids"], rows, h, i, p["shared"][2], p["scale"], **cfg)

    norm_w = torch.zeros(h, device=dev, dtype=dt)
    resid = torch.randn(1, h, device=dev, generator=gen).to(dt)

    def down_norm(p, **cfg):  # what the decode step runs: the down kernel, then the next residual add + norm
        moe = expert_down(p["act"], p["w"], p["ids"], rows, h, i, p["shared"][2], p["scale"], out_dtype=dt, **cfg)
        return add_rms_norm(resid, moe, norm_w, 1e-6)[0]

    def parts_norm(p, **cfg):
        return add_rms_norm(resid, parts(p, **cfg), norm_w, 1e-6)[0]

    ref_parts = expert_down_parts_reference(p0["act"], p0["w"], p0["ids"], rows, h, i, p0["shared"][2], p0["scale"])
    if cuda:
        pa_grid = [dict(block_m=bm, num_warps=nw, programs=waves * persistent_programs(dev, nw))
                   for bm, nw, waves in itertools.product((16, 32, 64), (2, 4), (1, 2))]  # persistent first
        pa_grid += [dict(block_m=bm, num_warps=nw, x_split=xs)
                    for bm, nw, xs in itertools.product((16, 8, 32, 64), (2, 1, 4), (True, False))]
    else:
        pa_grid = [dict(block_m=16), dict(block_m=32, x_split=False), dict(block_m=16, programs=4)]
    if cuda:
        # the default first, then persistent programs (one or two waves; x loaded once a program): the grid's
        # budget may end early
        gu_grid = [dict()]
        gu_grid += [dict(block_n=bn, num_warps=nw, programs=waves * persistent_programs(dev, nw))
                    for bn, nw, waves in itertools.product((2, 4, 8), (4, 2), (1, 2))]
        gu_grid += [dict(block_n=bn, num_warps=nw, x_split=xs)
                    for bn, nw, xs in itertools.product((8, 4, 16, 2), (4, 8, 2), (True, False))]
        gu_grid += [dict(group_scales=True, x_split=xs) for xs in (True, False)]
        gu_grid += [dict(block_g=bg) for bg in (64, 32)]
        dn_grid = [dict(block_m=bm, num_warps=nw, x_split=xs)
                   for bm, nw, xs in itertools.product((8, 4, 16, 32), (2, 4, 1, 8), (False, True))]
        dn_grid += [dict(group_scales=False, num_warps=nw, x_split=xs)
                    for nw, xs in itertools.product((2, 4), (False, True))]
        dn_grid += [dict(block_g=16)]
    else:
        gu_grid = [dict(block_n=8), dict(block_n=16, block_g=2, x_split=False, group_scales=True),
                   dict(block_n=8, programs=3)]
        dn_grid = [dict(block_m=8), dict(block_m=32, x_split=True, group_scales=False)]
    for grid in (gu_grid, dn_grid):  # the other decodes at the defaults ("asm" is the CUDA default)
        grid += [dict(decode="fp16"), dict(decode="exact")] if cuda else [dict(decode="exact")]
    best = {}
    chosen = set(args.grids.split(","))
    for name, fn, grid, nbytes, ref in (("gate_up", gate_up, gu_grid, gu_bytes, p0["act"]),
                                        ("down", down, dn_grid, dn_bytes, ref_out),
                                        ("parts", parts, pa_grid, dn_bytes, ref_parts)):
        if name not in chosen:
            continue
        for n, cfg in enumerate(grid):
            if time.perf_counter() > t_start + args.budget:
                print(f"# time budget: {len(grid) - n} {name} configs not tried", flush=True)
                break
            sec = measure(f"{name} " + " ".join(f"{a}={b}" for a, b in cfg.items()), fn, nbytes, ref, **cfg)
            if sec is not None and "decode" not in cfg and sec < best.get(name, (float("inf"),))[0]:
                best[name] = (sec, cfg)
    print()
    for name in ("gate_up", "down", "parts"):
        if name in best:
            print(f"best {name}: {best[name][1]} {best[name][0] * 1e6:.2f} us")
    if "parts" in best:  # the sum moved into the norm: compare the pair of kernels the step runs
        ref_x = add_rms_norm(resid, ref_out.to(dt), norm_w, 1e-6)[0]
        measure("expert_down (default) + add_rms_norm", down_norm, dn_bytes, ref_x)
        if "down" in best:
            measure("expert_down (best) + add_rms_norm", down_norm, dn_bytes, ref_x, **best["down"][1])
        measure("expert_down_parts (best) + add_rms_norm of the parts", parts_norm, dn_bytes, ref_x,
                **best["parts"][1])
    if "gate_up" in best and "down" in best:
        measure("new, best configs (2 launches + gate)",
                lambda p: new(p, best["gate_up"][1], best["down"][1]), gu_bytes + dn_bytes, ref_out)
    print(f"# {time.perf_counter() - t_start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
