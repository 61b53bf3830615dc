"""Fused residual add + zero-centred RMSNorm, and the attention output gate, for the batch-1 decode step.

add_rms_norm fuses the decoder layer's `x = x + h` with the next `rms_norm_zero_centered(x, w, eps)` (about ten
torch kernels: add, float, pow, mean, add, rsqrt, mul, float, add, mul, cast) into one launch: one program per row,
the whole row in registers. Reference: add_rms_norm_reference below, built from engine/model/ops.py.

sigmoid_gate_mul fuses GatedAttention's `out * torch.sigmoid(gate)` (sigmoid, mul; and the copy that made the
strided gate half of q_proj's output contiguous). Reference: sigmoid_gate_mul_reference.

Rounding follows torch's: the sum x + delta is rounded to x.dtype before the norm reads it (torch's bf16 add
computes in fp32 and rounds), the norm runs in fp32 and is rounded once; the gate's sigmoid is rounded to the
gate's dtype before the product, so in bf16 the only difference from torch is an ulp of exp / rsqrt.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import gdc_prologue, pdl_launch
from ..model.ops import rms_norm_zero_centered
from .nvfp4_triton import _store_exact, exact_out

ROUND_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


def round_code(dtype: torch.dtype) -> int:
    """The ROUND constexpr of _round_as for values of this dtype."""
    if dtype not in ROUND_CODES:
        raise TypeError(f"decode kernels take float32 / bfloat16 / float16, not {dtype}")
    return ROUND_CODES[dtype]


@triton.jit
def _round_as(value, ROUND: tl.constexpr):
    """fp32 value rounded (to nearest even) to fp32 (0), bf16 (1) or fp16 (2), kept in fp32: what a torch op
    whose result has that dtype would have produced. bf16 by hand: the interpreter truncates in .to(bf16)."""
    if ROUND == 1:
        ib = value.to(tl.int32, bitcast=True)
        ib = (ib + 0x7FFF + ((ib >> 16) & 1)) & -65536
        return ib.to(tl.float32, bitcast=True)
    elif ROUND == 2:
        return value.to(tl.float16).to(tl.float32)
    else:
        return value


@triton.jit
def add_rms_norm_kernel(x_ptr, delta_ptr, w_ptr, new_x_ptr, norm_ptr, H, x_stride, delta_stride, new_x_stride,
                        norm_stride, eps, part_stride, HAS_DELTA: tl.constexpr, ROUND: tl.constexpr,
                        BLOCK_H: tl.constexpr, PARTS: tl.constexpr, USE_GDC: tl.constexpr = False):
    gdc_prologue(USE_GDC)  # PDL: nothing is read before the previous kernel ends
    _add_rms_norm_row(x_ptr, delta_ptr, w_ptr, new_x_ptr, norm_ptr, tl.program_id(0).to(tl.int64), H, x_stride,
                      delta_stride, new_x_stride, norm_stride, eps, part_stride, HAS_DELTA, ROUND, BLOCK_H, PARTS)


@triton.jit
def _add_rms_norm_row(x_ptr, delta_ptr, w_ptr, new_x_ptr, norm_ptr, row, H, x_stride, delta_stride, new_x_stride,
                      norm_stride, eps, part_stride, HAS_DELTA: tl.constexpr, ROUND: tl.constexpr,
                      BLOCK_H: tl.constexpr, PARTS: tl.constexpr, FIRST_STORES: tl.constexpr = False):
    """One row of add_rms_norm (also the tail of a producer's launch: gemv_norm; in every program of the router's
    GEMV, router_norm, where FIRST_STORES leaves both stores to program 0). Returns the normed row as stored
    (rounded to the output dtype), in fp32 registers."""
    cols = tl.arange(0, BLOCK_H)
    mask = cols < H
    # program 0 as a tensor compare: Triton 3.9's interpreter refuses the int32 mask a scalar compare makes here
    store_mask = mask & ((cols * 0 + tl.program_id(0)) == 0) if FIRST_STORES else mask
    x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_DELTA:
        d_ptrs = delta_ptr + row * delta_stride + cols
        delta = tl.load(d_ptrs, mask=mask, other=0.0).to(tl.float32)
        if PARTS > 0:  # the parts summed in order 0..PARTS-1, rounded once (as one module's output would be)
            for p in tl.static_range(1, PARTS):
                delta += tl.load(d_ptrs + p * part_stride, mask=mask, other=0.0).to(tl.float32)
            delta = _round_as(delta, ROUND)
        x = _round_as(x + delta, ROUND)
        _store_exact(new_x_ptr + row * new_x_stride + cols, x, store_mask, ROUND == 1)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / H + eps)
    scale = 1.0 + tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    normed = (x * rstd) * scale  # ops.py's order
    _store_exact(norm_ptr + row * norm_stride + cols, normed, store_mask, ROUND == 1)
    return _round_as(normed, ROUND)


def default_norm_warps(block_h: int) -> int:
    """One warp per 256 elements (8 bf16 = 16 B per thread), 1..16."""
    return min(16, max(1, block_h // 256))


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float,
                 out_x: torch.Tensor | None = None, out_norm: torch.Tensor | None = None, *,
                 num_warps: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x, delta [T, H] (rows with stride-1 columns), weight [H] -> (new_x, normed), both [T, H] in x.dtype:
    new_x = x + delta rounded to x.dtype (x itself, unwritten, when delta is None), normed =
    rms_norm_zero_centered(new_x, weight, eps). out_x may be x (in place) or delta; out_norm must not
    overlap x or delta. H <= 8192 (one block per row). No host sync.
    delta may also be parts [P, T, H] (e.g. fp32 expert partials, nvfp4_experts_parts): delta is then their sum
    in order p = 0..P-1 in fp32, rounded to x.dtype, as the module they come from would have returned it."""
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"x must be [T, H] with stride-1 rows, got {tuple(x.shape)} strides {x.stride()}")
    t, h = x.shape
    if h > 8192:
        raise ValueError(f"add_rms_norm keeps a row in registers: H {h} > 8192")
    parts, part_stride = 0, 0  # 0: a plain [T, H] delta
    if delta is not None and delta.dim() == 3:
        parts, part_stride = delta.shape[0], delta.stride(0)
        if parts < 1 or delta.shape[1:] != x.shape or delta.stride(2) != 1:
            raise ValueError(f"delta parts must be [P, T, H] with T, H like x {tuple(x.shape)} and stride-1 rows, "
                             f"got {tuple(delta.shape)}")
        delta = delta[0]
    elif delta is not None and (delta.shape != x.shape or delta.stride(1) != 1):
        raise ValueError(f"delta must be [T, H] like x with stride-1 rows, got {tuple(delta.shape)}")

    def fresh():
        return torch.empty(x.shape, device=x.device, dtype=x.dtype)

    new_x = x if delta is None else (fresh() if out_x is None else out_x)
    normed = fresh() if out_norm is None else out_norm
    for o in (new_x, normed):
        if o.shape != x.shape or o.dtype != x.dtype or o.stride(1) != 1:
            raise ValueError("out_x / out_norm must be [T, H] in x.dtype with stride-1 rows")
    block_h = triton.next_power_of_2(h)
    add_rms_norm_kernel[(t,)](
        x, x if delta is None else delta, weight, exact_out(new_x), exact_out(normed), h,
        x.stride(0), x.stride(0) if delta is None else delta.stride(0), new_x.stride(0), normed.stride(0), eps,
        part_stride, HAS_DELTA=delta is not None, ROUND=round_code(x.dtype), BLOCK_H=block_h, PARTS=parts,
        num_warps=num_warps or default_norm_warps(block_h), **pdl_launch(x.device))
    return new_x, normed


def add_rms_norm_reference(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float):
    """DecoderLayer.forward's `x = x + h` then rms_norm_zero_centered(x, w, eps); parts [P, T, H] summed in
    order in fp32 and rounded to x.dtype first."""
    if delta is not None and delta.dim() == 3:
        total = delta[0].float()
        for p in range(1, delta.shape[0]):
            total = total + delta[p].float()
        delta = total.to(x.dtype)
    new_x = x if delta is None else x + delta
    return new_x, rms_norm_zero_centered(new_x, weight, eps)


@triton.jit
def sigmoid_gate_mul_kernel(out_ptr, gate_ptr, dest_ptr, C, out_stride, gate_stride, dest_stride,
                            ROUND_GATE: tl.constexpr, OUT_BF16: tl.constexpr, BLOCK_C: tl.constexpr,
                            USE_GDC: tl.constexpr = False):
    gdc_prologue(USE_GDC)  # PDL: nothing is read before the previous kernel ends
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_C)
    mask = cols < C
    o = tl.load(out_ptr + row * out_stride + cols, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(gate_ptr + row * gate_stride + cols, mask=mask, other=0.0).to(tl.float32)
    s = _round_as(1.0 / (1.0 + tl.exp(-g)), ROUND_GATE)  # torch.sigmoid(gate) in the gate's dtype
    _store_exact(dest_ptr + row * dest_stride + cols, o * s, mask, OUT_BF16)


def _rows(t: torch.Tensor, rows: int, cols: int, name: str) -> torch.Tensor:
    """t as [rows, cols] with stride-1 columns, without a copy."""
    if t.dim() == 2 and t.shape == (rows, cols) and t.stride(1) == 1:
        return t
    if t.is_contiguous() and t.numel() == rows * cols:
        return t.view(rows, cols)
    raise ValueError(f"{name} must be [{rows}, {cols}] with stride-1 rows or contiguous, got {tuple(t.shape)}")


def sigmoid_gate_mul(out: torch.Tensor, gate: torch.Tensor, dest: torch.Tensor | None = None, *,
                     num_warps: int = 2) -> torch.Tensor:
    """out * sigmoid(gate) in one launch. gate [R, C] with stride-1 rows (attention_prologue's gate view:
    [heads, head_dim], row stride 2 * head_dim); out and dest contiguous with R * C elements (e.g. the attention
    output [1, heads * head_dim]) or [R, C] with stride-1 rows. dest defaults to a new tensor shaped like out in
    torch.promote_types(out.dtype, gate.dtype); dest may be out (in place). One program per row."""
    if gate.dim() != 2 or gate.stride(1) != 1:
        raise ValueError(f"gate must be [R, C] with stride-1 rows, got {tuple(gate.shape)} strides {gate.stride()}")
    r, c = gate.shape
    if dest is None:
        dest = torch.empty(out.shape, device=out.device, dtype=torch.promote_types(out.dtype, gate.dtype))
    o2, d2 = _rows(out, r, c, "out"), _rows(dest, r, c, "dest")
    sigmoid_gate_mul_kernel[(r,)](
        o2, gate, exact_out(d2), c, o2.stride(0), gate.stride(0), d2.stride(0),
        ROUND_GATE=round_code(gate.dtype), OUT_BF16=round_code(dest.dtype) == 1, BLOCK_C=triton.next_power_of_2(c),
        num_warps=num_warps, **pdl_launch(out.device))
    return dest


def sigmoid_gate_mul_reference(out: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """GatedAttention.forward's `out * torch.sigmoid(gate)` (gate made contiguous as its reshape does)."""
    return out * torch.sigmoid(gate.reshape(out.shape))
