"""Triton kernels for the routed experts (SwiGLU), with torch references in moe_ref.py.

Weights: gate_up [E, 2I, H] (rows 0:I gate, I:2I up; (out, in) layout) and down [E, H, I], indexed by an
expert (or slot) id, so the same kernels serve resident experts and the offload slot cache.

- decode (batch 1): `moe_decode` reads only the k chosen experts: one GEMV kernel for gate/up + SiLU*up,
  one for down weighted by the router weights, summed over the k experts in a fixed order.
- prefill: `moe_grouped` sorts (token, k) pairs by expert on the device (no host sync), pads each expert's
  rows to the block size, and runs two grouped GEMMs with tl.dot; the k outputs of a token are summed in a
  fixed order afterwards. Accumulation is fp32 throughout.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .pair_sum import pair_sum


@triton.jit
def moe_decode_gate_up_kernel(
    x_ptr, ids_ptr, w_ptr, h_ptr, H, I, stride_we, stride_wn,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    j = tl.program_id(0)
    pid_n = tl.program_id(1)
    e = tl.load(ids_ptr + j).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < I
    acc_g = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_N], dtype=tl.float32)
    w_base = w_ptr + e * stride_we
    for k0 in range(0, H, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < H
        x = tl.load(x_ptr + offs_k, mask=mask_k, other=0.0).to(tl.float32)
        m2 = mask_n[:, None] & mask_k[None, :]
        g = tl.load(w_base + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :], mask=m2, other=0.0)
        u = tl.load(w_base + (offs_n[:, None] + I).to(tl.int64) * stride_wn + offs_k[None, :], mask=m2, other=0.0)
        acc_g += tl.sum(g.to(tl.float32) * x[None, :], axis=1)
        acc_u += tl.sum(u.to(tl.float32) * x[None, :], axis=1)
    h = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
    tl.store(h_ptr + j * I + offs_n, h, mask=mask_n)


@triton.jit
def moe_decode_down_kernel(
    h_ptr, ids_ptr, wts_ptr, w_ptr, out_ptr, H, I, stride_we, stride_wm,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
):
    # One program per (row block, chosen expert): k times more programs than rows alone, so a batch-1
    # step keeps the SMs busy; the k partial rows are summed afterwards in a fixed order.
    pid_m = tl.program_id(0)
    j = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < H
    e = tl.load(ids_ptr + j).to(tl.int64)
    wt = tl.load(wts_ptr + j).to(tl.float32)
    acc = tl.zeros([BLOCK_M], dtype=tl.float32)
    for k0 in range(0, I, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < I
        h = tl.load(h_ptr + j * I + offs_k, mask=mask_k, other=0.0)
        w = tl.load(w_ptr + e * stride_we + offs_m[:, None].to(tl.int64) * stride_wm + offs_k[None, :],
                    mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        acc += tl.sum(w.to(tl.float32) * h[None, :], axis=1)
    tl.store(out_ptr + j * H + offs_m, acc * wt, mask=mask_m)


def moe_decode(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor,
               down: torch.Tensor) -> torch.Tensor:
    """x [1, H], weights/ids [1, k] -> [1, H]. Reads only the k chosen experts; no host sync."""
    k = ids.shape[-1]
    _, two_i, h = gate_up.shape
    inter = two_i // 2
    act = torch.empty(k, inter, device=x.device, dtype=torch.float32)
    partial = torch.empty(k, h, device=x.device, dtype=torch.float32)
    ids_flat, wts = ids.reshape(-1).contiguous(), weights.reshape(-1).contiguous()
    block_n = min(16, triton.next_power_of_2(inter))
    moe_decode_gate_up_kernel[(k, triton.cdiv(inter, block_n))](
        x.reshape(-1).contiguous(), ids_flat, gate_up, act, h, inter, gate_up.stride(0), gate_up.stride(1),
        BLOCK_N=block_n, BLOCK_K=min(256, triton.next_power_of_2(h)),
    )
    block_m = min(32, triton.next_power_of_2(h))
    moe_decode_down_kernel[(triton.cdiv(h, block_m), k)](
        act, ids_flat, wts, down, partial, h, inter, down.stride(0), down.stride(1),
        BLOCK_M=block_m, BLOCK_K=min(256, triton.next_power_of_2(inter)),
    )
    return partial.sum(0, keepdim=True).to(x.dtype)


@triton.jit
def moe_grouped_gate_up_kernel(
    x_ptr, pair_ids_ptr, block_expert_ptr, w_ptr, h_ptr, num_pairs, H, I, TOP_K, E,
    stride_we, stride_wn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IS_FP32: tl.constexpr,
):
    pid_b = tl.program_id(0)
    pid_n = tl.program_id(1)
    e = tl.load(block_expert_ptr + pid_b).to(tl.int64)
    if e >= E:
        return
    pairs = tl.load(pair_ids_ptr + pid_b * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = pairs < num_pairs
    tokens = (pairs // TOP_K).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < I
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    w_base = w_ptr + e * stride_we
    for k0 in range(0, H, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < H
        a = tl.load(x_ptr + tokens[:, None] * H + offs_k[None, :], mask=valid[:, None] & mask_k[None, :], other=0.0)
        m2 = mask_k[:, None] & mask_n[None, :]
        g = tl.load(w_base + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None], mask=m2, other=0.0)
        u = tl.load(w_base + (offs_n[None, :] + I).to(tl.int64) * stride_wn + offs_k[:, None], mask=m2, other=0.0)
        if IS_FP32:  # exact fp32 products (the CPU interpreter and fp32 runs); bf16 uses the tensor cores
            acc_g = tl.dot(a, g, acc_g, input_precision="ieee")
            acc_u = tl.dot(a, u, acc_u, input_precision="ieee")
        else:
            acc_g = tl.dot(a, g, acc_g)
            acc_u = tl.dot(a, u, acc_u)
    h = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
    tl.store(h_ptr + pairs[:, None].to(tl.int64) * I + offs_n[None, :], h.to(h_ptr.dtype.element_ty),
             mask=valid[:, None] & mask_n[None, :])


@triton.jit
def moe_grouped_down_kernel(
    h_ptr, pair_ids_ptr, block_expert_ptr, wts_ptr, w_ptr, out_ptr, num_pairs, H, I, E,
    stride_we, stride_wm,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IS_FP32: tl.constexpr,
):
    pid_b = tl.program_id(0)
    pid_n = tl.program_id(1)
    e = tl.load(block_expert_ptr + pid_b).to(tl.int64)
    if e >= E:
        return
    pairs = tl.load(pair_ids_ptr + pid_b * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = pairs < num_pairs
    rows = pairs.to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < H
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, I, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < I
        a = tl.load(h_ptr + rows[:, None] * I + offs_k[None, :], mask=valid[:, None] & mask_k[None, :], other=0.0)
        w = tl.load(w_ptr + e * stride_we + offs_n[None, :].to(tl.int64) * stride_wm + offs_k[:, None],
                    mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        if IS_FP32:
            acc = tl.dot(a, w, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, w, acc)
    wt = tl.load(wts_ptr + rows, mask=valid, other=0.0).to(tl.float32)
    acc = acc * wt[:, None]
    tl.store(out_ptr + rows[:, None] * H + offs_n[None, :], acc, mask=valid[:, None] & mask_n[None, :])


def align_pairs(ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(token, k) pairs sorted by expert, each expert's run padded to block_m, all on the device.

    Returns pair_ids [max_blocks * block_m] (padding = num_pairs) and block_expert [max_blocks] (unused
    blocks = num_experts). max_blocks is a bound known on the host, so nothing waits for the GPU."""
    flat = ids.reshape(-1)
    num_pairs = flat.numel()
    max_blocks = triton.cdiv(num_pairs, block_m) + num_experts
    # Not torch.bincount: on CUDA it reads min() and max() back to the host (two syncs per call, 2,560 in one 64K
    # prefill, measured), which kept the CPU from queueing ahead of the GPU.
    counts = torch.zeros(num_experts, dtype=torch.long, device=ids.device).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = torch.cumsum(padded, 0)
    padded_start = padded_end - padded
    order = torch.argsort(flat, stable=True)
    sorted_experts = flat[order]
    run_start = torch.cumsum(counts, 0) - counts
    rank = torch.arange(num_pairs, device=ids.device) - run_start[sorted_experts]
    dest = padded_start[sorted_experts] + rank
    pair_ids = torch.full((max_blocks * block_m,), num_pairs, dtype=torch.int64, device=ids.device)
    pair_ids.scatter_(0, dest, order)
    block_start = torch.arange(max_blocks, device=ids.device) * block_m
    block_expert = torch.searchsorted(padded_end, block_start, right=True)
    return pair_ids, block_expert


LARGE_FROM = 192  # pairs an expert from which the large-block rule (moe_prefill_blocks=large) applies: here
# 64-row blocks, nvfp4_grouped.choose_config's 256-row ones
LARGE_BLOCK_M = 64


def moe_grouped(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor,
                down: torch.Tensor, block_m: int = 32, large_blocks: bool = False) -> torch.Tensor:
    """x [T, H], weights/ids [T, k] -> [T, H] (prefill). large_blocks (the engine's moe_prefill_blocks=large):
    64-row blocks from LARGE_FROM pairs an expert (0.80x the 32-row blocks' time at 8,192 tokens on the H200,
    docs/RESULTS.md session 13; 1.32x faster at 16K tokens, session 7; not yet paired in the engine)."""
    t, h = x.shape
    k = ids.shape[-1]
    e, two_i, _ = gate_up.shape
    inter = two_i // 2
    num_pairs = t * k
    if large_blocks and num_pairs >= LARGE_FROM * e:
        block_m = LARGE_BLOCK_M
    pair_ids, block_expert = align_pairs(ids, e, block_m)
    num_blocks = block_expert.shape[0]
    act = torch.empty(num_pairs, inter, device=x.device, dtype=x.dtype)
    is_fp32 = x.dtype == torch.float32
    block_n = min(64, max(16, triton.next_power_of_2(inter)))
    block_k = min(64, max(16, triton.next_power_of_2(h)))
    moe_grouped_gate_up_kernel[(num_blocks, triton.cdiv(inter, block_n))](
        x.contiguous(), pair_ids, block_expert, gate_up, act, num_pairs, h, inter, k, e,
        gate_up.stride(0), gate_up.stride(1), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, IS_FP32=is_fp32,
    )
    pair_out = torch.empty(num_pairs, h, device=x.device, dtype=torch.float32)
    block_n = min(64, max(16, triton.next_power_of_2(h)))
    block_k = min(64, max(16, triton.next_power_of_2(inter)))
    moe_grouped_down_kernel[(num_blocks, triton.cdiv(h, block_n))](
        act, pair_ids, block_expert, weights.reshape(-1).contiguous(), down, pair_out, num_pairs, h, inter, e,
        down.stride(0), down.stride(1), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, IS_FP32=is_fp32,
    )
    # Sum the k expert outputs of each token in slot order, rounded once: deterministic, no atomics, one launch.
    return pair_sum(pair_out, t, k, x.dtype)
