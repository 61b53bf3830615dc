"""The decode GEMVs' weights streamed through shared memory: K steps of a [BLOCK_N, BLOCK_K] tile, STAGES deep.

Why: the FP8 GEMVs of the step (GDN in_proj_qkv+z, attention q+k+v, out_proj / o_proj) are bound by the bytes a
program keeps in flight (docs/RESULTS.md sessions 14-15: in_proj reads its 24 MB in 9.3 us from HBM and in
6.6 us from L2, the same code). gemv_multi's one-shot tile holds a program's whole weight tile in registers
(182 of them for in_proj: one 8-warp program an SM, ~32 KB in flight an SM); session 14's K steps summed in
registers halved the instructions but issued each step's loads after the last step's arithmetic, so fewer bytes
were in flight, and it lost. Here the K loop is a `tl.range(..., num_stages=STAGES)`, which Triton's software
pipeliner turns into cp.async copies (LDGSTS) into shared memory STAGES - 1 steps ahead: the bytes in flight no
longer live in registers (sm_90 code: ~76 registers for in_proj's config, three programs an SM; ~2.5 SASS
instructions a code; scripts/sass_gemv_multi.py --stream), so an SM keeps more of them in flight while it sums.

Covers the dense weights and the FP8 codes through the hardware conversion (gemv_multi.FP8_CVT), wherever K
spans at least two steps; other formats keep gemv_multi's tiles. Each thread's products add up in fp32 across
the steps, element by element, then one reduction a row: a fixed order per launch config (a pure function of
format, rows and K), the same bytes in a CUDA graph and eagerly; not gemv_multi's one-shot order (the bf16
level of it). Reference: gemv_multi.gemv_multi_reference.
"""
from __future__ import annotations

import dataclasses

import triton
import triton.language as tl

from .gemv_codes import x_values

# The fused step's FP8 / dense GEMVs through the streamed tile: off until its GPU A/B (profile_decode arm
# "stream"; its configs swept by scripts/bench_gemv_multi.py --grid stream).
STREAM = False
STEP_BYTES = 512  # weight bytes of one row a K step (FP8: 512 codes; bf16: 256 elements)
STAGES = 3  # K steps in flight: the one summed and two copying
MIN_ROWS = 512  # below this (the router, in_proj_b+a: latency-bound, 1-2 rows a program) the one-shot tile stays


@triton.jit
def stream_block(x_ptr, w, rows64, mask_n, K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 STAGES: tl.constexpr, nw_ptr=None, rstd=None, NORM: tl.constexpr = False,
                 ROUND: tl.constexpr = 0):
    """sum over K of W[rows] * x for a plain [N, K] weight or FP8 codes as float8e4nv elements (their scale
    applied by the caller): K / BLOCK_K steps, pipelined STAGES deep through shared memory; K % BLOCK_K == 0.
    NORM: x is a residual, RMS-normed as it is loaded (gemv_codes.x_values)."""
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        cols = k0 + tl.arange(0, BLOCK_K)
        wt = tl.load(w + rows64[:, None] * K + cols[None, :], mask=mask_n[:, None], other=0.0)
        xv = x_values(x_ptr, cols, cols < K, nw_ptr, rstd, NORM, ROUND)
        acc += wt.to(tl.float32) * xv[None, :]
    return tl.sum(acc, axis=1)


def eligible(fmt: str, n_total: int, k: int, elem_bytes: int, fp8_cvt: bool) -> bool:
    """Whether a GEMV of this format, rows and K streams (the switch aside): dense or hardware-converted FP8
    weights, at least MIN_ROWS rows, and K of at least two steps of a power of two."""
    step = step_elements(fmt, k, elem_bytes)
    return fmt in ("dense", "fp8") and (fmt == "dense" or fp8_cvt) and n_total >= MIN_ROWS and step >= 16 \
        and k % step == 0 and k // step >= 2


def step_elements(fmt: str, k: int, elem_bytes: int) -> int:
    """BLOCK_K: STEP_BYTES of a row (at most half of K), a power of two."""
    per = STEP_BYTES // (1 if fmt == "fp8" else elem_bytes)
    return min(per, triton.next_power_of_2(k) // 2)


def stream_config(cfg, fmt: str, k: int, elem_bytes: int):
    """gemv_multi's GemvConfig with the streamed K steps: block_k one step, num_stages STAGES (rows a program and
    warps as chosen for the one-shot tile)."""
    return dataclasses.replace(cfg, block_k=step_elements(fmt, k, elem_bytes), num_stages=STAGES, warps_k=1)
