#!/usr/bin/env python3
"""The small fused decode kernels against the torch chains they replace (a benchmark, not a test). Prints a table.

At the real geometry (hidden 2048; 256 experts top-8; attention 16 q heads, 2 kv heads, head_dim 256, rotary 64),
one decode token, bf16 activations, it times each fused kernel (kernels/decode_fused.py) and its torch reference:
  us eager   median over --repeat runs of --inner back-to-back calls (CUDA events), per call: launch-bound
  us graph   the same --inner calls captured in one CUDA graph and replayed (the decode step is captured)
  kernels    GPU kernels one call of the reference launches (torch.profiler); the fused ones launch 1
  max diff   |fused - reference| max over the outputs (a check that the GPU lowering agrees; not asserted)
then each fused kernel under other num_warps, and the saving per decode step (graph times x uses per step:
add_rms_norm 2 per layer + 1, route_topk per layer, attention_prologue and sigmoid_gate_mul per attention layer).

    python scripts/bench_decode_fused.py                      # H200: about 20 s
    python scripts/bench_decode_fused.py --device cpu         # smoke run: tiny sizes, Triton interpreter
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

REAL = dict(hidden=2048, experts=256, top_k=8, heads=16, kv_heads=2, head_dim=256, rotary_dim=64, layers=40,
            attention_layers=10)
SMALL = dict(hidden=67, experts=13, top_k=3, heads=3, kv_heads=1, head_dim=40, rotary_dim=10, layers=4,
             attention_layers=1)
THETA, EPS = 10_000_000.0, 1e-6


def time_us(fn, cuda: bool, repeat: int, inner: int) -> float:
    """Median over `repeat` runs of `inner` calls, per call, in microseconds."""
    fn()
    times = []
    for _ in range(repeat):
        if cuda:
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(inner):
                fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / inner)
        else:
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            times.append((time.perf_counter() - t0) * 1e6 / inner)
    return statistics.median(times)


def graph_us(fn, repeat: int, inner: int) -> float:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream, as torch.cuda.graph asks
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(inner):
            fn()
    return time_us(graph.replay, True, repeat, 1) / inner


def gpu_kernels(fn) -> str:
    try:
        from torch.profiler import ProfilerActivity, profile

        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        return str(sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA))
    except Exception as e:  # the profiler is a nicety: keep the timings
        return f"? ({type(e).__name__})"


def max_diff(a, b) -> float:
    a, b = (a,) if torch.is_tensor(a) else a, (b,) if torch.is_tensor(b) else b
    return max((x.double() - y.double()).abs().max().item() for x, y in zip(a, b))


def problems(geo, dev, dtype):
    """name -> (fused(num_warps) callable, reference callable, default num_warps, warps to sweep, uses per step)."""
    from qwenlocal.engine.kernels.decode_fused import (
        add_rms_norm, add_rms_norm_reference, attention_prologue, attention_prologue_reference, route_topk,
        route_topk_reference, sigmoid_gate_mul, sigmoid_gate_mul_reference)
    from qwenlocal.engine.kernels.decode_norm import default_norm_warps

    gen = torch.Generator(device=dev).manual_seed(0)

    def rand(*shape, scale=1.0, dt=dtype):
        return (torch.randn(*shape, device=dev, generator=gen) * scale).to(dt)

    h, e, k = geo["hidden"], geo["experts"], geo["top_k"]
    nh, kvh, hd, rd = geo["heads"], geo["kv_heads"], geo["head_dim"], geo["rotary_dim"]
    x, delta, w = rand(1, h), rand(1, h), rand(h, scale=0.3)
    logits = rand(e + 1, dt=torch.float32)
    n_q = nh * 2 * hd
    merged = rand(1, n_q + 2 * kvh * hd, scale=2.0)
    q_gate, k_in, v_in = merged[:, :n_q], merged[:, n_q:n_q + kvh * hd], merged[:, n_q + kvh * hd:]
    qw, kw = rand(hd, scale=0.3), rand(hd, scale=0.3)
    position = torch.tensor([100000], device=dev)
    attn_out = rand(1, nh * hd)
    gate = q_gate.view(nh, 2 * hd)[:, hd:]
    layers, attn = geo["layers"], geo["attention_layers"]
    prologue_args = (q_gate, k_in, v_in, qw, kw, position, EPS, nh, kvh, hd, rd, THETA)
    norm_warps = default_norm_warps(1 << (h - 1).bit_length())
    return {
        f"add_rms_norm H={h}": (lambda nw: add_rms_norm(x, delta, w, EPS, num_warps=nw),
                                lambda: add_rms_norm_reference(x, delta, w, EPS), norm_warps, (1, 2, 4, 8, 16),
                                2 * layers + 1),
        f"rms_norm (no delta) H={h}": (lambda nw: add_rms_norm(x, None, w, EPS, num_warps=nw)[1],
                                       lambda: add_rms_norm_reference(x, None, w, EPS)[1], norm_warps, (), 0),
        f"route_topk E={e} k={k}": (lambda nw: route_topk(logits, e, k, dtype, num_warps=nw),
                                    lambda: route_topk_reference(logits, e, k, dtype), 1, (1, 2, 4, 8), layers),
        f"attention_prologue {nh}/{kvh}x{hd} rd {rd}": (
            lambda nw: attention_prologue(*prologue_args, num_warps=nw),
            lambda: attention_prologue_reference(*prologue_args), 2, (1, 2, 4, 8), attn),
        f"sigmoid_gate_mul {nh}x{hd}": (lambda nw: sigmoid_gate_mul(attn_out, gate, num_warps=nw),
                                        lambda: sigmoid_gate_mul_reference(attn_out, gate), 2, (1, 2, 4, 8), attn),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--repeat", type=int, default=None, help="timed runs per row (default 20 on CUDA, 2 on CPU)")
    ap.add_argument("--inner", type=int, default=None, help="calls per timed run (default 200 on CUDA, 2 on CPU)")
    args = ap.parse_args()
    cuda = args.device == "cuda"
    if not cuda:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
    elif not torch.cuda.is_available():
        print("no CUDA device: run with --device cpu for a smoke run", file=sys.stderr)
        return 2
    repeat, inner = args.repeat or (20 if cuda else 2), args.inner or (200 if cuda else 2)
    geo = REAL if cuda else SMALL
    dtype = torch.bfloat16
    dev = torch.device(args.device)
    print(f"# {torch.cuda.get_device_name() if cuda else 'cpu (Triton interpreter, tiny sizes)'}; {dtype}; "
          f"median of {repeat} x {inner} calls; geometry {geo}")
    print(f"{'kernel':<36} {'fused eager':>11} {'ref eager':>10} {'fused graph':>11} {'ref graph':>10} "
          f"{'kernels':>8} {'max diff':>9}")
    saved = 0.0
    table = problems(geo, dev, dtype)
    for name, (fused, ref, warps, _, uses) in table.items():
        def run():
            return fused(warps)
        diff = max_diff(run(), ref())
        fe, re_ = time_us(run, cuda, repeat, inner), time_us(ref, cuda, repeat, inner)
        fg, rg = (graph_us(run, repeat, inner), graph_us(ref, repeat, inner)) if cuda else (float("nan"),) * 2
        kernels = gpu_kernels(ref) if cuda else "-"
        print(f"{name:<36} {fe:>11.2f} {re_:>10.2f} {fg:>11.2f} {rg:>10.2f} {kernels:>8} {diff:>9.2e}", flush=True)
        if cuda:
            saved += uses * (rg - fg)
    print("\n# num_warps sweep (us per call; graph on CUDA, eager on the CPU); * = the default")
    for name, (fused, _, warps, sweep, _) in table.items():
        cells = []
        for nw in sweep:
            def run(nw=nw):
                return fused(nw)
            us = graph_us(run, repeat, inner) if cuda else time_us(run, cuda, 1, 1)
            cells.append(f"{nw}{'*' if nw == warps else ''}: {us:.2f}")
        if cells:
            print(f"{name:<36} " + "  ".join(cells), flush=True)
    if cuda:
        print(f"\n# per decode step ({geo['layers']} layers, {geo['attention_layers']} attention): the fused kernels "
              f"save {saved:.1f} us of graph time against the torch chains")
    return 0


if __name__ == "__main__":
    sys.exit(main())
