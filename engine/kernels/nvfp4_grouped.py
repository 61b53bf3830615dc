"""Grouped prefill MoE over native NVFP4 expert rows (W4A16): the prefill counterpart of nvfp4_moe_decode.

Same flow as moe_triton.moe_grouped: align_pairs sorts the (token, k) pairs by expert on the device (no host
sync) and pads each expert's run to BLOCK_M; a gate_up kernel writes act = SiLU(gate x) * (up x) per pair, a
down kernel writes the pair's output times its routing weight in fp32, and the k outputs of a token are summed
in slot order (deterministic, no atomics). The difference: the weight tile is decoded from the row's bytes
(layout in nvfp4_triton.pack_nvfp4_expert) inside the K loop.

Element 2j of a row sits in the low nibble of byte j, so instead of interleaving the decoded nibbles, each K
block is two tl.dot calls: the even activation columns times the low-nibble tile plus the odd columns times
the high-nibble tile. E2M1 * E4M3 has at most 5 significant bits, so the decoded tile is exact in bf16/fp16
and the tensor cores see exactly the checkpoint's values; the fp32 global scales are applied after the K loop.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .moe_triton import align_pairs
from ..quant.nvfp4_rows import unpack_nvfp4_expert  # noqa: F401 (re-exported for the tests)
from .nvfp4_triton import _e2m1, _e4m3, nvfp4_expert_row_bytes


@triton.jit
def _nvfp4_tile(w_ptr, s_ptr, n64, k_in, k0, half, mask, dtype: tl.constexpr):
    """(low, high) nibble tiles [BLOCK_K/2, BLOCK_N] of dequant(W[n, k0:k0+BLOCK_K]).T without the global
    scale, for a [*, k_in] NVFP4 matrix (packed bytes at w_ptr, E4M3 scale bytes at s_ptr). Masked bytes
    decode to 0, so padding contributes nothing."""
    packed = tl.load(w_ptr + n64[None, :] * (k_in // 2) + (k0 // 2 + half)[:, None], mask=mask, other=0).to(tl.int32)
    # BLOCK_K is a multiple of 32 and k_in of 16, so both nibbles of a byte share one 16-element scale group.
    sc = _e4m3(tl.load(s_ptr + n64[None, :] * (k_in // 16) + ((k0 + 2 * half) // 16)[:, None],
                       mask=mask, other=0).to(tl.int32))
    return (_e2m1(packed & 15) * sc).to(dtype), (_e2m1(packed >> 4) * sc).to(dtype)


@triton.jit
def _dot(a, w, acc, FP32_DOT: tl.constexpr):
    if FP32_DOT:  # fp32 inputs, or any dtype in the interpreter: exact fp32 products
        # (Triton 3.6's interpreter matmuls bf16 as its raw uint16 bits; bf16*bf16 is exact in fp32, so the
        # upcast computes what the tensor cores do, up to the order of the fp32 sums.)
        return tl.dot(a.to(tl.float32), w.to(tl.float32), acc, input_precision="ieee")
    else:  # bf16/fp16 on the GPU: tensor cores, fp32 accumulation
        return tl.dot(a, w, acc)


@triton.jit
def nvfp4_grouped_gate_up_kernel(
    x_ptr, pair_ids_ptr, block_expert_ptr, rows_ptr, act_ptr, num_pairs, H, I, TOP_K, E, row_stride,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FP32_DOT: tl.constexpr,
):
    pid_b = tl.program_id(0)
    pid_n = tl.program_id(1)
    # align_pairs sorts by id, so a block's id is the row (expert or cache slot) all its pairs read.
    e = tl.load(block_expert_ptr + pid_b).to(tl.int64)
    if e >= E:  # block past the last padded run: nothing to do
        return
    pairs = tl.load(pair_ids_ptr + pid_b * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = pairs < num_pairs
    tokens = (pairs // TOP_K).to(tl.int64)
    base = rows_ptr + e * row_stride
    scales = base + I * H  # after gate_up packed [2I, H/2]
    globals_ = (base + I * H + I * H // 8 + H * I // 2 + H * I // 16).to(tl.pointer_type(tl.float32))
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = n < I
    gate_rows, up_rows = n.to(tl.int64), (n + I).to(tl.int64)
    half = tl.arange(0, BLOCK_K // 2)
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        mask_b = k0 // 2 + half < H // 2
        a_mask = valid[:, None] & mask_b[None, :]
        cols = tokens[:, None] * H + (k0 + 2 * half)[None, :]
        a_even = tl.load(x_ptr + cols, mask=a_mask, other=0.0)
        a_odd = tl.load(x_ptr + cols + 1, mask=a_mask, other=0.0)
        mask = mask_b[:, None] & mask_n[None, :]
        g_lo, g_hi = _nvfp4_tile(base, scales, gate_rows, H, k0, half, mask, x_ptr.dtype.element_ty)
        acc_g = _dot(a_odd, g_hi, _dot(a_even, g_lo, acc_g, FP32_DOT), FP32_DOT)
        u_lo, u_hi = _nvfp4_tile(base, scales, up_rows, H, k0, half, mask, x_ptr.dtype.element_ty)
        acc_u = _dot(a_odd, u_hi, _dot(a_even, u_lo, acc_u, FP32_DOT), FP32_DOT)
    g = acc_g * tl.load(globals_)  # gate and up share the block scales but not the global scale
    u = acc_u * tl.load(globals_ + 1)
    h = g / (1.0 + tl.exp(-g)) * u
    tl.store(act_ptr + pairs[:, None].to(tl.int64) * I + n[None, :], h.to(act_ptr.dtype.element_ty),
             mask=valid[:, None] & mask_n[None, :])


@triton.jit
def nvfp4_grouped_down_kernel(
    act_ptr, pair_ids_ptr, block_expert_ptr, wts_ptr, rows_ptr, out_ptr, num_pairs, H, I, E, row_stride,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FP32_DOT: tl.constexpr,
):
    pid_b = tl.program_id(0)
    pid_n = tl.program_id(1)
    e = tl.load(block_expert_ptr + pid_b).to(tl.int64)
    if e >= E:
        return
    pairs = tl.load(pair_ids_ptr + pid_b * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = pairs < num_pairs
    p64 = pairs.to(tl.int64)
    base = rows_ptr + e * row_stride
    down = base + I * H + I * H // 8
    scales = down + H * I // 2
    globals_ = (scales + H * I // 16).to(tl.pointer_type(tl.float32))
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = n < H
    n64 = n.to(tl.int64)
    half = tl.arange(0, BLOCK_K // 2)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, I, BLOCK_K):
        mask_b = k0 // 2 + half < I // 2
        a_mask = valid[:, None] & mask_b[None, :]
        cols = p64[:, None] * I + (k0 + 2 * half)[None, :]
        a_even = tl.load(act_ptr + cols, mask=a_mask, other=0.0)
        a_odd = tl.load(act_ptr + cols + 1, mask=a_mask, other=0.0)
        w_lo, w_hi = _nvfp4_tile(down, scales, n64, I, k0, half, mask_b[:, None] & mask_n[None, :],
                                 act_ptr.dtype.element_ty)
        acc = _dot(a_odd, w_hi, _dot(a_even, w_lo, acc, FP32_DOT), FP32_DOT)
    wt = tl.load(wts_ptr + p64, mask=valid, other=0.0).to(tl.float32)
    acc = acc * tl.load(globals_ + 2) * wt[:, None]
    tl.store(out_ptr + p64[:, None] * H + n64[None, :], acc, mask=valid[:, None] & mask_n[None, :])


def _blocks(n: int, k: int, gpu: bool) -> tuple[int, int]:
    # BLOCK_K is a multiple of 32 (each half-dot has K = BLOCK_K/2 >= 16 for tl.dot, and no scale group is
    # split); on the GPU 64x128 tiles, in the interpreter smaller ones cut the masked waste on tiny shapes.
    cap_n, cap_k = (64, 128) if gpu else (64, 64)
    return min(cap_n, max(16, triton.next_power_of_2(n))), min(cap_k, max(32, triton.next_power_of_2(k)))


def nvfp4_moe_grouped(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor,
                      hidden: int, inter: int, block_m: int = 32) -> torch.Tensor:
    """x [T, H], weights/ids [T, k] (ids index rows), rows uint8 [E, >= row bytes] -> [T, H] in x.dtype."""
    if hidden % 16 or inter % 16:
        raise ValueError(f"NVFP4 needs hidden and inter to be multiples of 16, got {hidden}, {inter}")
    if rows.dtype != torch.uint8 or rows.dim() != 2 or rows.stride(1) != 1 \
            or rows.shape[1] < nvfp4_expert_row_bytes(hidden, inter):
        raise ValueError(f"rows must be uint8 [E, >= {nvfp4_expert_row_bytes(hidden, inter)}] with unit inner stride")
    if rows.stride(0) % 4:  # the kernels read the fp32 globals at the row's end as aligned 4-byte words
        raise ValueError(f"rows' row stride must be a multiple of 4 bytes, got {rows.stride(0)}")
    t, k = ids.shape
    e = rows.shape[0]
    num_pairs = t * k
    ids_flat = ids.reshape(-1).contiguous()
    pair_ids, block_expert = align_pairs(ids_flat, e, block_m)
    num_blocks = block_expert.shape[0]
    gpu = x.device.type == "cuda"
    fp32_dot = x.dtype == torch.float32 or not gpu  # see _dot
    # act in x's dtype: the down kernel's dot then runs on the tensor cores in bf16, like moe_grouped.
    act = torch.empty(num_pairs, inter, device=x.device, dtype=x.dtype)
    block_n, block_k = _blocks(inter, hidden, gpu)
    nvfp4_grouped_gate_up_kernel[(num_blocks, triton.cdiv(inter, block_n))](
        x.contiguous(), pair_ids, block_expert, rows, act, num_pairs, hidden, inter, k, e, rows.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, FP32_DOT=fp32_dot,
    )
    pair_out = torch.empty(num_pairs, hidden, device=x.device, dtype=torch.float32)
    block_n, block_k = _blocks(hidden, inter, gpu)
    nvfp4_grouped_down_kernel[(num_blocks, triton.cdiv(hidden, block_n))](
        act, pair_ids, block_expert, weights.reshape(-1).contiguous(), rows, pair_out, num_pairs,
        hidden, inter, e, rows.stride(0), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, FP32_DOT=fp32_dot,
    )
    # Sum the k expert outputs of each token in slot order: deterministic, no atomics.
    per_slot = pair_out.view(t, k, hidden)
    out = per_slot[:, 0].clone()
    for j in range(1, k):
        out += per_slot[:, j]
    return out.to(x.dtype)


def nvfp4_moe_grouped_reference(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor,
                                hidden: int, inter: int) -> torch.Tensor:
    """float32 torch reference: out = sum_k w_k * down(SiLU(gate x) * up x), each used expert dequantized from
    its row with quant.formats.dequant_nvfp4. Returns float32 [T, H]."""
    from ..quant.formats import dequant_nvfp4

    xf = x.float()
    out = torch.zeros(x.shape[0], hidden, device=x.device, dtype=torch.float32)
    for e in torch.unique(ids).tolist():
        gate, up, down = (dequant_nvfp4(*q) for q in unpack_nvfp4_expert(rows[e], hidden, inter))
        tok, slot = torch.where(ids == e)
        h = torch.nn.functional.silu(xf[tok] @ gate.T) * (xf[tok] @ up.T)
        out.index_add_(0, tok, (h @ down.T) * weights[tok, slot, None].float())
    return out
