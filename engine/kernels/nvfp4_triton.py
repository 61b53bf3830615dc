"""W4A16 NVFP4 GEMV for the batch-1 decode: dequantizes on the fly from the checkpoint's native bytes.

Weights [N, K] as ModelOpt stores them: packed [N, K/2] uint8 (element 2j in the low nibble), block scales
[N, K/16] E4M3 (passed as their uint8 bits), one fp32 global scale. Activations in bf16/fp32, accumulation in
fp32. Reference: quant.formats.dequant_nvfp4, then a plain matmul. E4M3 and E2M1 are decoded with integer ops,
so the kernel needs no FP8 support from the GPU (sm_80+) and runs in Triton's interpreter on the CPU.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _e2m1(code):
    # bits: s e e m; |v| = 0.5 * m if e == 0 else 2^(e-1) * (1 + m / 2)
    e = (code >> 1) & 3
    m = (code & 1).to(tl.float32)
    mag = tl.where(e == 0, 0.5 * m, tl.exp2((e - 1).to(tl.float32)) * (1.0 + 0.5 * m))
    return tl.where((code & 8) != 0, -mag, mag)


@triton.jit
def _e4m3(bits):
    # bits: s eeee mmm, bias 7; subnormals at e == 0 (the NaN pattern never appears in block scales)
    e = ((bits >> 3) & 15).to(tl.int32)
    m = (bits & 7).to(tl.float32)
    normal = tl.exp2((e - 7).to(tl.float32)) * (1.0 + m / 8.0)
    sub = m / 8.0 * 0.015625  # 2^-6
    mag = tl.where(e == 0, sub, normal)
    return tl.where((bits & 128) != 0, -mag, mag)


@triton.jit
def nvfp4_gemv_kernel(x_ptr, w_ptr, s_ptr, g_ptr, out_ptr, N, K,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = rows < N
    rows64 = rows.to(tl.int64)
    half = tl.arange(0, BLOCK_K // 2)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        byte = k0 // 2 + half
        mask_b = byte < K // 2
        packed = tl.load(w_ptr + rows64[:, None] * (K // 2) + byte[None, :],
                         mask=mask_n[:, None] & mask_b[None, :], other=0).to(tl.int32)
        scale_idx = (k0 + 2 * half) // 16
        sbits = tl.load(s_ptr + rows64[:, None] * (K // 16) + scale_idx[None, :],
                        mask=mask_n[:, None] & mask_b[None, :], other=0).to(tl.int32)
        scale = _e4m3(sbits)
        x_even = tl.load(x_ptr + k0 + 2 * half, mask=mask_b, other=0.0).to(tl.float32)
        x_odd = tl.load(x_ptr + k0 + 2 * half + 1, mask=mask_b, other=0.0).to(tl.float32)
        w_even = _e2m1(packed & 15) * scale
        w_odd = _e2m1(packed >> 4) * scale
        acc += tl.sum(w_even * x_even[None, :] + w_odd * x_odd[None, :], axis=1)
    g = tl.load(g_ptr).to(tl.float32)
    tl.store(out_ptr + rows, acc * g, mask=mask_n)


def nvfp4_gemv(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, scale2: torch.Tensor) -> torch.Tensor:
    """x [K] -> fp32 [N] = dequant(packed, scale, scale2) @ x."""
    n, k = packed.shape[0], packed.shape[1] * 2
    out = torch.empty(n, device=x.device, dtype=torch.float32)
    block_n = 16
    nvfp4_gemv_kernel[(triton.cdiv(n, block_n),)](
        x.contiguous(), packed.contiguous(), scale.contiguous().view(torch.uint8), scale2.reshape(1).float(), out,
        n, k, BLOCK_N=block_n, BLOCK_K=min(256, max(32, triton.next_power_of_2(k))),
    )
    return out
