#!/usr/bin/env python3
"""Benchmark (not a test): the full-size synthetic model, all weights resident on the GPU, bf16.
Decode tok/s at each context and prefill tok/s of a fresh prompt, each with its roofline
(bytes moved / measured HBM bandwidth; FLOPs / measured bf16 matmul rate). Prints a table last, writes JSON.

    python scripts/bench_resident.py --out DIR [--contexts 1024,16384] [--prefill 16384] [--steps 64]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from qwenlocal.engine import Engine
from qwenlocal.engine.roofline import decode_step_cost, prefill_flops


def hbm_bandwidth() -> float:
    """Device-to-device copy of 2 GiB: bytes read + written per second."""
    src = torch.empty(2**30, dtype=torch.uint16, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() * 2 / timed(lambda: dst.copy_(src), repeat=10)


def matmul_rate() -> float:
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    return 2 * 8192**3 / timed(lambda: a @ a, repeat=10)


def timed(fn, repeat: int) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    p.add_argument("--model", default="synthetic:qwen3.6-35b-a3b")
    p.add_argument("--contexts", default="1024,16384")
    p.add_argument("--prefill", type=int, default=16384)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--chunk", type=int, default=2048)
    a = p.parse_args()
    contexts = [int(x) for x in a.contexts.split(",")]
    max_ctx = max(contexts + [a.prefill]) + a.steps + 16
    t0 = time.perf_counter()
    eng = Engine.from_pretrained(a.model, device="cuda", dtype=torch.bfloat16,
                                 options={"max_context": max_ctx, "prefill_chunk": a.chunk})
    load_s = time.perf_counter() - t0
    cfg, runner = eng.config, eng.runner
    bw, rate = hbm_bandwidth(), matmul_rate()
    gen = torch.Generator().manual_seed(0)
    vocab = eng.tokenizer.vocab_size

    def prompt(n: int) -> torch.Tensor:
        return torch.randint(0, vocab, (n,), generator=gen).cuda()

    # Warm-up: JIT/compile of every kernel on both paths.
    warm = runner.new_state()
    runner.prefill(warm, prompt(a.chunk + 7))
    for _ in range(3):
        runner.decode(warm, prompt(1))
    torch.cuda.synchronize()

    rows = []
    state = runner.new_state()
    torch.cuda.synchronize()
    t = time.perf_counter()
    runner.prefill(state, prompt(a.prefill))
    torch.cuda.synchronize()
    prefill_s = time.perf_counter() - t
    flops = prefill_flops(cfg, a.prefill)
    rows.append({"figure": f"prefill {a.prefill} tok", "value": a.prefill / prefill_s, "unit": "tok/s",
                 "seconds": prefill_s, "roofline_s": flops / rate, "roofline": f"{flops / 1e12:.1f} TFLOP / {rate / 1e12:.0f} TFLOP/s"})
    for ctx in contexts:
        state = runner.new_state()
        runner.prefill(state, prompt(ctx))
        tokens = prompt(a.steps)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for i in range(a.steps):
            runner.decode(state, tokens[i:i + 1])
        torch.cuda.synchronize()
        step_s = (time.perf_counter() - t) / a.steps
        cost = decode_step_cost(cfg, ctx + a.steps // 2)
        rows.append({"figure": f"decode @ {ctx}", "value": 1 / step_s, "unit": "tok/s", "seconds": step_s,
                     "roofline_s": cost.total_bytes / bw,
                     "roofline": f"{cost.total_bytes / 1e9:.2f} GB / {bw / 1e12:.2f} TB/s"})
    report = {"model": a.model, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "plan": eng.plan, "load_s": load_s, "hbm_bytes_per_s": bw, "bf16_flops_per_s": rate,
              "vram_allocated": torch.cuda.memory_allocated(), "steps": a.steps, "rows": rows}
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "bench_resident.json").write_text(json.dumps(report, indent=2, default=str))
    print(f"model {a.model}, load {load_s:.1f} s, VRAM {torch.cuda.memory_allocated() / 2**30:.1f} GiB, "
          f"HBM {bw / 1e12:.2f} TB/s, bf16 {rate / 1e12:.0f} TFLOP/s")
    print(f"{'figure':<22} {'measured':>14} {'roofline':>14}  {'of roofline':>11}  basis")
    for r in rows:
        roof = 1 / r["roofline_s"] if r["unit"] == "tok/s" and "decode" in r["figure"] else a.prefill / r["roofline_s"]
        print(f"{r['figure']:<22} {r['value']:>10.1f} tok/s {roof:>10.1f} tok/s  {r['value'] / roof:>10.1%}  {r['roofline']}")


if __name__ == "__main__":
    main()
