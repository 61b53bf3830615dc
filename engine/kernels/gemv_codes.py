"""The per-format inner products of gemv_multi: one program's rows times x over one K block, the weight codes
decoded in registers (kernels/gemv_multi.py says why these bit placements, not the house helpers), and the L2
prefetch of a program's rows.

Deterministic: each row's sum has a fixed order, set by the tile shape [BLOCK_N, chunks, CHUNK] alone.
Measured, not kept (docs/RESULTS.md session 14, commit 7afc0d1): the same products as K steps of a
[BLOCK_N, CHUNK] tile summed in registers, with x loaded in the tile's layout, compile to about half the SASS
instructions a code (FP8 in_proj 10.2 -> 4.9) yet run 1.08x (FP8 in_proj, q+k+v) to 3x (the NVFP4 lm_head) slower:
the one-shot 3-D tile keeps a program's whole tile of loads in flight, which is what these GEMVs are bound by.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .decode_norm import _round_as
from .launch import prefetch_l2

_SIGNS = tl.constexpr(-0x7FFF8000)  # 0x80008000 as an int32: the sign bits of both fp16 halves
_MAGS = tl.constexpr(0x0E000E00)  # an E2M1 magnitude (e e m) placed as fp16 exponent bits 11-10, mantissa bit 9


@triton.jit
def _half_lo(h):
    """The low fp16 of an int32 as fp32 (exact)."""
    return h.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _half_hi(h):
    return (h >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _e4m3_halves(word):
    """4 E4M3 codes (bytes b0..b3 of an int32) -> two int32s of fp16 pairs (b0, b2) and (b1, b3), each fp16
    = e4m3 * 2^-8: sign to bit 15, e e e e m m m to bits 13-7 (an E4M3 subnormal lands on an fp16 subnormal)."""
    even = ((word << 8) & _SIGNS) | ((word << 7) & 0x3F803F80)
    odd = (word & _SIGNS) | ((word >> 1) & 0x3F803F80)
    return even, odd


@triton.jit
def _e4m3_scaled(bits):
    """E4M3 codes (int32 tensor of bytes) -> fp32 = e4m3 * 2^-8 through the same fp16 bit placement."""
    return _half_lo(((bits << 8) & 0x8000) | ((bits << 7) & 0x3F80))


@triton.jit
def _e2m1_halves(word, P: tl.constexpr):
    """Nibbles P and P + 4 of an int32 (elements P, P + 4 of its 8 codes) -> an int32 of two fp16 = e2m1 * 2^-14:
    the sign from bit 4P+3 to 15, e e m from bits 4P+2..4P to 11-9 (e == 0: 0.5 * m as an fp16 subnormal)."""
    if P == 3:
        return (word & _SIGNS) | ((word >> 3) & _MAGS)
    else:
        return ((word << (12 - 4 * P)) & _SIGNS) | ((word << (9 - 4 * P)) & _MAGS)


@triton.jit
def x_values(x_ptr, offs, mask, nw_ptr, rstd, NORM: tl.constexpr, ROUND: tl.constexpr):
    """x[offs] in fp32; where NORM, x is the residual and this is the RMS-normed value add_rms_norm would have
    stored, round((x * rstd) * (1 + w[offs])) (decode_norm._add_rms_norm_row's arithmetic, element by element)."""
    v = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if NORM:
        scale = 1.0 + tl.load(nw_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        v = _round_as((v * rstd) * scale, ROUND)
    return v


@triton.jit
def tiles_rstd(sums_ptr, tiles, H, eps, BLOCK_T: tl.constexpr):
    """1 / RMS of a residual from its tiles' sums of squares (parts_norm.py's TILE_SUMS tail), added in this
    launch's fixed order."""
    t = tl.arange(0, BLOCK_T)
    sums = tl.load(sums_ptr + t, mask=t < tiles, other=0.0)
    return tl.rsqrt(tl.sum(sums, axis=0) / H + eps)


@triton.jit
def dense_block(x_ptr, w, rows64, mask_n, k0, K: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
                 CHUNK: tl.constexpr, nw_ptr=None, rstd=None, NORM: tl.constexpr = False, ROUND: tl.constexpr = 0):
    """sum over K block k0 of W[rows] * x for a plain [N, K] weight; tile [BLOCK_N, chunks, CHUNK] as in
    fp8_block."""
    C: tl.constexpr = BLOCK_K // CHUNK
    cols = k0 + (tl.arange(0, C) * CHUNK)[:, None] + tl.arange(0, CHUNK)[None, :]  # [chunks, CHUNK]
    mask_k = cols < K
    ptrs = w + rows64[:, None, None] * K + cols[None, :, :]
    if EVEN_K:
        wt = tl.load(ptrs, mask=mask_n[:, None, None], other=0.0)
    else:
        wt = tl.load(ptrs, mask=mask_n[:, None, None] & mask_k[None, :, :], other=0.0)
    xv = x_values(x_ptr, cols, mask_k, nw_ptr, rstd, NORM, ROUND)
    return tl.sum(tl.sum(wt.to(tl.float32) * xv[None, :, :], axis=1), axis=1)


@triton.jit
def fp8_block(x_ptr, w, rows64, mask_n, k0, K: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
               CHUNK: tl.constexpr, nw_ptr=None, rstd=None, NORM: tl.constexpr = False, ROUND: tl.constexpr = 0):
    """sum over K block k0 of e4m3(W[rows]) * 2^-8 * x; w: the [N, K/4] int32 view of the codes. The block is
    a [BLOCK_N, chunks, CHUNK] tile of words (CHUNK: a warp's 16 B loads across a row), so that the compiler
    gives each thread all chunks of its rows: a row is summed in one thread, then across one warp."""
    C: tl.constexpr = BLOCK_K // 4 // CHUNK
    jx = k0 // 4 + (tl.arange(0, C) * CHUNK)[:, None] + tl.arange(0, CHUNK)[None, :]  # [chunks, CHUNK]
    mask_x = jx < K // 4
    ptrs = w + rows64[:, None, None] * (K // 4) + jx[None, :, :]
    if EVEN_K:
        words = tl.load(ptrs, mask=mask_n[:, None, None], other=0)
    else:
        words = tl.load(ptrs, mask=mask_n[:, None, None] & mask_x[None, :, :], other=0)
    even, odd = _e4m3_halves(words)
    # x as [chunks, CHUNK] loads, broadcast over the rows (a 3D load of x would impose its layout on the tile)
    prod = _half_lo(even) * x_values(x_ptr, 4 * jx, mask_x, nw_ptr, rstd, NORM, ROUND)[None, :, :]
    prod += _half_lo(odd) * x_values(x_ptr, 4 * jx + 1, mask_x, nw_ptr, rstd, NORM, ROUND)[None, :, :]
    prod += _half_hi(even) * x_values(x_ptr, 4 * jx + 2, mask_x, nw_ptr, rstd, NORM, ROUND)[None, :, :]
    prod += _half_hi(odd) * x_values(x_ptr, 4 * jx + 3, mask_x, nw_ptr, rstd, NORM, ROUND)[None, :, :]
    return tl.sum(tl.sum(prod, axis=1), axis=1)


@triton.jit
def nvfp4_block(x_ptr, w, s, rows64, mask_n, k0, K: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
                 CHUNK: tl.constexpr, nw_ptr=None, rstd=None, NORM: tl.constexpr = False, ROUND: tl.constexpr = 0):
    """sum over K block k0 of e2m1(W[rows]) * 2^-14 * block scale * 2^-8 * x; w: the [N, K/16] int64 view of the
    packed codes (one word per scale group), s: the [N, K/16] E4M3 block scale bytes. Tile [BLOCK_N, chunks,
    CHUNK] of groups as in fp8_block."""
    C: tl.constexpr = BLOCK_K // 16 // CHUNK
    g = tl.arange(0, CHUNK)
    grp = k0 // 16 + (tl.arange(0, C) * CHUNK)[:, None] + g[None, :]  # [chunks, CHUNK]
    # The same groups, seen by the compiler as runs of 2 (an int64 pair is one 16 B load): the scale bytes then
    # get the words' layout; as 16 B runs of bytes they would set a layout of 16 groups (256 x values) a thread.
    grp2 = k0 // 16 + (tl.arange(0, C) * CHUNK)[:, None] + ((g // 2) * 2 + g % 2)[None, :]
    mask_g = grp < K // 16
    offs = rows64[:, None, None] * (K // 16) + grp[None, :, :]
    offs2 = rows64[:, None, None] * (K // 16) + grp2[None, :, :]
    if EVEN_K:
        words = tl.load(w + offs, mask=mask_n[:, None, None], other=0)
        scale = tl.load(s + offs2, mask=mask_n[:, None, None], other=0)
    else:
        words = tl.load(w + offs, mask=mask_n[:, None, None] & mask_g[None, :, :], other=0)
        scale = tl.load(s + offs2, mask=mask_n[:, None, None] & mask_g[None, :, :], other=0)
    lo = words.to(tl.int32)  # codes 0-7 of the group
    hi = (words >> 32).to(tl.int32)  # codes 8-15
    xs = 16 * grp
    part = tl.zeros(words.shape, dtype=tl.float32)
    for p in tl.static_range(4):  # one FMA chain of 16 codes per group
        h = _e2m1_halves(lo, p)
        part += _half_lo(h) * x_values(x_ptr, xs + p, mask_g, nw_ptr, rstd, NORM, ROUND)[None, :, :]
        part += _half_hi(h) * x_values(x_ptr, xs + p + 4, mask_g, nw_ptr, rstd, NORM, ROUND)[None, :, :]
        h = _e2m1_halves(hi, p)
        part += _half_lo(h) * x_values(x_ptr, xs + p + 8, mask_g, nw_ptr, rstd, NORM, ROUND)[None, :, :]
        part += _half_hi(h) * x_values(x_ptr, xs + p + 12, mask_g, nw_ptr, rstd, NORM, ROUND)[None, :, :]
    return tl.sum(tl.sum(part * _e4m3_scaled(scale.to(tl.int32)), axis=1), axis=1)


@triton.jit
def line_offsets(rows64, mask_n, ROW_UNITS: tl.constexpr, LINE_UNITS: tl.constexpr, LINES: tl.constexpr):
    """[BLOCK_N, LINES (padded to a power of 2)] offsets, in pointer elements, of every 128 B line of the rows
    (ROW_UNITS elements a row, LINE_UNITS a line); masked rows and padding lines give 0 (the first line: a
    valid address)."""
    line = tl.arange(0, triton.next_power_of_2(LINES))
    ok = mask_n[:, None] & (line < LINES)[None, :]
    return tl.where(ok, rows64[:, None] * ROW_UNITS + (line * LINE_UNITS)[None, :], 0)


@triton.jit
def _prefetch_part(base, rows64, mask_n, ROW_UNITS: tl.constexpr, LINE_UNITS: tl.constexpr,
                   LINES: tl.constexpr, ON: tl.constexpr):
    prefetch_l2(base + line_offsets(rows64, mask_n, ROW_UNITS, LINE_UNITS, LINES), ON)


@triton.jit
def prefetch_rows(w, s, rows64, mask_n, K: tl.constexpr, FMT: tl.constexpr, ON: tl.constexpr):
    """A tile's weight rows (and NVFP4 block scales) asked of L2 where ON (before the PDL wait, or turns ahead).
    w's element type sets the units: bf16 / fp32 elements, FP8 as int32 words of 4 codes or as float8 codes."""
    if ON:
        unit: tl.constexpr = w.dtype.element_ty.primitive_bitwidth // 8
        if FMT == 2:  # int64 words of 16 codes, then the scale bytes
            _prefetch_part(w, rows64, mask_n, K // 16, 16, (K // 2 + 127) // 128, ON)
            _prefetch_part(s, rows64, mask_n, K // 16, 128, (K // 16 + 127) // 128, ON)
        else:
            row_bytes: tl.constexpr = K if FMT == 1 else K * unit  # FP8: a byte a code
            _prefetch_part(w, rows64, mask_n, row_bytes // unit, 128 // unit, (row_bytes + 127) // 128, ON)
