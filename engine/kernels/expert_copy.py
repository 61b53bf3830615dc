"""Gather missed experts from the host bank into their GPU slots, driven by device-side ids and count.

A Triton kernel that reads the pinned host bank directly (zero-copy over PCIe; the pinned tensor is mapped
into the GPU's address space), so the copy needs no host-side count and can be captured in a CUDA graph.
Measured on the H200 (device README): 42.8 GB/s for 28 experts of ~1.77 MB, vs 39.7 GB/s for 28 copy_ calls.
The torch reference is `rows[dst[:n]] = bank[src[:n]]`.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def gather_experts_kernel(bank_ptr, src_ptr, dst_ptr, count_ptr, out_ptr, row_elems, BLOCK: tl.constexpr):
    i = tl.program_id(0)
    chunk = tl.program_id(1)
    n = tl.load(count_ptr)
    if i < n:
        src = tl.load(src_ptr + i).to(tl.int64)
        dst = tl.load(dst_ptr + i).to(tl.int64)
        offs = chunk.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < row_elems
        vals = tl.load(bank_ptr + src * row_elems + offs, mask=mask)
        tl.store(out_ptr + dst * row_elems + offs, vals, mask=mask)


def gather_experts(bank: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, count: torch.Tensor,
                   rows: torch.Tensor, block: int = 4096) -> None:
    """bank [R, row] (pinned host or device), src/dst [k], count [1] -> rows[dst[i]] = bank[src[i]], i < count."""
    k, row = src.shape[0], bank.shape[1]
    gather_experts_kernel[(k, triton.cdiv(row, block))](bank, src, dst, count, rows, row, BLOCK=block)
