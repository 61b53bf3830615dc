#!/usr/bin/env python3
"""FP8 projections in prefill, W8A16 vs W8A8 (a benchmark, not a test). Prints a table.

The real model's FP8 layers (GatedDeltaNet in_proj_qkv / in_proj_z / out_proj in 30 layers; attention q (with
its gate) / k / v / o in 10), one prefill chunk of --tokens tokens, bf16 activations, random E4M3 weights:
  w8a16   QuantLinear as the engine runs it by default: dequantize the weight (torch ops, three passes), then a
          BF16 matmul
  1-pass  the same with kernels/fp8_triton.fp8_dequant (one Triton pass; not wired into QuantLinear until
          this bench's byte-equality column has been seen True on a GPU)
  w8a8    QuantLinear with fp8_scaled_mm: per-token E4M3 activations, torch._scaled_mm on the tensor cores
  bf16    a plain BF16 matmul on the dequantized weight (the floor W8A16 approaches)
Median of --repeat CUDA-event-timed calls each; the per-chunk sum over all 40 layers, and the saving per prompt
of --prompt tokens. Also the output error of W8A8 against W8A16 on these random inputs.
    python scripts/bench_fp8_prefill.py [--tokens 2048] [--prompt 65536]
"""
from __future__ import annotations

import argparse

import torch

from bench_resident import timed  # scripts/ is on sys.path when this runs as a script
from qwenlocal.engine.kernels.fp8_triton import fp8_dequant
from qwenlocal.engine.quant.formats import quantize_fp8
from qwenlocal.engine.quant.linear import QuantLinear

# (name, out, in, layers): Qwen3.6-35B-A3B's FP8 projections
SHAPES = [("gdn in_proj_qkv", 8192, 2048, 30), ("gdn in_proj_z", 4096, 2048, 30), ("gdn out_proj", 2048, 4096, 30),
          ("attn q_proj+gate", 8192, 2048, 10), ("attn k_proj", 512, 2048, 10), ("attn v_proj", 512, 2048, 10),
          ("attn o_proj", 2048, 4096, 10)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=2048, help="tokens per prefill chunk")
    ap.add_argument("--prompt", type=int, default=65536, help="prompt length for the per-prompt saving")
    ap.add_argument("--repeat", type=int, default=50)
    args = ap.parse_args()
    dev = torch.device("cuda")
    x_all = torch.randn(args.tokens, 4096, device=dev, dtype=torch.bfloat16)
    print(f"{'layer':18} {'w8a16 us':>9} {'w8a8 us':>9} {'bf16 us':>9} {'1-pass us':>9} {'w8a8 vs w8a16 err':>18} "
          f"{'1-pass == w8a16':>15}")
    sums = [0.0, 0.0, 0.0, 0.0]
    for name, n, k, layers in SHAPES:
        w, s = quantize_fp8(torch.randn(n, k, device=dev) / k ** 0.5)
        tensors = {"weight": w, "weight_scale": s}
        a16 = QuantLinear("fp8", tensors, torch.bfloat16, use_kernels=True)
        a8 = QuantLinear("fp8", tensors, torch.bfloat16, use_kernels=True, fp8_scaled_mm=True)
        dense = a16.dequantize()
        x = x_all[:, :k].contiguous()

        def one_pass(x=x, w=w, s=s):
            return torch.nn.functional.linear(x, fp8_dequant(w, s, torch.bfloat16))

        times = [timed(lambda: a16(x), args.repeat), timed(lambda: a8(x), args.repeat),
                 timed(lambda: x @ dense.t(), args.repeat), timed(one_pass, args.repeat)]
        ref = a16(x).float()
        err = ((a8(x).float() - ref).norm() / ref.norm()).item()
        equal = torch.equal(a16(x), one_pass())  # the one-pass dequantization must be byte-equal to the torch one
        print(f"{name:18} {times[0] * 1e6:9.1f} {times[1] * 1e6:9.1f} {times[2] * 1e6:9.1f} {times[3] * 1e6:9.1f} "
              f"{err:18.4f} {str(equal):>15}   (x{layers} layers, rowwise={a8.rowwise})")
        sums = [acc + t * layers for acc, t in zip(sums, times)]
    chunks = -(-args.prompt // args.tokens)
    print(f"{'all 40 layers':18} {sums[0] * 1e3:8.2f}m {sums[1] * 1e3:8.2f}m {sums[2] * 1e3:8.2f}m "
          f"{sums[3] * 1e3:8.2f}m  (ms per chunk)")
    print(f"per {args.prompt:,}-token prompt ({chunks} chunks): w8a16 {sums[0] * chunks:.3f} s, "
          f"w8a8 {sums[1] * chunks:.3f} s, bf16 {sums[2] * chunks:.3f} s, 1-pass w8a16 {sums[3] * chunks:.3f} s")


if __name__ == "__main__":
    main()
