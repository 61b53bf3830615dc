#!/usr/bin/env python3
"""What asking L2 for the next layer's projection during this layer's MoE gives (a benchmark, not a test).

The decode step's MoE (expert_gate_up + expert_down_parts over 8 routed experts and the shared one: 14 MB read at
a quarter of HBM speed) is followed by the next layer's GDN in_proj (FP8 qkv + z, 24 MB, HBM-bound). This times,
at the real geometry in a CUDA graph of --layers such layers (each its own expert ids, shared expert and in_proj
weights, so L2 holds nothing from one layer to the next), with programmatic dependent launch as in the step:
  serial        gate_up -> down_parts -> in_proj, one stream (today's step)
  hot           the same with one in_proj for every layer (its weights stay in L2): the ceiling
  ahead/<mode>  the next layer's in_proj asked of L2 (kernels/l2_ahead.py) on a side stream forked as this
                layer's gate_up starts, joined at the graph's end; modes line / evict_last / bulk, and programs
The arms run interleaved for --rounds rounds; each prints us per layer (median of --repeat replays) and its ratio
to serial in that round, then the medians.

    python scripts/bench_l2_ahead.py                # H200: ~1 minute
    python scripts/bench_l2_ahead.py --device cpu   # smoke run (Triton interpreter, tiny shapes, no prefetch)
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

REAL = dict(hidden=2048, inter=512, experts=256, top_k=8, qkv=8192, z=4096)
SMALL = dict(hidden=64, inter=32, experts=32, top_k=3, qkv=48, z=16)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--arms", default="serial,hot,ahead/line/32,ahead/line/132,ahead/evict_last/32,ahead/bulk/16")
    args = ap.parse_args()
    cuda = args.device == "cuda"
    if not cuda:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from bench_gemv_multi import random_part
    from qwenlocal.engine.kernels import gemv_multi as gm
    from qwenlocal.engine.kernels.gemv_multi import gemv_multi
    from qwenlocal.engine.kernels.l2_ahead import l2_ahead
    from qwenlocal.engine.kernels.launch import programmatic_launch
    from qwenlocal.engine.kernels.nvfp4_experts_decode import expert_gate_up
    from qwenlocal.engine.kernels.nvfp4_experts_parts import expert_down_parts
    from qwenlocal.engine.kernels.nvfp4_grouped import random_nvfp4_rows
    from bench_nvfp4_experts_decode import random_linear

    gm.FP8_CVT = True
    geo = REAL if cuda else SMALL
    H, I, E, K = geo["hidden"], geo["inter"], geo["experts"], geo["top_k"]
    L = args.layers if cuda else 2
    dev, dt = torch.device(args.device), torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(0)
    rows = random_nvfp4_rows(E, H, I, dev, gen)
    perm = torch.randperm(E, generator=gen, device=dev)
    layers = []
    for i in range(L):
        ids = perm[(i * K) % (E - K):(i * K) % (E - K) + K].reshape(1, K).contiguous()
        gate, up, down = (random_linear(I, H, dev, gen), random_linear(I, H, dev, gen), random_linear(H, I, dev, gen))
        layers.append(dict(ids=ids, gate_up=gate + up, down=down,
                           weights=torch.softmax(torch.randn(1, K, device=dev, generator=gen), 1).to(dt),
                           scale=torch.rand(1, device=dev, generator=gen),
                           in_proj=[random_part("fp8", geo["qkv"], H, dev), random_part("fp8", geo["z"], H, dev)]))
    x = torch.randn(1, H, device=dev, generator=gen).to(dt)
    in_bytes = sum(p["weight"].numel() for p in layers[0]["in_proj"])

    def layer(i, ip):
        p = layers[i]
        act = expert_gate_up(x, p["ids"], rows, H, I, extra=p["gate_up"])
        expert_down_parts(act, p["weights"], p["ids"], rows, H, I, extra=p["down"], extra_scale=p["scale"])
        gemv_multi(x, ip, out_dtype=dt)

    from qwenlocal.engine.offload.overlap import dedicated_stream
    side = dedicated_stream(dev) if cuda else None  # never a pooled stream: it could alias the capture stream

    def run(arm: str):
        if arm.startswith("ahead/"):
            _, mode, programs = arm.split("/")
            fork = torch.cuda.current_stream() if cuda else None
            for i in range(L):
                nxt = layers[(i + 1) % L]["in_proj"]
                if cuda:
                    side.wait_stream(fork)
                    with torch.cuda.stream(side):
                        l2_ahead([t["weight"] for t in nxt], programs=int(programs), mode=mode)
                layer(i, layers[i]["in_proj"])
            if cuda:
                fork.wait_stream(side)
            return
        for i in range(L):
            layer(i, layers[0 if arm == "hot" else i]["in_proj"])

    arms = args.arms.split(",")
    graphs = {}
    for arm in arms:
        with programmatic_launch(cuda):
            run(arm)  # compile and warm up
            if cuda:
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    run(arm)
                graphs[arm] = g
    if not cuda:
        print("cpu smoke run: every arm ran once in the interpreter (the prefetch is a no-op off CUDA)")
        return 0

    def timed(g) -> float:
        g.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(args.repeat):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            g.replay()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) * 1e3 / L)
        return statistics.median(times)

    print(f"# {torch.cuda.get_device_name()}; {L} layers a graph; in_proj {in_bytes / 1e6:.1f} MB a layer; "
          f"experts {K} + shared; median of {args.repeat} replays, us per layer")
    per_arm = {arm: [] for arm in arms}
    for r in range(args.rounds):
        line = []
        for arm in arms:
            per_arm[arm].append(timed(graphs[arm]))
        base = per_arm["serial"][-1] if "serial" in per_arm else None
        for arm in arms:
            t = per_arm[arm][-1]
            line.append(f"{arm} {t:.2f}" + (f" ({t / base:.3f})" if base else ""))
        print(f"round {r}: " + ", ".join(line), flush=True)
    base = statistics.median(per_arm["serial"]) if "serial" in per_arm else None
    for arm in arms:
        m = statistics.median(per_arm[arm])
        ratios = [t / s for t, s in zip(per_arm[arm], per_arm.get("serial", per_arm[arm]))]
        print(f"{arm:24} {m:8.2f} us/layer   ratio to serial, median of rounds {statistics.median(ratios):.3f}")
    return 0


if __name__ == "__main__":
    t0 = time.perf_counter()
    rc = main()
    print(f"# {time.perf_counter() - t0:.1f} s")
    sys.exit(rc)
