"""x for the integer tensor cores (nvfp4_mma): each 16-element block as int16 values q = 256 hi + lo, stored as
their int8 high and low bytes.

Why: the MMA tile's B operand is int8; x at int8 alone (2^-8 of a block's largest) would be at the bf16 level of
the output, not under it. q = floor(x (QMAX / amax) + 0.5) with |q| <= QMAX = 32639, so that hi = (q + 128) >> 8
and lo = q - 256 hi are both int8 (at 32767 the high byte of the largest q would be 128). The division is
correctly rounded, once a block (as nvfp4_int_dot.quantize_x16, whose blocks go to 32767).
Reference: quantize_hilo_reference (nvfp4_int_dot.quantize_x16_reference at QMAX).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import gdc_prologue, pdl_launch
from .nvfp4_int_dot import quantize_x16_reference

QMAX = 32639  # the largest |q| whose high byte (q + 128) >> 8 is still an int8
_QMAX = tl.constexpr(float(QMAX))  # the kernels' copy


@triton.jit
def _hilo_block(x, inv):
    """(hi, lo) int32 of x * inv quantized: q = floor(x inv + 0.5), hi = (q + 128) >> 8, lo = q - 256 hi."""
    q = tl.floor(x * inv + 0.5).to(tl.int32)
    hi = (q + 128) >> 8
    return hi, q - hi * 256


@triton.jit
def quantize_row_block_hilo(row, b, hl_ptr, scales_ptr, K: tl.constexpr, BLOCK_H: tl.constexpr):
    """Block b of a row held in registers (fp32 [BLOCK_H], zeros past its end) through quantize_hilo's arithmetic,
    so that the programs of a launch that all hold the row (router_norm's) each store their own blocks."""
    cols = tl.arange(0, BLOCK_H)
    in_block = cols // 16 == b
    amax = tl.max(tl.abs(tl.where(in_block, row, 0.0)), axis=0)
    hi, lo = _hilo_block(row, tl.math.div_rn(_QMAX, tl.where(amax > 0, amax, 1.0)))
    tl.store(hl_ptr + cols, hi.to(tl.int8), mask=in_block)
    tl.store(hl_ptr + K + cols, lo.to(tl.int8), mask=in_block)
    tl.store(scales_ptr + b, tl.math.div_rn(amax, _QMAX))


@triton.jit
def quantize_hilo_kernel(x_ptr, hl_ptr, scales_ptr, K, BLOCK_G: tl.constexpr, USE_GDC: tl.constexpr = False):
    """Blocks pid * BLOCK_G ... of 16 elements: scale amax / QMAX, q = floor(x (QMAX / amax) + 0.5) (each
    division correctly rounded, once a block), stored as hi = (q + 128) >> 8 at hl[i] and lo = q - 256 hi at
    hl[K + i]."""
    gdc_prologue(USE_GDC)  # PDL: x is the previous kernel's output
    g = tl.program_id(0) * BLOCK_G + tl.arange(0, BLOCK_G)
    mask_g = g < K // 16
    cols = g[:, None] * 16 + tl.arange(0, 16)[None, :]
    x = tl.load(x_ptr + cols, mask=mask_g[:, None], other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), axis=1)
    hi, lo = _hilo_block(x, tl.math.div_rn(_QMAX, tl.where(amax > 0, amax, 1.0))[:, None])
    tl.store(hl_ptr + cols, hi.to(tl.int8), mask=mask_g[:, None])
    tl.store(hl_ptr + K + cols, lo.to(tl.int8), mask=mask_g[:, None])
    tl.store(scales_ptr + g, tl.math.div_rn(amax, _QMAX), mask=mask_g)


def hilo_buffers(k: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Where quantize_hilo puts x of k values: (int8 [2 k]: high bytes then low bytes, fp32 block scales [k / 16])."""
    if k % 16:
        raise ValueError(f"x must have a multiple of 16 elements, got {k}")
    return (torch.empty(2 * k, device=device, dtype=torch.int8),
            torch.empty(k // 16, device=device, dtype=torch.float32))


def quantize_hilo(x: torch.Tensor, out: tuple[torch.Tensor, torch.Tensor] | None = None):
    """x [K] (K a multiple of 16) -> (high then low bytes int8 [2 K], fp32 block scales [K / 16])."""
    k = x.numel()
    if x.dim() != 1 or k % 16:
        raise ValueError(f"x must be 1-D with a multiple of 16 elements, got shape {tuple(x.shape)}")
    hl, scales = out if out is not None else hilo_buffers(k, x.device)
    block_g = 16
    quantize_hilo_kernel[(triton.cdiv(k // 16, block_g),)](x.contiguous(), hl, scales, k, BLOCK_G=block_g,
                                                           **pdl_launch(x.device))
    return hl, scales


def quantize_hilo_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize_hilo in torch: (q = 256 hi + lo as int64 [K], fp32 scales [K / 16])."""
    return quantize_x16_reference(x, QMAX)
