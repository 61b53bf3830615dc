#!/usr/bin/env python3
"""Diagnostics (not a benchmark): one eager decode step inside cudaProfilerStart/Stop, for Nsight Compute.

Why: the torch profiler gives each kernel's time, not why it takes it. Under `ncu --profile-from-start off`
only this step's kernels are profiled (the model's build, the prefill and the warm-up steps are not), each
replayed with the caches flushed, as they are in the step (the weights spill L2). scripts/ncu_summary.py
turns ncu's raw CSV into one row a launch shape: time, DRAM bytes and throughput, occupancy, issue activity
and the warp stall reasons. `scripts/gpu_check.sh` runs both with NCU=1.

    ncu --profile-from-start off --clock-control none --section ... python scripts/ncu_decode.py [--context N]
"""
from __future__ import annotations

import argparse

import torch

from profile_decode import add_step_arguments, set_switches  # scripts/ is on the path when this runs as a script
from qwenlocal.engine import Engine


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_step_arguments(p)
    p.add_argument("--decode-kernels", default="fused-pdl")
    p.add_argument("--steps", type=int, default=1, help="eager steps inside the profiled range")
    a = p.parse_args()
    opts = {"max_context": a.context + 64, "decode_kernels": set_switches(a.decode_kernels)}
    if a.routing:
        opts["routing"] = a.routing
    eng = Engine.from_pretrained(a.model, device="cuda", dtype=torch.bfloat16, vram_budget=a.vram_budget,
                                 options=opts)
    runner = eng.runner
    token = torch.tensor([5], device="cuda")
    state = runner.new_state()
    runner.prefill(state, torch.randint(0, 600, (a.context,), device="cuda"))
    runner.use_graph = False  # one kernel a launch, as ncu replays them
    for _ in range(3):
        runner.decode(state, token)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for _ in range(a.steps):
        runner.decode(state, token)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print(f"profiled {a.steps} eager step(s) of {a.model} at context {a.context} ({a.decode_kernels})")


if __name__ == "__main__":
    main()
