#!/usr/bin/env python3
"""Diagnostics (not a benchmark): where one decode step of the full-size synthetic model spends GPU time.
Eager (no graph) so the profiler sees each kernel; prints the top kernels by CUDA time."""
from __future__ import annotations

import sys

import torch
from torch.profiler import ProfilerActivity, profile

from qwenlocal.engine import Engine


def main() -> None:
    ctx = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
    eng = Engine.from_pretrained("synthetic:qwen3.6-35b-a3b", device="cuda", dtype=torch.bfloat16,
                                 options={"max_context": ctx + 64, "cuda_graphs": False})
    runner = eng.runner
    state = runner.new_state()
    runner.prefill(state, torch.randint(0, 600, (ctx,), device="cuda"))
    tok = torch.tensor([5], device="cuda")
    for _ in range(3):
        runner.decode(state, tok)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            runner.decode(state, tok)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=60))


if __name__ == "__main__":
    main()
