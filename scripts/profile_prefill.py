#!/usr/bin/env python3
"""Diagnostics (not a benchmark): does the layer-major prefill's bank copy run beside the compute?

Measured at 16K (docs/RESULTS.md): TTFT 2.16 s ~ bank copy 1.18 s + resident compute 1.07 s, i.e. the sum, not
the max. This profiles one offloaded prefill (full-size synthetic model, 16 GiB budget) and prints, from the
CUDA trace: the prefill's wall time; the time H2D copies were active, compute kernels were active, and both at
once (the overlap); the host-side synchronizations (cudaDeviceSynchronize / cudaStreamSynchronize /
cudaEventSynchronize / cudaMemcpy, count and total time) that could serialize the copy stream with compute;
and the top kernels.
    python scripts/profile_prefill.py [TOKENS] [--mode layer-major|chunked] [--shapes] [--option KEY=VALUE ...]
(--option: any engine option, e.g. prefill_kernels=fused or prefill_chunk=4096, for an A/B of two runs.)
"""
from __future__ import annotations

import argparse
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from qwenlocal.engine import Engine

SYNC_NAMES = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy ",
              "cudaMemcpyAsync", "cudaStreamWaitEvent", "cudaHostAlloc", "cudaMalloc", "cudaFree")


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def total(intervals) -> float:
    return sum(b - a for a, b in intervals)


def intersect(x, y) -> float:
    i = j = 0
    acc = 0.0
    while i < len(x) and j < len(y):
        a, b = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        acc += max(0.0, b - a)
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return acc


def sync_sites(run) -> Counter:
    """Run once with torch's sync debug mode on; count each synchronizing op by its Python call site."""
    sites: Counter = Counter()

    def show(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" not in str(message):
            return
        frames = [f for f in traceback.extract_stack()[:-1]
                  if any(p in f.filename for p in ("qwenlocal", "/fla/", "flashinfer"))]
        sites[" <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in frames[-3:][::-1])
              or f"{filename}:{lineno}"] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        torch.cuda.set_sync_debug_mode("warn")
        try:
            run()
            torch.cuda.synchronize()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sites


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("tokens", nargs="?", type=int, default=16384)
    ap.add_argument("--mode", default="layer-major", choices=("layer-major", "chunked"))
    ap.add_argument("--model", default="synthetic:qwen3.6-35b-a3b")
    ap.add_argument("--shapes", action="store_true",
                    help="record input shapes: the copies and matmuls grouped by shape (where the copies come from)")
    ap.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                    help="an engine option (repeatable), e.g. prefill_kernels=fused")
    args = ap.parse_args()
    extra = {}
    for item in args.option:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--option takes KEY=VALUE, got {item!r}")
        extra[key] = int(value) if value.isdigit() else value
    eng = Engine.from_pretrained(args.model, device="cuda", dtype=torch.bfloat16, vram_budget="16GiB",
                                 options={"prefill_mode": args.mode, "routing": {"preset": "calibrated-28"},
                                          **extra})
    print("options:", {k: eng.plan[k]["value"] for k in ("prefill_chunk", "prefill_kernels", "prefill_mode")})
    runner = eng.runner
    ids = torch.randint(0, 600, (args.tokens,), device="cuda")
    held = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    runner.prefill(runner.new_state(), ids)  # warm-up: JIT, allocator, graphs
    torch.cuda.synchronize()
    # The plan reserves engine/memory.py workspace_bytes(chunk) for this: the measured figures to set it by.
    print(f"prefill memory: transient peak {(torch.cuda.max_memory_allocated() - held) / 2**20:,.0f} MiB above "
          f"the {held / 2**30:.2f} GiB held; allocator reserved peak {torch.cuda.max_memory_reserved() / 2**30:.2f} GiB")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=args.shapes) as prof:
        t0 = time.perf_counter()
        runner.prefill(runner.new_state(), ids)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    copies, kernels = [], []
    for ev in prof.events():
        if ev.device_type.name != "CUDA":
            continue
        span = (ev.time_range.start / 1e6, ev.time_range.end / 1e6)  # us -> s
        (copies if "Memcpy HtoD" in ev.name or "Memcpy H2D" in ev.name else kernels).append(span)
    cu, ku = union(copies), union(kernels)
    both = intersect(cu, ku)
    print(f"{args.mode} prefill of {args.tokens:,} tokens: wall {wall:.3f} s (profiled)")
    print(f"H2D copies active {total(cu):.3f} s, compute active {total(ku):.3f} s, both at once {both:.3f} s "
          f"({both / max(1e-9, min(total(cu), total(ku))):.0%} of the shorter)")
    # The GPU waits on the host wherever no kernel runs: the wall less the kernels' union is that idle time.
    print(f"GPU idle (no kernel running) {wall - total(ku):.3f} s of the {wall:.3f} s wall")
    print("host-side calls that can wait for the GPU:")
    for row in prof.key_averages():
        if row.key.startswith(SYNC_NAMES) or row.key.strip() in (s.strip() for s in SYNC_NAMES):
            print(f"  {row.key:32} x{row.count:6}  {row.cpu_time_total / 1e3:9.1f} ms")
    print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=25, max_name_column_width=60))
    if args.shapes:  # which tensors the copies and matmuls move: the shapes name their call sites
        for name in ("aten::copy_", "aten::mm", "aten::cat"):
            rows = sorted((r for r in prof.key_averages(group_by_input_shape=True) if r.key == name),
                          key=lambda r: -r.self_device_time_total)[:8]
            for r in rows:
                print(f"  {name:12} x{r.count:5} {r.self_device_time_total / 1e3:9.1f} ms  {str(r.input_shapes)[:110]}")
    sites = sync_sites(lambda: runner.prefill(runner.new_state(), ids))
    print(f"synchronizing ops in one prefill: {sum(sites.values())}")
    for site, n in sites.most_common(15):
        print(f"  x{n:6}  {site}")
    print(eng.stats().get("prefill_stream_copies"), "stream copies;", eng.stats().get("prefill_stream_bytes"), "bytes")


if __name__ == "__main__":
    main()
