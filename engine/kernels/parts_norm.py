"""The next residual add + RMSNorm as the tail of the MoE down projection's launch (expert_down_parts with
norm=): the parts' sum and the new residual by each output tile's last expert program, the norm by the last
tile's.

Why: after the MoE, add_rms_norm(x, parts, next norm) was a launch of one program: 2.55 us a layer on the H200
(40 a step, docs/RESULTS.md session 9). Its work splits in two levels that need no launch of their own:
  1. tile m's k + 1 expert programs count their arrival on the tile's counter; the last adds the tile's parts
     in order 0..k in fp32, rounds once, adds x and rounds (add_rms_norm's arithmetic, element by element:
     the same bytes) and writes the tile of the new residual;
  2. each tile's writer counts on the row's counter; the last reads the whole new residual and runs
     add_rms_norm's row code without a delta (decode_norm._add_rms_norm_row): rstd's sum is laid out by this
     launch's warps, so on a GPU it may be added in another order than the norm kernel's (an ulp of the
     normed output at most where it does; the interpreter sums in one order: there it is byte-equal).
Counters: one int32 per output tile and one for the row (launch.new_counter(device, tiles + 1)), all 0
between launches (each level's last arrival sets its counter back). Only the serial launch (the overlap's
shared expert apart writes its part in another launch) and one program a tile.

TILE_SUMS (expert_down_parts sums=; the switch below): level 1 only, each tile's writer also storing the tile's
sum of squares of the new residual; no serial level 2. The norm is left to the next layer's first GEMV, which
adds the tiles' sums in its own fixed order and normalises x as it loads it (gemv_codes.x_values): no launch and
no one-program tail for the norm (its launch was 0.930x of the step to leave out: docs/RESULTS.md session 15).
Arrivals: the launch's programs a tile (k + 1 serial, k when the shared expert's part came from a launch of its
own, beside the miss copy); the parts summed: always k + 1.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .decode_norm import _add_rms_norm_row, _round_as
from .launch import last_to_arrive
from .nvfp4_triton import _store_exact

FUSED = False  # off until its GPU A/B (profile_decode arm "partsnorm")
# On: the H200 A/B (session 16, profile_decode "fused-pdl,fused-pdl/tilesums", 5 interleaved rounds) made the
# step 0.983x (ratios 0.972-0.991); arm "no-tilesums" compares. The down launch grows 5.33 -> 6.99 us (the
# arrival atomics and tails), the first GEMVs ~0.5-0.9 us (the norm on load), one 3.2 us launch a layer goes.
TILE_SUMS = True
# (Tried: every expert of a tile in one program, the parts added in registers, no arrival tail, nvfp4_down_tiles;
# 0.997x against this launch's 0.977x in the same rounds, removed: docs/RESULTS.md session 27, history 60127d0.)


@triton.jit
def _tile_residual(parts_ptr, x_ptr, new_x_out_ptr, H, tile, KP: tl.constexpr, BLOCK_M: tl.constexpr,
                   ROUND: tl.constexpr):
    """Level 1's work for one tile: the parts added in order, rounded once, plus x, rounded (add_rms_norm's
    arithmetic), stored at new_x_out_ptr; returns (the new residual's tile in fp32, its mask)."""
    m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    mask = m < H
    delta = tl.load(parts_ptr + m, mask=mask, other=0.0)
    for p in tl.static_range(1, KP):  # the parts in order, as add_rms_norm adds a 3-D delta
        delta += tl.load(parts_ptr + p * H + m, mask=mask, other=0.0)
    x = tl.load(x_ptr + m, mask=mask, other=0.0).to(tl.float32)
    x = _round_as(x + _round_as(delta, ROUND), ROUND)
    _store_exact(new_x_out_ptr + m, x, mask, ROUND == 1)
    return x, mask


@triton.jit
def parts_norm_tail(parts_ptr, x_ptr, norm_w_ptr, new_x_out_ptr, new_x_ptr, norm_ptr, counters_ptr, eps, H,
                    tile, tiles, KP: tl.constexpr, BLOCK_M: tl.constexpr, ROUND: tl.constexpr,
                    BLOCK_H: tl.constexpr, FENCE: tl.constexpr, TILE_SUMS: tl.constexpr = False, arrivals=None):
    """After an expert program stored parts[j, tile's outputs]: the two levels above (TILE_SUMS: level 1 and the
    tile's sum of squares at norm_ptr[tile], fp32; arrivals: the programs a tile). new_x_out_ptr: the new
    residual as _store_exact writes it (bf16 as int16 bits); new_x_ptr: the same bytes in their own dtype."""
    if TILE_SUMS:
        if last_to_arrive(counters_ptr + tile, arrivals, FENCE):
            x, mask = _tile_residual(parts_ptr, x_ptr, new_x_out_ptr, H, tile, KP, BLOCK_M, ROUND)
            tl.store(norm_ptr + tile, tl.sum(tl.where(mask, x * x, 0.0), axis=0))
    elif last_to_arrive(counters_ptr + tile, KP, FENCE):
        _tile_residual(parts_ptr, x_ptr, new_x_out_ptr, H, tile, KP, BLOCK_M, ROUND)
        if last_to_arrive(counters_ptr + tiles, tiles, FENCE):
            _add_rms_norm_row(new_x_ptr, new_x_ptr, norm_w_ptr, new_x_ptr, norm_ptr, 0, H, 0, 0, 0, 0, eps, 0,
                              False, ROUND, BLOCK_H, 0)
