"""Linears of one input in two storage formats in one launch: GatedDeltaNet's in_proj_qkv + z (FP8 in the
NVFP4 checkpoint) with its in_proj_b + a (BF16) in one GEMV, where gemv_multi (one format a call) takes two.

Why: in_proj_b + a is 64 rows (0.26 MB): its own launch was 1.86 us a layer on the H200, 30 a step (docs/
RESULTS.md, session 9), latency, not bytes. Here its tiles run first in the grid (they start with the first
wave) and the FP8 tiles after them, each part with gemv_multi's own tile code: the FP8 parts with their own
config (the same bytes as gemv_multi's), the second format's parts with theirs but the launch's warps (on a GPU
their sums may be laid out by those warps: an ulp where they are; the interpreter sums in one order, so there
the bytes are gemv_multi's). Reference: gemv_multi of each format (and gemv_multi_reference).
On by default since its GPU A/B (session 10: median 0.992 of the step, five rounds of five faster); the module
switch MIXED, profile_decode arm "no-mixed" to compare.
"""
from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from . import gemv_multi as gm
from .fp8_scaled_mm import fp8_tensor_cores
from .gemv_codes import prefetch_rows, tiles_rstd
from .launch import gdc_prologue, pdl_launch
from .nvfp4_triton import exact_out

MIXED = True  # on: won the paired GPU A/B (docs/RESULTS.md session 10)
MAX_PARTS = 2  # a format's parts in one call (in_proj: qkv + z, b + a)
# The second format's parts in the fewest tiles of <= gemv_multi.MAX_TILE_BYTES (in_proj_b + a: 8 tiles of 8 rows
# instead of 32 of 2). Why: the H200 holds 3 of the launch's programs an SM (256 threads, 80 registers), 396 a
# wave; the FP8 in_proj is 768 tiles and b + a's 32 make 800, 2.02 waves (Nsight Compute, docs/RESULTS.md session
# 18), so 8 programs run in a third wave of their own after the second; with 8 tiles it is 776, two waves. Off
# until its GPU A/B (profile_decode arm "mixedfew"); b + a's sums may be laid out otherwise (an ulp on a GPU).
FEWEST_B_TILES = False


@triton.jit
def gemv_mixed_kernel(x_ptr, out_ptr, a0, a1, sa0, sa1, ga0, ga1, na0, na1, pa1, b0, b1, sb0, sb1, gb0, gb1, nb0,
                      nb1, pb1, tiles_b, rows_a, K: tl.constexpr, OUT_BF16: tl.constexpr,
                      FMT_A: tl.constexpr, PARTS_A: tl.constexpr, BLOCK_N_A: tl.constexpr, BLOCK_K_A: tl.constexpr,
                      CHUNK_A: tl.constexpr, FP8_CVT_A: tl.constexpr,
                      FMT_B: tl.constexpr, PARTS_B: tl.constexpr, BLOCK_N_B: tl.constexpr, BLOCK_K_B: tl.constexpr,
                      CHUNK_B: tl.constexpr, FP8_CVT_B: tl.constexpr, USE_GDC: tl.constexpr = False,
                      sums_ptr=None, nw_ptr=None, sum_tiles=0, eps=0.0, NORM: tl.constexpr = False,
                      ROUND: tl.constexpr = 0, BLOCK_T: tl.constexpr = 1, MMA_A: tl.constexpr = False,
                      MMA_B: tl.constexpr = False, PREFETCH: tl.constexpr = False):
    """Programs 0 .. tiles_b - 1: the second format's tiles (outputs from row rows_a on); the rest the first's.
    NORM: x RMS-normed as it is loaded, as gemv_multi_kernel's. PREFETCH (with PDL): the tile's weight rows
    asked of L2 before the wait, as gemv_multi_kernel's (gemv_multi.WEIGHT_PREFETCH)."""
    pid = tl.program_id(0)
    if pid < tiles_b:
        # (names of their own: Triton wants a variable's type alike in both branches, and the tiles differ)
        wb, sb, gb, rows_b, mask_b, out_b = gm._tile_rows(pid, b0, b1, b0, b0, sb0, sb1, sb0, sb0, gb0, gb1, gb0,
                                                          gb0, nb0, nb1, 0, 0, pb1, tiles_b, tiles_b, PARTS_B,
                                                          BLOCK_N_B)
        prefetch_rows(wb, sb, rows_b, mask_b, K, FMT_B, USE_GDC and PREFETCH)  # weights: no kernel writes them
        gdc_prologue(USE_GDC)  # PDL: x (the previous kernel's output) is read only after this
        rstd_b = tiles_rstd(sums_ptr, sum_tiles, K, eps, BLOCK_T) if NORM else 0.0
        gm._tile_product(x_ptr, out_ptr + rows_a, wb, sb, gb, rows_b, mask_b, out_b, K, FMT_B, BLOCK_N_B,
                         BLOCK_K_B, CHUNK_B, OUT_BF16, FP8_CVT_B, nw_ptr, rstd_b, NORM, ROUND, MMA_B)
    else:
        t = pid - tiles_b
        w, s, g, rows64, mask_n, out_rows = gm._tile_rows(t, a0, a1, a0, a0, sa0, sa1, sa0, sa0, ga0, ga1, ga0,
                                                          ga0, na0, na1, 0, 0, pa1, pa1, pa1, PARTS_A, BLOCK_N_A)
        prefetch_rows(w, s, rows64, mask_n, K, FMT_A, USE_GDC and PREFETCH)
        gdc_prologue(USE_GDC)
        rstd = tiles_rstd(sums_ptr, sum_tiles, K, eps, BLOCK_T) if NORM else 0.0
        gm._tile_product(x_ptr, out_ptr, w, s, g, rows64, mask_n, out_rows, K, FMT_A, BLOCK_N_A, BLOCK_K_A,
                         CHUNK_A, OUT_BF16, FP8_CVT_A, nw_ptr, rstd, NORM, ROUND, MMA_A)


def _side(x: torch.Tensor, parts):
    """(format, K, tensors, rows per part, element bytes) of one format's parts."""
    if not 1 <= len(parts) <= MAX_PARTS:
        raise ValueError(f"gemv_two_formats takes 1 to {MAX_PARTS} weights a format, got {len(parts)}")
    fmt, tensors, k = gm._check(x, parts)
    return fmt, k, tensors, [gm.part_shape(fmt, t)[0] for t in tensors], gm.part_shape(fmt, tensors[0])[1]


def _side_args(fmt: str, tensors: list, fp8_cvt: bool) -> list:
    """The kernel args per part, two slots (the first part's standing in for a missing second)."""
    args = [gm._kernel_args(fmt, t, fp8_cvt) for t in tensors]
    return args + [args[0]] * (MAX_PARTS - len(args))


def fewest_tiles_rows(fmt: str, ns: list[int], block_k: int, elem_bytes: int) -> int:
    """Rows a tile (a power of 2, <= 32) for the fewest tiles over parts of ns rows, a tile's K block within
    gemv_multi.MAX_TILE_BYTES."""
    block_n = min(32, triton.next_power_of_2(max(ns)))
    while block_n > 1 and block_n * gm.row_bytes(fmt, block_k, elem_bytes) > gm.MAX_TILE_BYTES:
        block_n //= 2
    return block_n


def gemv_two_formats(x: torch.Tensor, parts_a, parts_b, out_dtype: torch.dtype | None = None,
                     norm: tuple | None = None) -> torch.Tensor:
    """x [1, K] through parts_a (1-2 weights of one format) then parts_b (1-2 of another), K shared -> y [1,
    sum N] = concat(W_i @ x) in that order, stored as out_dtype (default x.dtype): gemv_multi(x, parts_a) and
    gemv_multi(x, parts_b) side by side, in one launch (the module docstring says which bytes are equal).
    norm: as gemv_multi's (x a residual, normed as it is loaded)."""
    fp8_cvt = gm.FP8_CVT and fp8_tensor_cores(x.device)
    fmt_a, k, tensors_a, ns_a, elem_a = _side(x, parts_a)
    fmt_b, _, tensors_b, ns_b, elem_b = _side(x, parts_b)
    if fmt_a == fmt_b:
        raise ValueError(f"both sides are {fmt_a}: one format a call is gemv_multi's")
    cfg_a = gm.launch_config(fmt_a, sum(ns_a), k, elem_a, x.device)
    cfg_b = dataclasses.replace(gm.launch_config(fmt_b, sum(ns_b), k, elem_b, x.device), num_warps=cfg_a.num_warps)
    cvt_a, cvt_b = fp8_cvt or bool(cfg_a.mma), fp8_cvt or bool(cfg_b.mma)  # the tensor cores take the codes as elements
    args_a, args_b = _side_args(fmt_a, tensors_a, cvt_a), _side_args(fmt_b, tensors_b, cvt_b)
    if FEWEST_B_TILES:
        cfg_b = dataclasses.replace(cfg_b, block_n=fewest_tiles_rows(fmt_b, ns_b, cfg_b.block_k, elem_b))
    out_dtype = out_dtype or x.dtype
    out = torch.empty(1, sum(ns_a) + sum(ns_b), device=x.device, dtype=out_dtype)
    tiles_a = [triton.cdiv(n, cfg_a.block_n) for n in ns_a]
    tiles_b = [triton.cdiv(n, cfg_b.block_n) for n in ns_b]
    pad_n = lambda ns: ns + [0] * (MAX_PARTS - len(ns))  # noqa: E731
    gemv_mixed_kernel[(sum(tiles_a) + sum(tiles_b),)](
        x.reshape(-1).contiguous(), exact_out(out), *(a[0] for a in args_a), *(a[1] for a in args_a),
        *(a[2] for a in args_a), *pad_n(ns_a), tiles_a[0], *(b[0] for b in args_b), *(b[1] for b in args_b),
        *(b[2] for b in args_b), *pad_n(ns_b), tiles_b[0], sum(tiles_b), sum(ns_a), K=k,
        OUT_BF16=out_dtype == torch.bfloat16,
        FMT_A=gm._FMT_ID[fmt_a], PARTS_A=len(ns_a), BLOCK_N_A=cfg_a.block_n, BLOCK_K_A=cfg_a.block_k,
        CHUNK_A=gm.chunk_words(fmt_a, cfg_a, elem_a, cvt_a), FP8_CVT_A=cvt_a and fmt_a == gm.FP8,
        FMT_B=gm._FMT_ID[fmt_b], PARTS_B=len(ns_b), BLOCK_N_B=cfg_b.block_n, BLOCK_K_B=cfg_b.block_k,
        CHUNK_B=gm.chunk_words(fmt_b, cfg_b, elem_b, cvt_b), FP8_CVT_B=cvt_b and fmt_b == gm.FP8,
        MMA_A=cfg_a.mma, MMA_B=cfg_b.mma, PREFETCH=gm.WEIGHT_PREFETCH,
        num_warps=cfg_a.num_warps, num_stages=cfg_a.num_stages, **gm.norm_launch(norm, x, k),
        **pdl_launch(x.device))
    return out
