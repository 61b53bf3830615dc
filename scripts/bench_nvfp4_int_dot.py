#!/usr/bin/env python3
"""The NVFP4 LM head alone: gemv_multi (the default) against nvfp4_int_dot.gemv_int (x quantized to int16
blocks by its own launch, then the integer-dot GEMV) over gemv_int's launch configs, gemv_multi at the
integer kernel's shapes (4/1, 2/1: how much of a gain is the shape), and nvfp4_mma.gemv_mma (the integer tensor
cores: with its x quantization, and alone on an x quantized beforehand), at the real geometry
(248,320 x 2,048, 286 MB: it spills L2, so each call reads HBM). A CUDA graph of `--inner` calls, the median of
`--repeat` replays, in interleaved rounds; prints us a call, GB/s, the ratio to the default per round, and each
arm's logits against the default's. On the CPU (Triton's interpreter) a small geometry, to check that it runs.

    python scripts/bench_nvfp4_int_dot.py [--rounds 3] [--configs 4/1,4/2,2/1,8/4,16/4] [--rows N]
"""
from __future__ import annotations

import argparse
import statistics

import torch

from bench_nvfp4_experts_decode import graph_timed, random_linear  # scripts/ is on the path as a script
from qwenlocal.engine.kernels.gemv_multi import gemv
from qwenlocal.engine.kernels.nvfp4_int_dot import gemv_int, quantize_x16, tables
from qwenlocal.engine.kernels.nvfp4_hilo import quantize_hilo
from qwenlocal.engine.kernels.nvfp4_mma import gemv_mma, zeros


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--inner", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--configs", default="4/1,4/2,2/1,8/4,16/4", help="block_n/num_warps of gemv_int")
    ap.add_argument("--rows", type=int, default=0, help="N other than the LM head's (e.g. 9216: the experts' "
                                                        "gate/up rows of a layer, 10.6 MB)")
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    n, k = (248_320, 2048) if cuda else (200, 512)
    n = args.rows or n
    gen = torch.Generator(device=dev).manual_seed(0)
    w = dict(zip(("weight", "weight_scale", "weight_scale_2"), random_linear(n, k, dev, gen)))
    x = torch.randn(1, k, generator=gen, device=dev).to(torch.bfloat16)
    tables(dev), zeros(dev)  # made before any capture
    xq = quantize_hilo(x.reshape(-1))
    nbytes = n * k // 2 + n * k // 16
    arms = {"gemv_multi": lambda: gemv(x, w, out_dtype=torch.float32),
            "quantize_x16 alone": lambda: quantize_x16(x.reshape(-1))}
    for bn, nw in ((4, 1), (2, 1)):  # the integer kernel's launch shapes in the float kernel: the shape's share
        arms[f"gemv_multi {bn}/{nw}"] = lambda bn=bn, nw=nw: gemv(x, w, out_dtype=torch.float32, block_n=bn,
                                                                 num_warps=nw)
    for cfg in args.configs.split(","):
        bn, nw = (int(v) for v in cfg.split("/"))
        arms[f"int {bn}/{nw}"] = lambda bn=bn, nw=nw: gemv_int(
            w["weight"], w["weight_scale"].view(torch.uint8), w["weight_scale_2"], x.reshape(-1), torch.float32,
            block_n=bn, num_warps=nw)
    mma = (w["weight"], w["weight_scale"].view(torch.uint8), w["weight_scale_2"])
    arms["mma"] = lambda: gemv_mma(*mma, x.reshape(-1), pairs=False)
    arms["mma alone"] = lambda: gemv_mma(*mma, x.reshape(-1), xq=xq, pairs=False)
    arms["mma pairs alone"] = lambda: gemv_mma(*mma, x.reshape(-1), xq=xq, pairs=True)  # nvfp4_mma.PAIRS
    for warps in (2, 4):  # each warp a part of K: more warps, a shorter chain of steps each
        arms[f"mma {warps}w alone"] = lambda warps=warps: gemv_mma(*mma, x.reshape(-1), xq=xq, pairs=False,
                                                                   warps=warps)
        arms[f"mma {warps}w pairs alone"] = lambda warps=warps: gemv_mma(*mma, x.reshape(-1), xq=xq, pairs=True,
                                                                         warps=warps)
    arms["quantize_hilo alone"] = lambda: quantize_hilo(x.reshape(-1), xq)
    ref = arms["gemv_multi"]().float().reshape(-1)
    for name, fn in arms.items():
        if name.startswith("int") or name.startswith("gemv_multi ") or name.startswith("mma "):
            err = float((fn().float() - ref).abs().max() / ref.abs().max())
            print(f"{name:<18} max |diff| / max |logit| = {err:.2e}", flush=True)
    rounds_table({name: [fn] * args.inner for name, fn in arms.items()}, args.rounds, args.repeat, cuda, nbytes)


def rounds_table(arms: dict, rounds: int, repeat: int, cuda: bool, nbytes: int) -> None:
    """Each arm's calls (a list: one CUDA graph of them) timed in `rounds` interleaved rounds; prints us a call
    (median), GB/s of nbytes and the per-round ratio to the first arm."""
    times = {name: [] for name in arms}
    for _ in range(rounds):
        for name, calls in arms.items():
            times[name].append(1e6 * graph_timed(calls, repeat, cuda))
    first = next(iter(arms))
    print(f"\n{'arm':<20} {'us (median)':>11} {'GB/s':>7}  ratio to {first} per round ({nbytes / 1e6:.2f} MB)")
    for name, us in times.items():
        med = statistics.median(us)
        ratios = " ".join(f"{a / b:.3f}" for a, b in zip(us, times[first]))
        print(f"{name:<20} {med:>11.2f} {nbytes / med / 1e3:>7.0f}  {ratios}")


if __name__ == "__main__":
    main()
