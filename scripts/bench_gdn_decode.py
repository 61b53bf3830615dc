#!/usr/bin/env python3
"""The fused GatedDeltaNet decode step against the engine's current decode path (a benchmark, not a test).

At the real geometry (Hk 16, Hv 32, K = V = 128, conv kernel 4, bf16), one token from the in-projection outputs
(random, as views of one merged buffer) to the gated-RMSNorm output, states updated in place. Rows:
  current         gdn_decode_step_reference with fla's fused_recurrent_gated_delta_rule as the core (the
                  engine's GPU decode path: torch conv1d, gates, fla, rms_norm_gated), or with the torch
                  recurrent rule when fla is not importable
  fused <config>  kernels/gdn_decode.gdn_decode_step: the default config first, then a sweep of the two
                  launch plans' parameters (block_v x num_warps; one launch x num_warps)
Columns: eager = median of --repeat CUDA-event-timed calls; graph = one step captured in a CUDA graph, replayed
--repeat times back to back, per replay (the decode runs captured); % BW = the state bytes (fp32 [Hv, K, V]
read + written, 2 x 2 MB) over that graph time at 4.8 TB/s; err = max |out - torch reference| relative to its
max, after one step from the same states (for the current path: fla's against the torch rule); replay==eager:
the graph replay's out and states byte-equal to an eager call's from the same inputs (the engine's promise).
The best fused time and the current one, x30 GatedDeltaNet layers per token, come last.

    python scripts/bench_gdn_decode.py                                   # H200
    TRITON_INTERPRET=1 python scripts/bench_gdn_decode.py --device cpu   # smoke run: tiny sizes, interpreter
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from qwenlocal.engine.kernels.gdn_decode import default_config, gdn_decode_step, gdn_decode_step_reference
from qwenlocal.engine.kernels.gdn_torch import gdn_core_torch

REAL = dict(hk=16, hv=32, kd=128, vd=128, width=4)
TINY = dict(hk=2, hv=4, kd=16, vd=24, width=4)
HBM = 4.8e12
LAYERS = 30


def make_case(hk, hv, kd, vd, width, dev, dtype=torch.bfloat16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    conv_dim = 2 * hk * kd + hv * vd
    merged = torch.randn(conv_dim + hv * vd + 2 * hv, generator=gen).to(dtype).to(dev)  # the merged GEMV output
    inputs = dict(mixed_qkv=merged[:conv_dim], z=merged[conv_dim:conv_dim + hv * vd],
                  b=merged[conv_dim + hv * vd:conv_dim + hv * vd + hv], a=merged[conv_dim + hv * vd + hv:])
    layer = dict(conv_state=torch.randn(conv_dim, width - 1, generator=gen).to(dtype),
                 conv_w=(torch.randn(conv_dim, width, generator=gen) * 0.5).to(dtype),
                 neg_a=-torch.empty(hv).uniform_(-2, 1, generator=gen).exp(), dt_bias=torch.randn(hv, generator=gen),
                 state=torch.randn(hv, kd, vd, generator=gen) * 0.3, norm_w=torch.ones(vd).to(dtype))
    return inputs, {n: t.to(dev) for n, t in layer.items()}


def caller(fn, inputs, layer, geo, out, **kw):
    args = (inputs["mixed_qkv"], inputs["z"], inputs["b"], inputs["a"], layer["conv_state"], layer["conv_w"],
            layer["neg_a"], layer["dt_bias"], layer["state"], layer["norm_w"], 1e-6,
            geo["hk"], geo["hv"], geo["kd"], geo["vd"])
    return lambda: fn(*args, out=out, **kw)


def eager_time(fn, repeat: int, cuda: bool) -> float:
    fn()
    times = []
    for _ in range(repeat):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def graph_time(fn, repeat: int) -> tuple[float | None, torch.cuda.CUDAGraph | None, str]:
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()  # warm-up (compiles) off the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
    except Exception as e:  # a path that cannot be captured
        return None, None, f"{type(e).__name__}: {str(e)[:60]}"
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    runs = []
    for _ in range(5):
        start.record()
        for _ in range(repeat):
            graph.replay()
        end.record()
        end.synchronize()
        runs.append(start.elapsed_time(end) / 1e3 / repeat)
    return statistics.median(runs), graph, ""


def check(step, kw, geo, dev, cuda: bool) -> tuple[float, bool | None]:
    """(max relative error of step(**kw) against the torch reference after one step from the same states,
    and whether its graph replay is byte-equal to an eager call: None without CUDA or a graph)."""
    inputs, layer = make_case(**geo, dev=dev, seed=1)
    ref_layer = {n: t.clone() for n, t in layer.items()}
    out = caller(step, inputs, layer, geo, None, **kw)()
    ref = caller(gdn_decode_step_reference, inputs, ref_layer, geo, None)()
    err = ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
    if not cuda:
        return err, None
    inputs, eager_layer = make_case(**geo, dev=dev, seed=2)
    graph_layer = {n: t.clone() for n, t in eager_layer.items()}
    eager_out = caller(step, inputs, eager_layer, geo, None, **kw)()
    graph_out = torch.empty_like(eager_out)
    fn = caller(step, inputs, graph_layer, geo, graph_out, **kw)
    saved = {n: t.clone() for n, t in graph_layer.items()}
    _, graph, _ = graph_time(fn, 1)  # captures (and runs) it: restore the states, then one replay
    if graph is None:
        return err, None
    for n, t in graph_layer.items():
        t.copy_(saved[n])
    graph.replay()
    torch.cuda.synchronize()
    same = torch.equal(eager_out, graph_out) and all(
        torch.equal(eager_layer[n], graph_layer[n]) for n in ("state", "conv_state"))
    return err, same


def label(cfg: dict) -> str:
    if cfg["one_launch"]:
        return f"1 launch, warps {cfg['num_warps']}"
    return f"2 launches, block_v {cfg['block_v']}, warps {cfg['num_warps']}/{cfg['norm_warps']}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--repeat", type=int, default=200)
    args = ap.parse_args()
    dev, cuda = torch.device(args.device), args.device == "cuda"
    geo = REAL if cuda else TINY
    repeat = args.repeat if cuda else 1
    state_bytes = 2 * geo["hv"] * geo["kd"] * geo["vd"] * 4

    core, core_name = gdn_core_torch, "torch recurrent"
    if cuda:
        from qwenlocal.engine.kernels.gdn_fla import fla_available, gdn_core_fla
        if fla_available():
            core, core_name = gdn_core_fla, "fla fused_recurrent"
    default = default_config(geo["hk"], geo["hv"], geo["kd"], geo["vd"])
    configs = [dict(default)]
    for bv in (16, 32, 64):
        for nw in (2, 4, 8):
            configs.append(dict(one_launch=False, block_v=bv, num_warps=nw, norm_warps=default["norm_warps"]))
    configs += [dict(one_launch=True, num_warps=nw) for nw in (4, 8, 16)]
    if not cuda:  # the interpreter ignores warps: one of each plan
        configs = [configs[0], configs[-1]]

    print(f"geometry {geo}, state {state_bytes / 1e6:.1f} MB read+written, device {dev}")
    print(f"{'path':44} {'eager us':>9} {'graph us':>9} {'% BW':>6} {'err':>9} {'replay==eager':>13}")
    rows = [(f"current: torch conv + {core_name} + norm", gdn_decode_step_reference, dict(core=core))]
    rows += [(("fused default " if i == 0 else "fused ") + label(c), gdn_decode_step, c) for i, c in enumerate(configs)]
    best = current = None
    for name, step, kw in rows:
        inputs, layer = make_case(**geo, dev=dev)
        out = torch.empty(geo["hv"] * geo["vd"], device=dev, dtype=torch.bfloat16)
        fn = caller(step, inputs, layer, geo, out, **kw)
        try:
            eager = eager_time(fn, repeat, cuda)
        except Exception as e:  # a config that does not compile or launch
            print(f"{name:44} failed: {type(e).__name__}: {str(e)[:80]}")
            continue
        graph, why = (graph_time(fn, repeat)[0::2] if cuda else (None, ""))
        bw = f"{state_bytes / HBM / graph * 100:6.1f}" if graph else f"{'-':>6}"
        err, same = check(step, kw, geo, dev, cuda)
        print(f"{name:44} {eager * 1e6:9.1f} " + (f"{graph * 1e6:9.2f}" if graph else f"{'-':>9}") + f" {bw} "
              f"{err:9.2e} {str(same) if same is not None else '-':>13}" + (f"  (no graph: {why})" if why else ""))
        t = graph or eager
        if step is gdn_decode_step_reference:
            current = t
        elif best is None or t < best[0]:
            best = (t, name)
    if best and current:
        print(f"best: {best[1]}: {best[0] * 1e6:.2f} us, x{LAYERS} layers {best[0] * LAYERS * 1e6:.0f} us/token "
              f"(current {current * LAYERS * 1e6:.0f} us/token)")


if __name__ == "__main__":
    main()
