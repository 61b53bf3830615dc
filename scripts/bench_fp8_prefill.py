#!/usr/bin/env python3
"""Quantized dense linears in prefill: FP8 W8A16 vs W8A8, NVFP4 W4A16 (a benchmark, not a test). Prints a table.

The real model's FP8 layers (GatedDeltaNet in_proj_qkv / in_proj_z / out_proj in 30 layers; attention q (with
its gate) / k / v / o in 10) and NVFP4 shared expert (gate / up / down in 40), one prefill chunk of --tokens
tokens, bf16 activations, random weights:
  engine  QuantLinear as the engine runs it: dequantize the weight with torch ops, then a BF16 matmul
  w8a8    FP8 only: QuantLinear with fp8_scaled_mm (per-token E4M3 activations, torch._scaled_mm)
  bf16    a plain BF16 matmul on the dequantized weight (the floor a dequantizing path approaches)
  1-pass  the engine's path with the one-pass Triton dequantization (kernels/fp8_triton.fp8_dequant,
          kernels/nvfp4_triton.nvfp4_dequant); QuantLinear takes it once its byte-equality column (against
          the engine's path) has been seen True on a GPU
Median of --repeat CUDA-event-timed calls each; the per-chunk sum over all layers, and the time per prompt
of --prompt tokens. Also the output error of W8A8 against W8A16 on these random inputs.
    python scripts/bench_fp8_prefill.py [--tokens 2048] [--prompt 65536]
    TRITON_INTERPRET=1 python scripts/bench_fp8_prefill.py --device cpu --tokens 8 --repeat 1   # smoke run
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from bench_nvfp4_grouped import timed as timed_with_result  # scripts/ is on sys.path when run as a script
from qwenlocal.engine.kernels.fp8_triton import fp8_dequant
from qwenlocal.engine.kernels.nvfp4_triton import nvfp4_dequant
from qwenlocal.engine.quant.formats import quantize_fp8, quantize_nvfp4
from qwenlocal.engine.quant.linear import QuantLinear

# (name, format, out, in, layers): Qwen3.6-35B-A3B's quantized dense projections (lm_head: last token only)
SHAPES = [("gdn in_proj_qkv", "fp8", 8192, 2048, 30), ("gdn in_proj_z", "fp8", 4096, 2048, 30),
          ("gdn out_proj", "fp8", 2048, 4096, 30), ("attn q_proj+gate", "fp8", 8192, 2048, 10),
          ("attn k_proj", "fp8", 512, 2048, 10), ("attn v_proj", "fp8", 512, 2048, 10),
          ("attn o_proj", "fp8", 2048, 4096, 10), ("shared gate_proj", "nvfp4", 512, 2048, 40),
          ("shared up_proj", "nvfp4", 512, 2048, 40), ("shared down_proj", "nvfp4", 2048, 512, 40)]
COLUMNS = ("engine", "w8a8", "bf16", "1-pass")


def quantized(fmt: str, n: int, k: int, dev) -> dict[str, torch.Tensor]:
    w = torch.randn(n, k, device=dev) / k ** 0.5
    if fmt == "fp8":
        q, s = quantize_fp8(w)
        return {"weight": q, "weight_scale": s}
    p, s, s2 = quantize_nvfp4(w)
    return {"weight": p, "weight_scale": s, "weight_scale_2": s2}


def one_pass(fmt: str, t: dict[str, torch.Tensor]) -> torch.Tensor:
    if fmt == "fp8":
        return fp8_dequant(t["weight"], t["weight_scale"], torch.bfloat16)
    return nvfp4_dequant(t["weight"], t["weight_scale"], t["weight_scale_2"], torch.bfloat16)


def timed(fn, repeat: int, cuda: bool) -> float:
    return timed_with_result(fn, repeat, cuda)[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=2048, help="tokens per prefill chunk")
    ap.add_argument("--prompt", type=int, default=65536, help="prompt length for the per-prompt time")
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = ap.parse_args()
    dev = torch.device(args.device)
    x_all = torch.randn(args.tokens, 4096, device=dev, dtype=torch.bfloat16)
    print(f"{'layer':18} {'fmt':5} " + " ".join(f"{c + ' us':>9}" for c in COLUMNS)
          + f" {'w8a8 err':>9} {'1-pass == engine':>16}")
    sums = {fmt: dict.fromkeys(COLUMNS, 0.0) for fmt in ("fp8", "nvfp4")}
    for name, fmt, n, k, layers in SHAPES:
        t = quantized(fmt, n, k, dev)
        engine = QuantLinear(fmt, t, torch.bfloat16, use_kernels=True)
        w8a8 = QuantLinear(fmt, t, torch.bfloat16, use_kernels=True, fp8_scaled_mm=True) if fmt == "fp8" else None
        dense = engine.dequantize()
        x = x_all[:, :k].contiguous()

        def fast(x=x, t=t, fmt=fmt):
            return F.linear(x, one_pass(fmt, t))

        calls = {"engine": lambda: engine(x), "w8a8": (lambda: w8a8(x)) if w8a8 else None,
                 "bf16": lambda: x @ dense.t(), "1-pass": fast}
        times = {c: timed(f, args.repeat, dev.type == "cuda") if f else None for c, f in calls.items()}
        ref = engine(x).float()
        err = f"{((w8a8(x).float() - ref).norm() / ref.norm()).item():.4f}" if w8a8 else "-"
        equal = torch.equal(engine(x), fast())
        print(f"{name:18} {fmt:5} " + " ".join(f"{times[c] * 1e6:9.1f}" if times[c] else f"{'-':>9}" for c in COLUMNS)
              + f" {err:>9} {str(equal):>16}   (x{layers} layers)")
        for c in COLUMNS:
            sums[fmt][c] += (times[c] or 0.0) * layers
    chunks = -(-args.prompt // args.tokens)
    for fmt, row in sums.items():
        print(f"all {fmt} layers, per chunk: " + ", ".join(f"{c} {v * 1e3:.2f} ms" for c, v in row.items() if v)
              + f"; per {args.prompt:,}-token prompt ({chunks} chunks): "
              + ", ".join(f"{c} {v * chunks:.3f} s" for c, v in row.items() if v))


if __name__ == "__main__":
    main()
