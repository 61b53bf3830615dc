"""A batch-1 FP8 GEMV tile on the tensor cores: W's E4M3 codes as they are stored, x split into E4M3 terms.

Why: the FP8 projections (GDN in_proj, attention q+k+v; 30 + 10 launches a step, ~400 us of the resident 16K
step) decode each code on the CUDA cores: the hardware conversion to fp16, one to fp32 and an FMA, 5.2 SASS
instructions a code in gemv_multi's FP8 tile under the H200's Triton 3.6.0 (scripts/sass_gemv_multi.py
--fp8-cvt), while Nsight Compute has the GDN in_proj at 43 % of the DRAM peak with the warps waiting on memory
(docs/RESULTS.md session 18). Here the codes go from global memory to shared memory (cp.async, pipelined K
steps) and into the tensor cores' FP8 MMA (wgmma E4M3 on sm_90) untouched: no instruction a code decodes them.
At batch 1 the MMA's N columns are x's: an E4M3 x would lose bits, so x is split into three E4M3 terms,
x = s * (hi + mid / 16 + lo / 256), columns 0..2 of the MMA's [K, 16] operand (the others zeros; they cost the
tensor cores nothing the GPU lacks).

Numbers: s = 2^(e - 7), e the exponent of x's largest |value| (so |x / s| < 256, E4M3's range; exact). Each
term is its residual rounded to E4M3's grid (4 significant bits, quantum >= 2^-9) by fp32 arithmetic, so its
conversion to E4M3 is exact (Triton's interpreter rounds E4M3 wrongly across a binade; no rounding is left to
it), and its residual exactly representable: hi + mid / 16 holds a bf16 x exactly (down to 2^-13 of |x|max,
where E4M3's quantum takes over), lo the next 4 bits of an fp32 x (12 in all): within 2^-12 * |x|max.
The products code x term are exact. The tensor cores add them at their own precision (~14 bits on Hopper's FP8
MMA, the figure DeepSeek-V3 reports), and every 128 codes' sums go into fp32 (PROMOTE). So y is within a few
2^-14 of sum |w x| of the fp32 W x (interpreter: fp32's rounding only): not gemv_multi's bytes, under bf16's
2^-9; deterministic (one order a launch config).

Reference: fp8_mma_reference (the same split in torch, the products and sums in fp64) and gemv_multi_reference
(dequantized weights, F.linear in fp32).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .gemv_codes import x_values

COLUMNS = tl.constexpr(16)  # the MMA's N (Triton's least): x's three terms in columns 0..2, zeros after
# Codes the tensor cores add at their own precision before fp32 takes the sum over (max_num_imprecise_acc): 128,
# the interval DeepSeek-V3 found enough for Hopper's ~14-bit FP8 accumulation (4 wgmma of K 32).
PROMOTE = tl.constexpr(128)


@triton.jit
def round_e4m3_grid(a):
    """a (fp32, |a| < 448) rounded to nearest-even on E4M3's grid: 4 significant bits, no finer than 2^-9 (the
    subnormal quantum); the result converts to E4M3 exactly. By fp32 addition of c = 1.5 * 2^(E + 20), E the
    exponent of |a| (at least -6), which leaves a's bits above 2^(E - 3) in the sum."""
    e = (a.to(tl.int32, bitcast=True) >> 23) & 0xFF
    e = tl.maximum(e, 127 - 6)
    c = (((e + 20) << 23) | 0x400000).to(tl.float32, bitcast=True)
    return (a + c) - c


@triton.jit
def split_e4m3(a):
    """a = x / s (|a| < 256) -> (hi, mid, lo) E4M3 with a ~ hi + mid / 16 + lo / 256 (see the module's Numbers)."""
    hi = round_e4m3_grid(a)
    r = (a - hi) * 16.0
    mid = round_e4m3_grid(r)
    r = (r - mid) * 16.0
    lo = round_e4m3_grid(r)
    return hi.to(tl.float8e4nv), mid.to(tl.float8e4nv), lo.to(tl.float8e4nv)


@triton.jit
def pow2_scale(amax):
    """(s, 1 / s) = 2^(e - 7) and its inverse, e the exponent of amax (> 0; 0 takes e = -100): |x| / s < 256."""
    e = (amax.to(tl.int32, bitcast=True) >> 23) & 0xFF
    e = tl.maximum(e, 27)  # amax 0 or subnormal: any scale serves (all terms 0 or tiny)
    s = ((e - 7) << 23).to(tl.float32, bitcast=True)
    inv = ((254 - e + 7) << 23).to(tl.float32, bitcast=True)
    return s, inv


@triton.jit
def fp8_mma_rows(x_ptr, w, rows64, mask_n, K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 nw_ptr=None, rstd=None, NORM: tl.constexpr = False, ROUND: tl.constexpr = 0,
                 STEP_SCALE: tl.constexpr = False):
    """sum over K of e4m3(W[rows]) * x, fp32 [BLOCK_N] (the per-tensor weight scale not applied); w: the codes as
    float8e4nv elements, [N, K]. x (gemv_codes.x_values: NORM'd as loaded where asked) is read twice: once for
    its largest |value| (the split's scale), once a K step for the MMA's operand. STEP_SCALE: x read once, each
    K step split with its own scale s_k (its own largest |value|), its MMA into a fresh accumulator, times s_k
    into the fp32 sum: no pass over x before the first weights' loads (fp8_mma_reference's block_k)."""
    EVEN_K: tl.constexpr = K % BLOCK_K == 0
    kk = tl.arange(0, BLOCK_K)
    col = tl.arange(0, COLUMNS)[:, None]
    if STEP_SCALE:
        out = _rows_step_scaled(x_ptr, w, rows64, mask_n, K, BLOCK_N, BLOCK_K, EVEN_K, kk, col, nw_ptr, rstd, NORM,
                                ROUND)
    else:
        out = _rows_one_scale(x_ptr, w, rows64, mask_n, K, BLOCK_N, BLOCK_K, EVEN_K, kk, col, nw_ptr, rstd, NORM,
                              ROUND)
    return out


@triton.jit
def _rows_one_scale(x_ptr, w, rows64, mask_n, K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    EVEN_K: tl.constexpr, kk, col, nw_ptr, rstd, NORM: tl.constexpr, ROUND: tl.constexpr):
    """fp8_mma_rows with one scale: a pass over x for its largest |value|, then the K steps into one MMA
    accumulator."""
    amax = tl.zeros([BLOCK_K], dtype=tl.float32)
    for k0 in tl.static_range(0, K, BLOCK_K):
        amax = tl.maximum(amax, tl.abs(x_values(x_ptr, k0 + kk, k0 + kk < K, nw_ptr, rstd, NORM, ROUND)))
    s, inv = pow2_scale(tl.max(amax, axis=0))
    acc = tl.zeros([BLOCK_N, COLUMNS], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + kk
        wt = _codes(w, rows64, mask_n, ks, K, EVEN_K)
        xt = _terms(x_values(x_ptr, ks, ks < K, nw_ptr, rstd, NORM, ROUND) * inv, col, BLOCK_K)
        acc = tl.dot(wt, tl.trans(xt), acc, max_num_imprecise_acc=min(PROMOTE, BLOCK_K))
    return _columns_sum(acc, col) * s


@triton.jit
def _codes(w, rows64, mask_n, ks, K: tl.constexpr, EVEN_K: tl.constexpr):
    """The K step's codes of the tile's rows [BLOCK_N, BLOCK_K] (masked rows, and columns past K, read as 0)."""
    ptrs = w + rows64[:, None] * K + ks[None, :]
    if EVEN_K:
        wt = tl.load(ptrs, mask=mask_n[:, None], other=0.0)
    else:
        wt = tl.load(ptrs, mask=mask_n[:, None] & (ks < K)[None, :], other=0.0)
    return wt


@triton.jit
def _terms(a, col, BLOCK_K: tl.constexpr):
    """The MMA's x operand [COLUMNS, BLOCK_K]: a's three E4M3 terms in rows 0..2, zeros after."""
    hi, mid, lo = split_e4m3(a)
    zero = tl.zeros([COLUMNS, BLOCK_K], dtype=tl.float8e4nv)
    return tl.where(col == 0, hi[None, :], tl.where(col == 1, mid[None, :], tl.where(col == 2, lo[None, :], zero)))


@triton.jit
def _columns_sum(acc, col):
    """The terms' columns added with their weights 1, 1/16, 1/256: [BLOCK_N]."""
    weight = tl.where(col == 0, 1.0, tl.where(col == 1, 0.0625, tl.where(col == 2, 0.00390625, 0.0)))
    return tl.sum(acc * tl.reshape(weight, [1, COLUMNS]), axis=1)


@triton.jit
def _rows_step_scaled(x_ptr, w, rows64, mask_n, K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      EVEN_K: tl.constexpr, kk, col, nw_ptr, rstd, NORM: tl.constexpr, ROUND: tl.constexpr):
    """fp8_mma_rows with STEP_SCALE: sum over the K steps of s_k * (the step's columns), in step order."""
    acc = tl.zeros([BLOCK_N, COLUMNS], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + kk
        wt = _codes(w, rows64, mask_n, ks, K, EVEN_K)
        xv = x_values(x_ptr, ks, ks < K, nw_ptr, rstd, NORM, ROUND)
        s, inv = pow2_scale(tl.max(tl.abs(xv), axis=0))
        step = tl.dot(wt, tl.trans(_terms(xv * inv, col, BLOCK_K)), max_num_imprecise_acc=min(PROMOTE, BLOCK_K))
        acc += step * s  # s a power of 2: exact; the steps added in fp32, in order
    return _columns_sum(acc, col)


def split_reference(x: torch.Tensor) -> tuple[float, torch.Tensor]:
    """fp8_mma_rows' split in torch: (s, terms fp64 [3, K]) with x ~ s * (t0 + t1 / 16 + t2 / 256)."""
    xf = x.double().reshape(-1)
    amax = float(xf.abs().max())
    e = max(int(torch.tensor(amax, dtype=torch.float32).view(torch.int32)) >> 23 & 0xFF, 27)
    s = 2.0 ** (e - 127 - 7)
    a, terms = xf / s, []
    for _ in range(3):
        ex = torch.clamp(torch.frexp(a).exponent - 1, min=-6).double()  # |a| in [2^ex, 2^(ex + 1))
        q = 2.0 ** (ex - 3)
        t = torch.round(a / q) * q  # round half to even, as the fp32 addition does
        terms.append(t)
        a = (a - t) * 16
    return s, torch.stack(terms)


def fp8_mma_reference(codes: torch.Tensor, x: torch.Tensor, block_k: int | None = None) -> torch.Tensor:
    """sum_k e4m3(codes[n, k]) * x_split[k] in fp64: what fp8_mma_rows computes, up to the tensor cores' and
    fp32's rounding of the sums (tests hold it to ~1e-5 relative). block_k: each block of block_k values of x
    split with its own scale (STEP_SCALE's K steps)."""
    flat = x.reshape(-1)
    blocks = [flat] if block_k is None else list(flat.split(block_k))
    xs = []
    for part in blocks:
        s, t = split_reference(part)
        xs.append(s * (t[0] + t[1] / 16 + t[2] / 256))
    return codes.view(torch.float8_e4m3fn).double() @ torch.cat(xs)
