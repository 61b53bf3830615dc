"""The grouped MoE's last step in one launch: each token's k expert outputs summed in slot order, then rounded.

Why: the grouped prefill kernels (moe_triton.moe_grouped, nvfp4_grouped.nvfp4_moe_grouped) leave one fp32 row
per (token, slot) pair, pair_out [T * k, H], and summed them with torch: a clone of slot 0, k - 1 in-place adds
over strided views and a cast, 2 + k launches and ~3x the bytes (each add reads and writes the running sum).
At 2,048-token chunks that is 9 launches and ~390 MB of HBM traffic per (layer, chunk) step, and the host time
of 9 torch calls, in a prefill that is host-bound (docs/RESULTS.md, the 64K profile). Here one program reads a
tile of every slot once and writes the rounded sum once.

The same bytes as the torch sum: the adds are the same fp32 adds in the same order (slot 0 + slot 1, + slot 2,
...), and the result is rounded once to nearest even (bf16 by hand, as torch's cast; decode_norm._round_as).
Reference: pair_sum_reference below (the torch code it replaces).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .nvfp4_triton import _store_exact, exact_out

BLOCK = 1024  # elements of a token row a program sums (4 KB of fp32 per slot)


@triton.jit
def pair_sum_kernel(pairs_ptr, out_ptr, H, K: tl.constexpr, BLOCK_H: tl.constexpr, OUT_BF16: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = cols < H
    row = pairs_ptr + token * K * H + cols
    acc = tl.load(row, mask=mask, other=0.0)
    for j in tl.static_range(1, K):  # slot order, as the torch loop adds them
        acc += tl.load(row + j * H, mask=mask, other=0.0)
    _store_exact(out_ptr + token * H + cols, acc, mask, OUT_BF16)


def pair_sum(pair_out: torch.Tensor, tokens: int, k: int, dtype: torch.dtype) -> torch.Tensor:
    """pair_out fp32 [tokens * k, H] (row t * k + j: token t's slot j) -> [tokens, H] in dtype: the k rows of
    each token added in order j = 0..k-1 in fp32, rounded once. One launch, no host sync."""
    if pair_out.dtype != torch.float32 or pair_out.dim() != 2 or pair_out.shape[0] != tokens * k \
            or not pair_out.is_contiguous():
        raise ValueError(f"pair_out must be contiguous fp32 [{tokens} * {k}, H], got {pair_out.dtype} "
                         f"{tuple(pair_out.shape)}")
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"pair_sum rounds to float32 / bfloat16 / float16, not {dtype}")
    h = pair_out.shape[1]
    out = torch.empty(tokens, h, device=pair_out.device, dtype=dtype)
    if tokens == 0:
        return out
    block = min(BLOCK, triton.next_power_of_2(h))
    pair_sum_kernel[(tokens, triton.cdiv(h, block))](
        pair_out, exact_out(out), h, K=k, BLOCK_H=block, OUT_BF16=dtype == torch.bfloat16, num_warps=4)
    return out


def pair_sum_reference(pair_out: torch.Tensor, tokens: int, k: int, dtype: torch.dtype) -> torch.Tensor:
    """The torch code pair_sum replaced: slot 0 cloned, slots 1..k-1 added in place, one cast."""
    per_slot = pair_out.view(tokens, k, -1)
    out = per_slot[:, 0].clone()
    for j in range(1, k):
        out += per_slot[:, j]
    return out.to(dtype)
