"""GatedDeltaNet's output norm over a chunk of tokens in one launch (prefill; options.prefill_kernels=fused).

Why: the reference `ops.rms_norm_gated` is ~12 torch ops per (layer, chunk) step (float, pow, mean, add, rsqrt,
mul, cast, weight mul, float, silu, mul, cast) over [T, heads, V] fp32 intermediates, in a prefill whose host
time exceeds its GPU time. Here one program normalises a few (token, head) rows with the decode step's
arithmetic (gdn_decode._gated_rms_norm: the same roundings as the reference, 1/sqrt for its rsqrt).
Reference: ops.rms_norm_gated.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .gdn_decode import _DT, _gated_rms_norm, _round

ROWS = 16  # (token, head) rows a program normalises


@triton.jit
def gated_rms_norm_kernel(o_ptr, z_ptr, w_ptr, out_ptr, R, V, eps, ROWS_P: tl.constexpr,
                          BV: tl.constexpr, DT: tl.constexpr, WDT: tl.constexpr):
    rows = tl.program_id(0) * ROWS_P + tl.arange(0, ROWS_P)[:, None]
    cols = tl.arange(0, BV)[None, :]
    mask = (rows < R) & (cols < V)
    rows64 = rows.to(tl.int64)
    o = _round(tl.load(o_ptr + rows64 * V + cols, mask=mask, other=0.0).to(tl.float32), DT)
    zr = _round(tl.load(z_ptr + rows64 * V + cols, mask=mask, other=0.0).to(tl.float32), DT)
    w = tl.load(w_ptr + cols, mask=cols < V, other=0.0).to(tl.float32)
    y = _gated_rms_norm(o, zr, w, mask, V, eps, DT, WDT)
    tl.store(out_ptr + rows64 * V + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def gated_rms_norm(o: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """o [T, heads, V] (the rule's output, any float dtype; rounded to z's dtype first, as the caller's
    `.to(x.dtype)`), z [T, heads, V], weight [V] -> [T, heads, V] in z.dtype: rms_norm_gated(o.to(z.dtype), z,
    weight, eps) in one launch."""
    if o.dim() != 3 or z.shape != o.shape or weight.shape != (o.shape[-1],):
        raise ValueError(f"o and z must be [T, heads, V] alike and weight [V], got {tuple(o.shape)}, "
                         f"{tuple(z.shape)}, {tuple(weight.shape)}")
    if z.dtype not in _DT:
        raise TypeError(f"gated_rms_norm runs in float32 / bfloat16 / float16, not {z.dtype}")
    t, heads, v = o.shape
    o, z = o.contiguous(), z.contiguous()  # views of contiguous projections: no copies
    wdt = torch.promote_types(weight.dtype, z.dtype)
    out = torch.empty(t, heads, v, device=z.device, dtype=z.dtype)
    rows = t * heads
    if rows == 0:
        return out
    gated_rms_norm_kernel[(triton.cdiv(rows, ROWS),)](
        o, z, weight, out, rows, v, eps, ROWS_P=ROWS, BV=triton.next_power_of_2(v), DT=_DT[z.dtype],
        WDT=_DT[wdt], num_warps=4)
    return out
