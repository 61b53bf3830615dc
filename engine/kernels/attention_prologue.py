"""GatedAttention's work between the projections and the attention kernel, for one decode token, in one launch.

Fuses (reference: attention_prologue_reference below, engine/model/attention.py GatedAttention.forward up to
backend.attend, with engine/model/ops.py's functions): the split of q_proj's output into query and gate halves,
the zero-centred RMSNorm of every q and k head (q_norm / k_norm, [head_dim]), rope_cos_sin + apply_partial_rope
(NeoX rotate_half over the first rotary_dim dims) on q and k, and v passing through: about 35 torch kernels.

One program per head: programs 0..heads-1 take the q heads, the next kv_heads the k heads (and copy v when it
needs a copy). The position is read on the device (the step is captured in a CUDA graph). Precision: the norm
runs in fp32 and is rounded to the projection's dtype, as the reference's norm output is; RoPE then runs in fp32 on
those values with fp32 cos/sin (the reference rounds cos/sin, and each product, to the activation dtype), so
the unrotated dims match the reference and the rotated ones differ by bf16 rounding. inv_freq is torch's own
(rope_inv_freq, the expression of ops.rope_cos_sin), so the angle position * inv_freq is the reference's fp32
product, and on a GPU cos/sin are libdevice's (CUDA's cosf/sinf, as torch's): large positions stay exact.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from .launch import gdc_prologue, pdl_launch
from ..model.ops import apply_partial_rope, rms_norm_zero_centered, rope_cos_sin
from .decode_norm import _round_as, round_code
from .nvfp4_triton import _store_exact, exact_out


@functools.lru_cache(maxsize=16)
def rope_inv_freq(rotary_dim: int, theta: float, device: torch.device) -> torch.Tensor:
    """fp32 [rotary_dim / 2], computed once per (rotary_dim, theta, device) by ops.rope_cos_sin's expression.
    Call it (or attention_prologue) once before capturing a graph, so the cached tensor is made eagerly."""
    return 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float, device=device) / rotary_dim))


@triton.jit
def _cos_sin(angle, LIBDEVICE: tl.constexpr):
    if LIBDEVICE:  # tl.cos may lower to an approximation that loses large arguments; the interpreter lacks these
        return libdevice.cos(angle), libdevice.sin(angle)
    else:
        return tl.cos(angle), tl.sin(angle)


@triton.jit
def attention_prologue_kernel(qg_ptr, k_ptr, v_ptr, qw_ptr, kw_ptr, inv_freq_ptr, pos_ptr, q_out, k_out, v_out,
                              eps, NUM_HEADS, HEAD_DIM, ROTARY_DIM, KV_ROW, COPY_V: tl.constexpr,
                              NORM_ROUND: tl.constexpr, OUT_BF16: tl.constexpr, LIBDEVICE: tl.constexpr,
                              BLOCK_D: tl.constexpr, KV_AT_POS: tl.constexpr, USE_GDC: tl.constexpr = False):
    """KV_AT_POS: k_out / v_out are KV caches of KV_ROW elements per position; k and v land in row `position`."""
    gdc_prologue(USE_GDC)  # PDL: nothing is read before the previous kernel ends
    head = tl.program_id(0)
    at = 0
    if KV_AT_POS:
        at = tl.load(pos_ptr).to(tl.int64) * KV_ROW
    if head < NUM_HEADS:  # a query head: the first half of its 2 * HEAD_DIM slice of q_proj's output
        src = qg_ptr + head * 2 * HEAD_DIM
        w_ptr = qw_ptr
        dst = q_out + head * HEAD_DIM
    else:
        kv = head - NUM_HEADS
        src = k_ptr + kv * HEAD_DIM
        w_ptr = kw_ptr
        dst = k_out + at + kv * HEAD_DIM
        if COPY_V:
            dims = tl.arange(0, BLOCK_D)
            v = tl.load(v_ptr + kv * HEAD_DIM + dims, mask=dims < HEAD_DIM, other=0.0).to(tl.float32)
            _store_exact(v_out + at + kv * HEAD_DIM + dims, v, dims < HEAD_DIM, OUT_BF16)
    _norm_rope_head(src, w_ptr, dst, pos_ptr, inv_freq_ptr, eps, HEAD_DIM, ROTARY_DIM, NORM_ROUND, OUT_BF16,
                    LIBDEVICE, BLOCK_D)


@triton.jit
def _norm_rope_head(src, w_ptr, dst, pos_ptr, inv_freq_ptr, eps, HEAD_DIM, ROTARY_DIM, NORM_ROUND: tl.constexpr,
                    OUT_BF16: tl.constexpr, LIBDEVICE: tl.constexpr, BLOCK_D: tl.constexpr):
    """One head of one token: the zero-centred RMSNorm, rounded to NORM_ROUND, then partial NeoX RoPE at the
    position at pos_ptr, stored at dst."""
    d = tl.arange(0, BLOCK_D)
    inside = d < HEAD_DIM
    x = tl.load(src + d, mask=inside, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / HEAD_DIM + eps)
    xn = _round_as((x * rstd) * (1.0 + tl.load(w_ptr + d, mask=inside, other=0.0).to(tl.float32)), NORM_ROUND)
    # rotate_half: dim d < half pairs with d + half (negated), half <= d < rotary_dim with d - half; the
    # partner is loaded again (an L1 hit) rather than permuted in registers.
    half = ROTARY_DIM // 2
    rotated = d < ROTARY_DIM
    low = d < half
    partner = tl.where(low, d + half, d - half)
    xp = tl.load(src + partner, mask=rotated, other=0.0).to(tl.float32)
    xp = _round_as((xp * rstd) * (1.0 + tl.load(w_ptr + partner, mask=rotated, other=0.0).to(tl.float32)), NORM_ROUND)
    pos = tl.load(pos_ptr).to(tl.float32)
    angle = pos * tl.load(inv_freq_ptr + tl.where(low, d, d - half), mask=rotated, other=0.0)
    c, s = _cos_sin(angle, LIBDEVICE)
    out = tl.where(rotated, xn * c + tl.where(low, -xp, xp) * s, xn)
    _store_exact(dst + d, out, inside, OUT_BF16)


@triton.jit
def attention_prologue_rows_kernel(qg_ptr, k_ptr, qw_ptr, kw_ptr, inv_freq_ptr, pos_ptr, q_out, k_out, eps, NUM_HEADS,
                                   HEAD_DIM, ROTARY_DIM, QG_ROW, K_ROW, NORM_ROUND: tl.constexpr,
                                   OUT_BF16: tl.constexpr, LIBDEVICE: tl.constexpr, BLOCK_D: tl.constexpr):
    """Program (head, token): the decode kernel's per-head work for one token of a prefill chunk."""
    head = tl.program_id(0)
    tok = tl.program_id(1).to(tl.int64)
    if head < NUM_HEADS:
        src = qg_ptr + tok * QG_ROW + head * 2 * HEAD_DIM
        w_ptr = qw_ptr
        dst = q_out + (tok * NUM_HEADS + head) * HEAD_DIM
    else:
        kv = head - NUM_HEADS
        src = k_ptr + tok * K_ROW + kv * HEAD_DIM
        w_ptr = kw_ptr
        dst = k_out + (tok * (tl.num_programs(0) - NUM_HEADS) + kv) * HEAD_DIM
    _norm_rope_head(src, w_ptr, dst, pos_ptr + tok, inv_freq_ptr, eps, HEAD_DIM, ROTARY_DIM, NORM_ROUND, OUT_BF16,
                    LIBDEVICE, BLOCK_D)


def attention_prologue_rows(q_gate: torch.Tensor, k: torch.Tensor, q_norm_w: torch.Tensor, k_norm_w: torch.Tensor,
                            positions: torch.Tensor, eps: float, num_heads: int, num_kv_heads: int, head_dim: int,
                            rotary_dim: int, theta: float, *, num_warps: int = 2
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """A prefill chunk's tokens (prefill_kernels=fused): q_gate [T, heads * 2 * head_dim] and k [T, kv_heads *
    head_dim] with stride-1 rows (the projections' outputs), positions int64 [T] -> (q [T, heads, head_dim],
    k [T, kv_heads, head_dim]) contiguous in q_gate's dtype, normed and rotated as attention_prologue does one
    token (its precision: the norm rounded as the reference's, RoPE in fp32). One launch, grid (heads +
    kv_heads, T); the gate stays in q_gate (sigmoid_gate_mul takes its view)."""
    t = q_gate.shape[0]
    if q_gate.dim() != 2 or q_gate.shape[1] != num_heads * 2 * head_dim or q_gate.stride(1) != 1:
        raise ValueError(f"q_gate must be [T, {num_heads * 2 * head_dim}] with stride-1 rows, got "
                         f"{tuple(q_gate.shape)}")
    if k.shape != (t, num_kv_heads * head_dim) or k.stride(1) != 1 or k.dtype != q_gate.dtype:
        raise ValueError(f"k must be [{t}, {num_kv_heads * head_dim}] with stride-1 rows in q_gate's dtype, got "
                         f"{k.dtype} {tuple(k.shape)}")
    if positions.shape != (t,) or positions.dtype != torch.int64:
        raise ValueError(f"positions must be int64 [{t}], got {positions.dtype} {tuple(positions.shape)}")
    if rotary_dim % 2 or not 0 <= rotary_dim <= head_dim:
        raise ValueError(f"rotary_dim {rotary_dim} must be even and <= head_dim {head_dim}")
    dev, dtype = q_gate.device, q_gate.dtype
    inv_freq = rope_inv_freq(rotary_dim, float(theta), dev) if rotary_dim else positions.new_zeros(1).float()
    q = torch.empty(t, num_heads, head_dim, device=dev, dtype=dtype)
    k_out = torch.empty(t, num_kv_heads, head_dim, device=dev, dtype=dtype)
    if t:
        attention_prologue_rows_kernel[(num_heads + num_kv_heads, t)](
            q_gate, k, q_norm_w, k_norm_w, inv_freq, positions.contiguous(), exact_out(q), exact_out(k_out), eps,
            num_heads, head_dim, rotary_dim, q_gate.stride(0), k.stride(0), NORM_ROUND=round_code(dtype),
            OUT_BF16=dtype == torch.bfloat16, LIBDEVICE=dev.type == "cuda", BLOCK_D=triton.next_power_of_2(head_dim),
            num_warps=num_warps)
    return q, k_out


def _flat(t: torch.Tensor, numel: int, name: str) -> torch.Tensor:
    if t.numel() != numel or not t.is_contiguous():
        raise ValueError(f"{name} must be a contiguous (stride-1) view of {numel} elements, got {tuple(t.shape)} "
                         f"strides {t.stride()}")
    return t


def attention_prologue(q_gate: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_norm_w: torch.Tensor,
                       k_norm_w: torch.Tensor, position: torch.Tensor, eps: float, num_heads: int,
                       num_kv_heads: int, head_dim: int, rotary_dim: int, theta: float,
                       q_out: torch.Tensor | None = None, k_out: torch.Tensor | None = None,
                       v_out: torch.Tensor | None = None, *, dtype: torch.dtype | None = None,
                       inv_freq: torch.Tensor | None = None, kv_cache: tuple | None = None, num_warps: int = 2):
    """One token. q_gate [heads * 2 * head_dim] (q_proj's output: per head the query, then the gate), k / v
    [kv_heads * head_dim]: contiguous views (any leading 1-dims), e.g. slices of one merged projection output;
    q_norm_w / k_norm_w [head_dim]; position int64 [1] on the device.
    -> (q [heads, head_dim], gate [heads, head_dim], k [kv_heads, head_dim], v [kv_heads, head_dim]) in `dtype`
    (default q_gate.dtype), q and k normed and rotated. gate is a view of q_gate (row stride 2 * head_dim, its
    dtype; sigmoid_gate_mul takes it as it is). v is a view of the input v unless v_out is given or the dtype
    differs (then the kernel copies it). q_out / k_out / v_out: [heads(kv_heads), head_dim] contiguous outputs.
    inv_freq: fp32 [rotary_dim / 2], default rope_inv_freq(rotary_dim, theta, device). No host sync.
    kv_cache: (k_cache, v_cache), each [positions, kv_heads, head_dim] contiguous in `dtype` (a paged cache's
    pages seen as rows: FlashInferAttention.decode_rows): k and v are written at row `position` instead of
    k_out / v_out (the KV write of the step, without its two index_copy kernels); k and v are then returned as
    None."""
    dtype = dtype or (q_out.dtype if q_out is not None else q_gate.dtype)
    if rotary_dim % 2 or not 0 <= rotary_dim <= head_dim:
        raise ValueError(f"rotary_dim {rotary_dim} must be even and <= head_dim {head_dim}")
    _flat(q_gate, num_heads * 2 * head_dim, "q_gate")
    _flat(k, num_kv_heads * head_dim, "k")
    _flat(v, num_kv_heads * head_dim, "v")
    if k.dtype != q_gate.dtype or q_norm_w.dtype != k_norm_w.dtype:
        raise ValueError("q_gate and k (and q_norm_w and k_norm_w) must share a dtype")
    dev = q_gate.device
    if inv_freq is None:
        inv_freq = rope_inv_freq(rotary_dim, float(theta), dev) if rotary_dim else position.new_zeros(1).float()
    q = torch.empty(num_heads, head_dim, device=dev, dtype=dtype) if q_out is None else q_out
    if kv_cache is not None:  # k and v go to row `position` of the caches; q_out is checked below
        k_dst, v_dst = kv_cache
        for name, c in (("k_cache", k_dst), ("v_cache", v_dst)):
            if c.dtype != dtype or c.dim() != 3 or c.shape[1:] != (num_kv_heads, head_dim) or not c.is_contiguous():
                raise ValueError(f"{name} must be [positions, {num_kv_heads}, {head_dim}] contiguous in {dtype}, "
                                 f"got {c.dtype} {tuple(c.shape)}")
        copy_v, outs = True, (("q_out", q, num_heads),)
    else:
        k_dst = torch.empty(num_kv_heads, head_dim, device=dev, dtype=dtype) if k_out is None else k_out
        copy_v = v_out is not None or v.dtype != dtype
        v_dst = v_out if v_out is not None else (
            torch.empty(num_kv_heads, head_dim, device=dev, dtype=dtype) if copy_v else v.view(num_kv_heads, head_dim))
        outs = (("q_out", q, num_heads), ("k_out", k_dst, num_kv_heads), ("v_out", v_dst, num_kv_heads))
    for name, o, heads in outs:
        if o.dtype != dtype or o.shape != (heads, head_dim) or not o.is_contiguous():
            raise ValueError(f"{name} must be [{heads}, {head_dim}] contiguous in {dtype}")
    attention_prologue_kernel[(num_heads + num_kv_heads,)](
        q_gate, k, v, q_norm_w, k_norm_w, inv_freq, position, exact_out(q), exact_out(k_dst), exact_out(v_dst),
        eps, num_heads, head_dim, rotary_dim, num_kv_heads * head_dim if kv_cache is not None else 0,
        COPY_V=copy_v, NORM_ROUND=round_code(q_gate.dtype), OUT_BF16=round_code(dtype) == 1,
        LIBDEVICE=dev.type == "cuda", BLOCK_D=triton.next_power_of_2(head_dim), KV_AT_POS=kv_cache is not None,
        num_warps=num_warps, **pdl_launch(dev))
    gate = q_gate.view(num_heads, 2 * head_dim)[:, head_dim:]
    if kv_cache is not None:
        return q, gate, None, None
    return q, gate, k_dst, v_dst


def attention_prologue_reference(q_gate, k, v, q_norm_w, k_norm_w, position, eps, num_heads, num_kv_heads,
                                 head_dim, rotary_dim, theta):
    """GatedAttention.forward up to backend.attend for T = 1 (in the inputs' dtype) -> (q [heads, hd],
    gate [heads, hd], k [kvh, hd], v [kvh, hd])."""
    qg = q_gate.reshape(1, num_heads, 2 * head_dim)
    q, gate = qg[..., :head_dim], qg[..., head_dim:].reshape(1, -1)
    q = rms_norm_zero_centered(q, q_norm_w, eps)
    k = rms_norm_zero_centered(k.reshape(1, num_kv_heads, head_dim), k_norm_w, eps)
    cos, sin = rope_cos_sin(position.reshape(1), rotary_dim, theta, q_gate.dtype)
    q, k = apply_partial_rope(q, cos, sin), apply_partial_rope(k, cos, sin)
    return q[0], gate.view(num_heads, head_dim), k[0], v.reshape(num_kv_heads, head_dim)
