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

from ..quant.nvfp4_rows import nvfp4_expert_row_bytes, pack_nvfp4_expert  # noqa: F401 (the row layout)


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
def _e4m3_exact(bits):
    # The same decode as _e4m3, built from the bits (no exp2): bit-exact against torch's float8_e4m3fn cast.
    e = ((bits >> 3) & 15).to(tl.int32)
    m = (bits & 7).to(tl.int32)
    normal = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)  # 2^(e-7) * (1 + m/8)
    mag = tl.where(e == 0, m.to(tl.float32) * 0.001953125, normal)  # subnormal: m * 2^-9
    return tl.where((bits & 128) != 0, -mag, mag)


@triton.jit
def _e2m1_exact(code):
    # The same decode as _e2m1, built from the bits (no exp2): 0.5 * m, or 2^(e-1) * (1 + m/2) for e > 0.
    e = ((code >> 1) & 3).to(tl.int32)
    m = (code & 1).to(tl.int32)
    normal = (((e + 126) << 23) | (m << 22)).to(tl.float32, bitcast=True)
    mag = tl.where(e == 0, m.to(tl.float32) * 0.5, normal)
    return tl.where((code & 8) != 0, -mag, mag)


@triton.jit
def _store_exact(ptr, value, mask, OUT_BF16: tl.constexpr):
    """Store fp32 values as the output dtype, bf16 rounded to nearest even by hand: Triton's interpreter
    truncates in .to(tl.bfloat16) while the GPU rounds, and the torch references round (ptr: int16 for bf16)."""
    if OUT_BF16:
        ib = value.to(tl.int32, bitcast=True)
        ib = ib + 0x7FFF + ((ib >> 16) & 1)
        tl.store(ptr, (ib >> 16).to(tl.int16), mask=mask)
    else:
        tl.store(ptr, value.to(ptr.dtype.element_ty), mask=mask)


def exact_out(out: torch.Tensor) -> torch.Tensor:
    """The tensor _store_exact writes: bf16 as its int16 bits."""
    return out.view(torch.int16) if out.dtype == torch.bfloat16 else out


@triton.jit
def nvfp4_dequant_kernel(w_ptr, s_ptr, g_ptr, out_ptr, numel, K, BLOCK: tl.constexpr, OUT_BF16: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    row, col = offs // K, offs % K
    packed = tl.load(w_ptr + row * (K // 2) + col // 2, mask=mask, other=0).to(tl.int32)
    code = tl.where((col & 1) == 0, packed & 15, packed >> 4)  # element 2j in the low nibble
    scale = _e4m3_exact(tl.load(s_ptr + row * (K // 16) + col // 16, mask=mask, other=0).to(tl.int32))
    value = _e2m1_exact(code) * scale * tl.load(g_ptr).to(tl.float32)  # quant.formats' order of products
    _store_exact(out_ptr + offs, value, mask, OUT_BF16)


def nvfp4_dequant(packed: torch.Tensor, scale: torch.Tensor, scale2: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One pass for what quant.formats.dequant_nvfp4 computes in about ten (int64 codes, a table gather, the
    repeated block scales, fp32 products), byte-equal to it (tests/test_kernels_dequant.py, interpreter and
    GPU). QuantLinear's W4A16 prefill of the NVFP4 dense linears (the shared expert) dequantizes with it on a GPU."""
    n, k = packed.shape[0], packed.shape[1] * 2
    out = torch.empty(n, k, device=packed.device, dtype=dtype)
    block = 4096
    nvfp4_dequant_kernel[(triton.cdiv(n * k, block),)](
        packed.contiguous(), scale.contiguous().view(torch.uint8), scale2.reshape(1).float(), exact_out(out),
        n * k, k, BLOCK=block, OUT_BF16=dtype == torch.bfloat16)
    return out


@triton.jit
def _nvfp4_block_dot(w_ptr, s_ptr, rows64, k_in, k0, half, mask, x_even, x_odd):
    """sum over one K block of dequant(W[rows, k0:k0+BLOCK_K]) * x, for rows of a [*, k_in] NVFP4 matrix whose
    packed bytes start at w_ptr and E4M3 scale bytes at s_ptr (global scale applied by the caller)."""
    byte = k0 // 2 + half
    packed = tl.load(w_ptr + rows64[:, None] * (k_in // 2) + byte[None, :], mask=mask, other=0).to(tl.int32)
    sc = _e4m3(tl.load(s_ptr + rows64[:, None] * (k_in // 16) + ((k0 + 2 * half) // 16)[None, :],
                       mask=mask, other=0).to(tl.int32))
    return tl.sum(_e2m1(packed & 15) * sc * x_even[None, :] + _e2m1(packed >> 4) * sc * x_odd[None, :], axis=1)


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
        mask_b = k0 // 2 + half < K // 2
        x_even = tl.load(x_ptr + k0 + 2 * half, mask=mask_b, other=0.0).to(tl.float32)
        x_odd = tl.load(x_ptr + k0 + 2 * half + 1, mask=mask_b, other=0.0).to(tl.float32)
        acc += _nvfp4_block_dot(w_ptr, s_ptr, rows64, K, k0, half, mask_n[:, None] & mask_b[None, :], x_even, x_odd)
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


@triton.jit
def nvfp4_row_parts(base, H, I):
    """Where the parts of one NVFP4 expert row start (quant/nvfp4_rows.py): gate_up packed [2I, H/2] at base,
    then its E4M3 scales [2I, H/16], down packed [H, I/2], its scales [H, I/16], and the fp32 globals
    (gate, up, down). -> (gate_up scales, down, down scales, globals as an fp32 pointer)."""
    gu_scales = base + I * H
    down = gu_scales + I * H // 8
    down_scales = down + H * I // 2
    return gu_scales, down, down_scales, (down_scales + H * I // 16).to(tl.pointer_type(tl.float32))


@triton.jit
def nvfp4_moe_gate_up_kernel(x_ptr, ids_ptr, rows_ptr, act_ptr, H, I, row_bytes,
                             BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    j = tl.program_id(0)
    pid_n = tl.program_id(1)
    base = rows_ptr + tl.load(ids_ptr + j).to(tl.int64) * row_bytes
    scales, _, _, globals_ = nvfp4_row_parts(base, H, I)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = n < I
    half = tl.arange(0, BLOCK_K // 2)
    acc_g = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_N], dtype=tl.float32)
    gate_rows, up_rows = n.to(tl.int64), (n + I).to(tl.int64)
    for k0 in range(0, H, BLOCK_K):
        mask_b = k0 // 2 + half < H // 2
        mask = mask_n[:, None] & mask_b[None, :]
        x_even = tl.load(x_ptr + k0 + 2 * half, mask=mask_b, other=0.0).to(tl.float32)
        x_odd = tl.load(x_ptr + k0 + 2 * half + 1, mask=mask_b, other=0.0).to(tl.float32)
        acc_g += _nvfp4_block_dot(base, scales, gate_rows, H, k0, half, mask, x_even, x_odd)
        acc_u += _nvfp4_block_dot(base, scales, up_rows, H, k0, half, mask, x_even, x_odd)
    g = acc_g * tl.load(globals_)
    u = acc_u * tl.load(globals_ + 1)
    tl.store(act_ptr + j * I + n, g / (1.0 + tl.exp(-g)) * u, mask=mask_n)


@triton.jit
def nvfp4_moe_down_kernel(act_ptr, ids_ptr, wts_ptr, rows_ptr, out_ptr, H, I, row_bytes,
                          BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    j = tl.program_id(1)
    base = rows_ptr + tl.load(ids_ptr + j).to(tl.int64) * row_bytes
    _, down, scales, globals_ = nvfp4_row_parts(base, H, I)
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = m < H
    m64 = m.to(tl.int64)
    half = tl.arange(0, BLOCK_K // 2)
    acc = tl.zeros([BLOCK_M], dtype=tl.float32)
    for k0 in range(0, I, BLOCK_K):
        mask_b = k0 // 2 + half < I // 2
        a_even = tl.load(act_ptr + j * I + k0 + 2 * half, mask=mask_b, other=0.0)
        a_odd = tl.load(act_ptr + j * I + k0 + 2 * half + 1, mask=mask_b, other=0.0)
        acc += _nvfp4_block_dot(down, scales, m64, I, k0, half, mask_m[:, None] & mask_b[None, :], a_even, a_odd)
    wt = tl.load(wts_ptr + j).to(tl.float32)
    tl.store(out_ptr + j * H + m, acc * tl.load(globals_ + 2) * wt, mask=mask_m)


def nvfp4_moe_decode(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor,
                     hidden: int, inter: int) -> torch.Tensor:
    """Batch-1 routed experts over native NVFP4 rows (bank or slot cache): x [1, H], weights/ids [1, k] -> [1, H].
    The k partial outputs are summed in top-k order (deterministic)."""
    k = ids.shape[-1]
    act = torch.empty(k, inter, device=x.device, dtype=torch.float32)
    partial = torch.empty(k, hidden, device=x.device, dtype=torch.float32)
    ids_flat, wts = ids.reshape(-1).contiguous(), weights.reshape(-1).contiguous()
    row_bytes = rows.shape[1]
    nvfp4_moe_gate_up_kernel[(k, triton.cdiv(inter, 16))](
        x.reshape(-1).contiguous(), ids_flat, rows, act, hidden, inter, row_bytes,
        BLOCK_N=16, BLOCK_K=min(256, max(32, triton.next_power_of_2(hidden))))
    nvfp4_moe_down_kernel[(triton.cdiv(hidden, 32), k)](
        act, ids_flat, wts, rows, partial, hidden, inter, row_bytes,
        BLOCK_M=32, BLOCK_K=min(256, max(32, triton.next_power_of_2(inter))))
    return partial.sum(0, keepdim=True).to(x.dtype)
