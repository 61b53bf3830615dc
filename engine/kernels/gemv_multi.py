"""Batch-1 GEMV over up to 4 weight matrices of one input in ONE launch, for the checkpoint's three formats.

Fuses what the decode step does as separate launches (q/k/v; in_proj_qkv/z; router + shared gate; ...): one
fp32 GEMV per weight (kernels/fp8_triton.fp8_gemv, nvfp4_triton.nvfp4_gemv, F.linear) and a `.to(dtype)` cast
each. Here one kernel reads the weights where they are (no concatenation at load) and writes y = concat(W_i @ x),
accumulated in fp32 and stored once in the output dtype. Reference: `gemv_multi_reference` (dequantize each part
with quant.formats, F.linear in fp32, cat).

Formats: "dense" (bf16/fp16/fp32 [N, K]); "fp8" (E4M3 [N, K], fp32 per-tensor scale), read as int32 words of 4
codes; "nvfp4" (packed [N, K/2], E4M3 block scales [N, K/16], fp32 global scale), read as one int64 word per
16-code scale group, so each block scale is loaded once per 16 codes. Codes are decoded by moving their bits into
fp16 bit patterns, two codes (the two halves of an int32) per shift-and-mask: E4M3 -> fp16 is exact with a 2^-8
factor, E2M1 -> fp16 with 2^-14, subnormals included, and the fp16 -> fp32 conversion is one full-rate op; the
power-of-two factors are undone once per row with the scale. The house helpers `_e4m3` / `_e2m1` spend an exp2
(a special-function unit op, 16/clk/SM) per code, which alone would cap an H200 below its HBM rate (4.8e12 FP8
or 9.6e12 NVFP4 codes/s); `_e4m3_exact` costs ~15 integer ops per block scale. The tile is [BLOCK_N, chunks,
CHUNK] so that the compiler puts a row's chunks in one thread and the warps across rows (a row is reduced
within a warp, x stays in registers for all the thread's rows); the dense path is the same without decoding.

Deterministic: each row is reduced by one program in a fixed order set by the launch config (a pure function of
format, total rows and K: `choose_config`), no atomics, no split-K, no host syncs (graph-capturable).
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .launch import gdc_prologue, pdl_launch, prefetch_l2
from ..quant.formats import dequant_fp8, dequant_nvfp4
from .nvfp4_triton import _store_exact, exact_out

DENSE, FP8, NVFP4 = "dense", "fp8", "nvfp4"
_FMT_ID = {DENSE: 0, FP8: 1, NVFP4: 2}
MAX_PARTS = 4
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
def _dense_block(x_ptr, w, rows64, mask_n, k0, K: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
                 CHUNK: tl.constexpr):
    """sum over K block k0 of W[rows] * x for a plain [N, K] weight; tile [BLOCK_N, chunks, CHUNK] as in
    _fp8_block."""
    C: tl.constexpr = BLOCK_K // CHUNK
    cols = k0 + (tl.arange(0, C) * CHUNK)[:, None] + tl.arange(0, CHUNK)[None, :]  # [chunks, CHUNK]
    mask_k = cols < K
    ptrs = w + rows64[:, None, None] * K + cols[None, :, :]
    if EVEN_K:
        wt = tl.load(ptrs, mask=mask_n[:, None, None], other=0.0)
    else:
        wt = tl.load(ptrs, mask=mask_n[:, None, None] & mask_k[None, :, :], other=0.0)
    xv = tl.load(x_ptr + cols, mask=mask_k, other=0.0).to(tl.float32)
    return tl.sum(tl.sum(wt.to(tl.float32) * xv[None, :, :], axis=1), axis=1)


@triton.jit
def _fp8_block(x_ptr, w, rows64, mask_n, k0, K: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
               CHUNK: tl.constexpr):
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
    prod = _half_lo(even) * tl.load(x_ptr + 4 * jx, mask=mask_x, other=0.0).to(tl.float32)[None, :, :]
    prod += _half_lo(odd) * tl.load(x_ptr + 4 * jx + 1, mask=mask_x, other=0.0).to(tl.float32)[None, :, :]
    prod += _half_hi(even) * tl.load(x_ptr + 4 * jx + 2, mask=mask_x, other=0.0).to(tl.float32)[None, :, :]
    prod += _half_hi(odd) * tl.load(x_ptr + 4 * jx + 3, mask=mask_x, other=0.0).to(tl.float32)[None, :, :]
    return tl.sum(tl.sum(prod, axis=1), axis=1)


@triton.jit
def _nvfp4_block(x_ptr, w, s, rows64, mask_n, k0, K: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
                 CHUNK: tl.constexpr):
    """sum over K block k0 of e2m1(W[rows]) * 2^-14 * block scale * 2^-8 * x; w: the [N, K/16] int64 view of the
    packed codes (one word per scale group), s: the [N, K/16] E4M3 block scale bytes. Tile [BLOCK_N, chunks,
    CHUNK] of groups as in _fp8_block."""
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
    xs = x_ptr + 16 * grp
    part = tl.zeros(words.shape, dtype=tl.float32)
    for p in tl.static_range(4):  # one FMA chain of 16 codes per group
        h = _e2m1_halves(lo, p)
        part += _half_lo(h) * tl.load(xs + p, mask=mask_g, other=0.0).to(tl.float32)[None, :, :]
        part += _half_hi(h) * tl.load(xs + p + 4, mask=mask_g, other=0.0).to(tl.float32)[None, :, :]
        h = _e2m1_halves(hi, p)
        part += _half_lo(h) * tl.load(xs + p + 8, mask=mask_g, other=0.0).to(tl.float32)[None, :, :]
        part += _half_hi(h) * tl.load(xs + p + 12, mask=mask_g, other=0.0).to(tl.float32)[None, :, :]
    return tl.sum(tl.sum(part * _e4m3_scaled(scale.to(tl.int32)), axis=1), axis=1)


@triton.jit
def _line_offsets(rows64, mask_n, ROW_UNITS: tl.constexpr, LINE_UNITS: tl.constexpr, LINES: tl.constexpr):
    """[BLOCK_N, LINES (padded to a power of 2)] offsets, in pointer elements, of every 128 B line of the rows
    (ROW_UNITS elements a row, LINE_UNITS a line); masked rows and padding lines give 0 (the first line: a
    valid address)."""
    line = tl.arange(0, triton.next_power_of_2(LINES))
    ok = mask_n[:, None] & (line < LINES)[None, :]
    return tl.where(ok, rows64[:, None] * ROW_UNITS + (line * LINE_UNITS)[None, :], 0)


@triton.jit
def _prefetch_part(base, rows64, mask_n, ROW_UNITS: tl.constexpr, LINE_UNITS: tl.constexpr,
                   LINES: tl.constexpr, USE_GDC: tl.constexpr):
    prefetch_l2(base + _line_offsets(rows64, mask_n, ROW_UNITS, LINE_UNITS, LINES), USE_GDC)


@triton.jit
def _prefetch_rows(w, s, rows64, mask_n, K: tl.constexpr, FMT: tl.constexpr, USE_GDC: tl.constexpr):
    """The program's weight rows (and NVFP4 block scales) into L2 ahead of the wait (PDL only)."""
    if USE_GDC:
        if FMT == 0:
            unit: tl.constexpr = w.dtype.element_ty.primitive_bitwidth // 8
            _prefetch_part(w, rows64, mask_n, K, 128 // unit, (K * unit + 127) // 128, USE_GDC)
        elif FMT == 1:  # int32 words of 4 codes
            _prefetch_part(w, rows64, mask_n, K // 4, 32, (K + 127) // 128, USE_GDC)
        else:  # int64 words of 16 codes, then the scale bytes
            _prefetch_part(w, rows64, mask_n, K // 16, 16, (K // 2 + 127) // 128, USE_GDC)
            _prefetch_part(s, rows64, mask_n, K // 16, 128, (K // 16 + 127) // 128, USE_GDC)


@triton.jit
def gemv_multi_kernel(x_ptr, out_ptr, w0, w1, w2, w3, s0, s1, s2, s3, g0, g1, g2, g3, n0, n1, n2, n3, p1, p2, p3,
                      K: tl.constexpr, FMT: tl.constexpr, PARTS: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, CHUNK: tl.constexpr, OUT_BF16: tl.constexpr,
                      USE_GDC: tl.constexpr = False, PREFETCH: tl.constexpr = False):
    """Part i (n_i rows, weight w_i, scales s_i / g_i) owns the programs p_i .. p_{i+1} - 1 (p_0 = 0) and output
    rows n_0 + .. + n_{i-1} onwards. Parts beyond PARTS are never read (the wrapper passes part 0 there)."""
    pid = tl.program_id(0)
    w, s, g, n, local, row0 = w0, s0, g0, n0, pid, 0
    if PARTS > 1:
        take = pid >= p1
        w, s, g, n = tl.where(take, w1, w), tl.where(take, s1, s), tl.where(take, g1, g), tl.where(take, n1, n)
        local, row0 = tl.where(take, pid - p1, local), tl.where(take, n0, row0)
    if PARTS > 2:
        take = pid >= p2
        w, s, g, n = tl.where(take, w2, w), tl.where(take, s2, s), tl.where(take, g2, g), tl.where(take, n2, n)
        local, row0 = tl.where(take, pid - p2, local), tl.where(take, n0 + n1, row0)
    if PARTS > 3:
        take = pid >= p3
        w, s, g, n = tl.where(take, w3, w), tl.where(take, s3, s), tl.where(take, g3, g), tl.where(take, n3, n)
        local, row0 = tl.where(take, pid - p3, local), tl.where(take, n0 + n1 + n2, row0)
    rows = local * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = rows < n
    rows64 = rows.to(tl.int64)
    # The weights are never written during decode: their lines are asked of L2 before the wait, so that with
    # programmatic launch they stream in while the previous kernel (often a one-program norm) still runs.
    _prefetch_rows(w, s, rows64, mask_n, K, FMT, USE_GDC and PREFETCH)
    gdc_prologue(USE_GDC)  # PDL: x (the previous kernel's output) is read only after this
    EVEN_K: tl.constexpr = K % BLOCK_K == 0
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k0 in tl.static_range(0, K, BLOCK_K):  # one block where K <= BLOCK_K; unrolled otherwise (K/BLOCK_K small)
        if FMT == 0:
            acc += _dense_block(x_ptr, w, rows64, mask_n, k0, K, BLOCK_K, EVEN_K, CHUNK)
        elif FMT == 1:
            acc += _fp8_block(x_ptr, w, rows64, mask_n, k0, K, BLOCK_K, EVEN_K, CHUNK)
        else:
            acc += _nvfp4_block(x_ptr, w, s, rows64, mask_n, k0, K, BLOCK_K, EVEN_K, CHUNK)
    if FMT == 1:
        acc = acc * (tl.load(s).to(tl.float32) * 256.0)  # undo the decode's 2^-8
    elif FMT == 2:
        acc = acc * (tl.load(g).to(tl.float32) * 4194304.0)  # undo the decodes' 2^-14 and 2^-8
    _store_exact(out_ptr + row0 + rows, acc, mask_n, OUT_BF16)


@dataclasses.dataclass(frozen=True)
class GemvConfig:
    block_n: int  # rows per program (a power of 2)
    block_k: int  # K elements per block (a power of 2, >= 16); the whole row where K <= 4096
    num_warps: int
    warps_k: int = 1  # warps across a row (1: each row is reduced within one warp, no shared memory)
    num_stages: int = 1  # the K blocks are unrolled (K is a compile-time constant): nothing to pipeline


# The L2 prefetch of the weights ahead of the programmatic-launch wait (PDL only): off until the A/B on a GPU
# (scripts/profile_decode.py arm "fused-pdl/prefetch") shows it faster. Not an engine option: it changes no byte.
WEIGHT_PREFETCH = False
TARGET_PROGRAMS = 512  # ~4 per SM of an H200, so the last wave is a small part of the launch
MAX_TILE_BYTES = 32 * 1024  # weight bytes per program and K block: <= 128 B (8 x 16 B loads) a thread at 8 warps
BYTES_PER_THREAD = 128
MAX_BLOCK_K = 4096
X_PER_THREAD = 64  # x values a thread keeps in registers (its columns of the K block); more warps across a row past it
# FP8: 32 (two warps across a 2048 row). The H200 sweep (scripts/bench_gemv_multi.py, docs/RESULTS.md session 6):
# in_proj_qkv+z 11.8 -> 10.9 us, attention q+k+v 10.5 -> 9.1 us with warps_k 2.
X_PER_THREAD_FP8 = 32
MAX_WARPS_K = 2
CODES_PER_WORD = {FP8: 4, NVFP4: 16}  # an int32 word of 4 E4M3 codes; an int64 word of 16 E2M1 codes


def row_bytes(fmt: str, k: int, elem_bytes: int = 2) -> int:
    """Weight bytes of one row of K elements (NVFP4 with its block scales)."""
    return {DENSE: k * elem_bytes, FP8: k, NVFP4: k // 2 + k // 16}[fmt]


def choose_config(fmt: str, n_total: int, k: int, elem_bytes: int = 2) -> GemvConfig:
    """The launch config, a pure function of (format, total rows, K): the whole row per program up to K 4096;
    the most rows per program that keeps >= TARGET_PROGRAMS programs (one row each where even that is too
    few: the small latency-bound linears) and a tile of <= MAX_TILE_BYTES; warps for ~BYTES_PER_THREAD each,
    and 2 warps across a row where one would hold more than X_PER_THREAD x values a thread (FP8: 32). A small
    plain linear (fewer rows than TARGET_PROGRAMS: the router, in_proj_b+a) takes 2 rows and 2 warps a program
    (2.6 -> 2.3 and 2.4 -> 2.1 us on the H200: latency-bound, more loads in flight per program)."""
    if fmt not in _FMT_ID:
        raise ValueError(f"no GEMV for format {fmt!r} (known: {', '.join(_FMT_ID)})")
    block_k = min(max(16, triton.next_power_of_2(k)), MAX_BLOCK_K)
    tile_row = row_bytes(fmt, block_k, elem_bytes)
    block_n = 1
    while (block_n < 32 and triton.cdiv(n_total, 2 * block_n) >= TARGET_PROGRAMS
           and 2 * block_n * tile_row <= MAX_TILE_BYTES):
        block_n *= 2
    if fmt == DENSE and block_n == 1 and n_total >= 2 and triton.cdiv(n_total, 2) < TARGET_PROGRAMS:
        block_n = 2
    warps_k = max(1, min(MAX_WARPS_K, block_k // (32 * (X_PER_THREAD_FP8 if fmt == FP8 else X_PER_THREAD))))
    warps = warps_k
    while warps < min(8, block_n * warps_k) and 2 * warps * 32 * BYTES_PER_THREAD <= block_n * tile_row:
        warps *= 2
    return GemvConfig(block_n, block_k, warps, warps_k)


def chunk_words(fmt: str, cfg: GemvConfig, elem_bytes: int = 2) -> int:
    """The kernel's CHUNK: the words (int32 / int64 / elements) that warps_k warps load across a row in one
    16 B load per thread, at most the block's words."""
    word_bytes = {FP8: 4, NVFP4: 8}.get(fmt, elem_bytes)
    words = cfg.block_k // CODES_PER_WORD.get(fmt, 1)
    return min(words, 32 * (16 // word_bytes) * cfg.warps_k)


def _part(p) -> tuple[str, object, int]:
    """(format, plain weight or tensors dict, K) of a plain tensor, a QuantLinear or its `.tensors` dict."""
    t = getattr(p, "tensors", p)
    if isinstance(t, torch.Tensor):
        return DENSE, t, t.shape[1]
    w = t["weight"]
    if "weight_scale_2" in t:
        return NVFP4, t, w.shape[1] * 2
    return FP8, t, w.shape[1]


def _kernel_args(fmt: str, t) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(weight words, scale, global scale) as the kernel reads them; views, no copies for contiguous tensors."""
    if fmt == DENSE:
        w = t.contiguous()
        return w, w, w  # no scales: part 0's pointers stand in (never read)
    if fmt == FP8:
        s = t["weight_scale"].reshape(1)
        s = s if s.dtype == torch.float32 else s.float()
        return t["weight"].contiguous().view(torch.uint8).view(torch.int32), s, s
    g = t["weight_scale_2"].reshape(1)
    g = g if g.dtype == torch.float32 else g.float()
    return t["weight"].contiguous().view(torch.int64), t["weight_scale"].contiguous().view(torch.uint8), g


def _check(x: torch.Tensor, parts) -> tuple[str, list, int]:
    if not 1 <= len(parts) <= MAX_PARTS:
        raise ValueError(f"gemv_multi takes 1 to {MAX_PARTS} weights, got {len(parts)}")
    infos = [_part(p) for p in parts]
    fmts, ks = {i[0] for i in infos}, {i[2] for i in infos}
    if len(fmts) > 1:
        raise ValueError(f"gemv_multi needs one weight format per call, got {sorted(fmts)}")
    fmt = fmts.pop()
    if len(ks) > 1:
        raise ValueError(f"gemv_multi needs the same K for every weight, got {sorted(ks)}")
    k = ks.pop()
    if x.numel() != k:
        raise ValueError(f"x has {x.numel()} elements, the weights take K = {k}")
    if fmt == DENSE and len({i[1].dtype for i in infos}) > 1:
        raise ValueError("gemv_multi needs one dtype for the dense weights of a call")
    if fmt == FP8 and k % 4:
        raise ValueError(f"the FP8 GEMV reads 4 codes per word: K must be a multiple of 4, got {k}")
    if fmt == NVFP4 and k % 16:
        raise ValueError(f"NVFP4 needs K to be a multiple of 16, got {k}")
    return fmt, [i[1] for i in infos], k


def gemv_multi(x: torch.Tensor, parts, out: torch.Tensor | None = None, out_dtype: torch.dtype | None = None, *,
               block_n: int | None = None, block_k: int | None = None, num_warps: int | None = None,
               warps_k: int | None = None, num_stages: int | None = None) -> torch.Tensor:
    """x [1, K] or [K] (bf16/fp16/fp32); parts: 1..4 weights of one format sharing K (plain [N_i, K] tensors,
    QuantLinears, or their `.tensors` dicts) -> y [1, sum N_i] = concat(W_i @ x), fp32 accumulation, stored
    once as out_dtype (default x.dtype). out: an optional contiguous [1, sum N_i] (or [sum N_i]) tensor to write.
    One launch; config keywords override choose_config(format, sum N_i, K) one by one."""
    fmt, tensors, k = _check(x, parts)
    args = [_kernel_args(fmt, t) for t in tensors]
    ns = [a[0].shape[0] for a in args]
    n_total = sum(ns)
    elem = args[0][0].element_size() if fmt == DENSE else 2
    overrides = dict(block_n=block_n, block_k=block_k, num_warps=num_warps, warps_k=warps_k, num_stages=num_stages)
    cfg = dataclasses.replace(choose_config(fmt, n_total, k, elem),
                              **{name: v for name, v in overrides.items() if v is not None})
    if any(v < 1 or v & (v - 1) for v in (cfg.block_n, cfg.block_k, cfg.warps_k)) or cfg.block_k < 16:
        raise ValueError(f"block_n, block_k and warps_k must be powers of 2, block_k >= 16: {cfg}")
    out_dtype = out_dtype or (out.dtype if out is not None else x.dtype)
    if out is None:
        out = torch.empty(1, n_total, device=x.device, dtype=out_dtype)
    elif out.numel() != n_total or out.dtype != out_dtype or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous {out_dtype} tensor of {n_total} elements")
    programs = [triton.cdiv(n, cfg.block_n) for n in ns]
    starts = [sum(programs[:i]) for i in range(1, MAX_PARTS)]
    pad = MAX_PARTS - len(args)
    ws, ss, gs = ([a[j] for a in args] + [args[0][j]] * pad for j in range(3))
    gemv_multi_kernel[(sum(programs),)](
        x.reshape(-1).contiguous(), exact_out(out), *ws, *ss, *gs, *(ns + [0] * pad), *starts,
        K=k, FMT=_FMT_ID[fmt], PARTS=len(args), BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        CHUNK=chunk_words(fmt, cfg, elem), PREFETCH=WEIGHT_PREFETCH,
        OUT_BF16=out_dtype == torch.bfloat16, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **pdl_launch(x.device))
    return out


def gemv(x: torch.Tensor, weight, out: torch.Tensor | None = None, out_dtype: torch.dtype | None = None,
         **config) -> torch.Tensor:
    """One linear (a plain [N, K] tensor, a QuantLinear or its tensors dict) of x [1, K] / [K] -> [1, N] through
    the same kernel (the lm_head, o_proj / out_proj, the shared expert's down_proj)."""
    return gemv_multi(x, [weight], out, out_dtype, **config)


def dequantize_part(p) -> torch.Tensor:
    """A weight as fp32 [N, K] by quant.formats (the reference's dequantization)."""
    fmt, t, _ = _part(p)
    if fmt == DENSE:
        return t.float()
    if fmt == FP8:
        return dequant_fp8(t["weight"], t["weight_scale"])
    return dequant_nvfp4(t["weight"], t["weight_scale"], t["weight_scale_2"])


def gemv_multi_reference(x: torch.Tensor, parts, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Torch reference: each part dequantized to fp32, F.linear in fp32, concatenated, cast once."""
    xf = x.reshape(1, -1).float()
    y = torch.cat([F.linear(xf, dequantize_part(p)) for p in parts], dim=-1)
    return y.to(out_dtype or x.dtype)
