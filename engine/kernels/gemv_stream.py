"""The decode GEMVs' weights streamed through shared memory: K steps of a [BLOCK_N, BLOCK_K] tile, STAGES deep.

Why: gemv_multi's one-shot tile issues a program's whole weight tile (in_proj: 16 rows x 2 KB) at once, then
decodes and sums it. Every program of a wave is in the same phase, so an SM's loads and its arithmetic take turns
instead of overlapping. Under the lent H200's Triton (3.6.0) the FP8 in_proj tile is 80 registers and 5.8 SASS
instructions a code with the norm on load (scripts/sass_gemv_multi.py --fp8-cvt --pdl --norm): three 8-warp
programs an SM, ~2.2 us of issue a wave beside ~3 us of its bytes. Two such waves plus a tail is about the
9.3-11 us measured for its 24 MB (6.6 us with the weights in L2: docs/RESULTS.md session 15). Here the K loop is
a `tl.range(..., num_stages=STAGES)`, which Triton's software pipeliner turns into cp.async copies (LDGSTS) into
shared memory STAGES - 1 steps ahead, so a program sums step i while steps i + 1 .. i + STAGES - 1 arrive.
A program is one warp over 8 rows (each lane's 16-byte run of a step, and the x values it normalises, serve 8
rows; 4 rows where 8 would leave fewer than 512 programs), each lane's run summed in registers first. Under
3.6.0: in_proj with its norm 66 registers, 12 KB of shared memory, 5.3 instructions a code (one-shot: 5.8);
out_proj 47 registers at 7 stages, 4.4 (4.9). (Session 14's K steps summed in registers, without the
pipeliner, issued each step's loads after the last step's arithmetic, and lost; 8 warps over 16 rows here cost
11 instructions a code with the norm, x normalised for 2 rows a thread.)

Covers the dense weights and the FP8 codes through the hardware conversion (gemv_multi.FP8_CVT), in GEMVs of at
least MIN_ROWS rows whose K spans two or more steps; other formats keep gemv_multi's tiles. Each thread's
products add up in fp32 across the steps, element by element, then one reduction a row: a fixed order per launch
config (a pure function of format, rows and K), the same bytes in a CUDA graph and eagerly; not gemv_multi's
one-shot order (the bf16 level of it). Reference: gemv_multi.gemv_multi_reference.
"""
from __future__ import annotations

import dataclasses

import triton
import triton.language as tl

from .gemv_codes import x_values

# The fused step's FP8 / dense GEMVs through the streamed tile: off until its GPU A/B (profile_decode arm
# "stream"; its configs swept by scripts/bench_gemv_multi.py --grid stream).
STREAM = False
STEP_BYTES = 512  # weight bytes of one row a K step (FP8: 512 codes; bf16: 256 elements): 16 B a lane of a warp
STAGES = 3  # K steps in flight at the least: the one summed and two copying
IN_FLIGHT = 48 * 1024  # weight bytes an SM keeps copying: more stages where its programs are few (out_proj)
ROWS = 8  # rows a program (each thread's x values serve all of them), fewer where that leaves < TARGET_PROGRAMS
WARPS = 1  # one warp a program: a K step's row is one 16-byte load a lane, nothing reduced across warps
TARGET_PROGRAMS = 512  # as gemv_multi's: ~4 an SM of an H200 at the least
MIN_ROWS = 512  # below this (the router, in_proj_b+a: latency-bound, 1-2 rows a program) the one-shot tile stays


@triton.jit
def stream_block(x_ptr, w, rows64, mask_n, K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 STAGES: tl.constexpr, nw_ptr=None, rstd=None, NORM: tl.constexpr = False,
                 ROUND: tl.constexpr = 0):
    """sum over K of W[rows] * x for a plain [N, K] weight or FP8 codes as float8e4nv elements (their scale
    applied by the caller): K / BLOCK_K steps, pipelined STAGES deep through shared memory; K % BLOCK_K == 0.
    NORM: x is a residual, RMS-normed as it is loaded (gemv_codes.x_values)."""
    VEC: tl.constexpr = 128 // w.dtype.element_ty.primitive_bitwidth  # the elements of a 16-byte load
    acc = tl.zeros([BLOCK_N, BLOCK_K // VEC], dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        cols = k0 + tl.arange(0, BLOCK_K)
        wt = tl.load(w + rows64[:, None] * K + cols[None, :], mask=mask_n[:, None], other=0.0)
        xv = x_values(x_ptr, cols, cols < K, nw_ptr, rstd, NORM, ROUND)
        prod = wt.to(tl.float32) * xv[None, :]
        # each thread's 16-byte run summed in order first (registers), so the accumulator is VEC times smaller
        acc += tl.sum(tl.reshape(prod, [BLOCK_N, BLOCK_K // VEC, VEC]), axis=2)
    return tl.sum(acc, axis=1)


def use_stream(fmt: str, n_total: int, k: int, elem_bytes: int, fp8_cvt: bool, stream: bool | None = None) -> bool:
    """Whether a GEMV streams: asked (None: the switch STREAM) and eligible."""
    return bool((STREAM if stream is None else stream) and eligible(fmt, n_total, k, elem_bytes, fp8_cvt))


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


def stream_config(cfg, fmt: str, n_total: int, k: int, elem_bytes: int, sms: int = 132):
    """gemv_multi's GemvConfig with the streamed K steps: block_k one step, ROWS rows a program (halved while that
    gives fewer than TARGET_PROGRAMS programs) of WARPS warps, and STAGES stages, more (up to the row's steps)
    where an SM's programs (sms: the device's SMs; 132, an H200's, off a GPU) would keep fewer than IN_FLIGHT
    bytes copying. The stages move loads only, not the sums: the bytes do not depend on them."""
    block_n = ROWS
    while block_n > 1 and triton.cdiv(n_total, block_n) < TARGET_PROGRAMS:
        block_n //= 2
    block_k = step_elements(fmt, k, elem_bytes)
    step_bytes = block_n * block_k * (1 if fmt == "fp8" else elem_bytes)
    per_sm = triton.cdiv(triton.cdiv(n_total, block_n), sms)
    stages = min(max(STAGES, triton.cdiv(IN_FLIGHT, per_sm * step_bytes) + 1), k // block_k)
    return dataclasses.replace(cfg, block_n=block_n, block_k=block_k, num_warps=WARPS, warps_k=1, num_stages=stages)
