"""W8A16 FP8 GEMV for the batch-1 decode: reads the checkpoint's E4M3 weight bytes and dequantizes on the fly.

Weights [N, K] float8_e4m3fn (passed as their uint8 bits) with one fp32 scale, as ModelOpt stores the
attention and linear-attention projections of nvidia/Qwen3.6-35B-A3B-NVFP4. E4M3 is decoded with integer ops
(engine/kernels/nvfp4_triton.py `_e4m3`), so no FP8 hardware is needed (sm_80+, and Triton's interpreter on
the CPU). Activations in bf16/fp32, accumulation in fp32. Reference: quant.formats.dequant_fp8, then matmul.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .nvfp4_triton import _e4m3, _e4m3_exact, _store_exact, exact_out


@triton.jit
def fp8_gemv_kernel(x_ptr, w_ptr, s_ptr, out_ptr, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = rows < N
    rows64 = rows.to(tl.int64)
    cols = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + cols
        mask_k = ks < K
        x = tl.load(x_ptr + ks, mask=mask_k, other=0.0).to(tl.float32)
        bits = tl.load(w_ptr + rows64[:, None] * K + ks[None, :], mask=mask_n[:, None] & mask_k[None, :],
                       other=0).to(tl.int32)
        acc += tl.sum(_e4m3(bits) * x[None, :], axis=1)
    tl.store(out_ptr + rows, acc * tl.load(s_ptr).to(tl.float32), mask=mask_n)


def fp8_gemv(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [K] -> fp32 [N] = dequant_fp8(weight, scale) @ x."""
    n, k = weight.shape
    out = torch.empty(n, device=x.device, dtype=torch.float32)
    block_n = 16
    fp8_gemv_kernel[(triton.cdiv(n, block_n),)](
        x.contiguous(), weight.contiguous().view(torch.uint8), scale.reshape(1).float(), out, n, k,
        BLOCK_N=block_n, BLOCK_K=min(256, max(32, triton.next_power_of_2(k))))
    return out


@triton.jit
def fp8_dequant_kernel(w_ptr, s_ptr, out_ptr, numel, BLOCK: tl.constexpr, OUT_BF16: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    bits = tl.load(w_ptr + offs, mask=mask, other=0).to(tl.int32)
    value = _e4m3_exact(bits) * tl.load(s_ptr).to(tl.float32)
    _store_exact(out_ptr + offs, value, mask, OUT_BF16)


def fp8_dequant(weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One pass (1 byte read, 2 written per element) for what quant.formats.dequant_fp8 computes in three
    (float32 copy, scale, cast: 19 bytes moved per element), byte-equal to it (tests/test_kernels_dequant.py,
    interpreter and GPU). QuantLinear's W8A16 prefill dequantizes with it on a GPU."""
    w = weight.contiguous().view(torch.uint8)
    out = torch.empty(weight.shape, device=weight.device, dtype=dtype)
    block = 4096
    bf16 = dtype == torch.bfloat16
    fp8_dequant_kernel[(triton.cdiv(w.numel(), block),)](w, scale.reshape(1).float(), exact_out(out), w.numel(),
                                                         BLOCK=block, OUT_BF16=bf16)
    return out
