"""expert_gate_up as persistent programs that load the next tile's weights while they compute this one's.

Why: expert_gate_up (one program a (expert, row block) tile, 2,304 programs at the real geometry, about two waves)
takes 9.3 us a layer on the H200. Reading its 10.6 MB alone at that grid takes 4.5 us (docs/RESULTS.md session
14), and its sm_90 code is ~9.9 instructions a code, ~5 us of issue. In each wave every program first waits for
its loads and then computes, so the two phases add up instead of overlapping. The one-wave persistent form of
session 9 (nvfp4_experts_decode.PERSISTENT) had the same serial phases and was 1.07x the step.
Here a program takes the tiles pid, pid + P, ... and issues tile i + 1's weight loads (words, scale bytes, the
globals) before tile i's decode and sums. The routed experts' row ids are loaded once (a [k] vector, picked per
tile in registers), so issuing a tile's loads waits on no load, and x's activations are loaded once.
Each tile's arithmetic is expert_gate_up's (tile_math after tile_loads: rows_step's one K step), so the bytes
are those of one program a tile. Reference: nvfp4_experts_decode.expert_gate_up_reference.
What ptxas makes of it (sm_90, block_n 2, 4 warps: 72 registers): it schedules the next tile's loads after this
tile's decode and FMAs but before its cross-thread sums, SiLU and store, so the look-ahead overlaps those, not
the decode (a CTA barrier between them changed nothing: the FMAs are register work it may hoist past one); the
rest of the overlap is between the SM's resident programs, PROGRAMS_PER_SM of them in different phases.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import device_sms, gdc_prologue, pdl_launch
from .nvfp4_expert_rows import tile_loads, tile_math, x_tiles
from . import nvfp4_experts_decode as experts_decode
from .nvfp4_experts_decode import _block_g, _check, _decode, _matrix, _row_offsets

ON = False  # the fused step's gate/up through this kernel: off until its GPU A/B (profile_decode arm "gustream")
PROGRAMS_PER_SM = 4  # persistent programs an SM: ~4-5 tiles each at the real geometry (2,304 tiles, 132 SMs)


@triton.jit
def _tile_loads(t, tiles, blocks, ids, kk, words_ptr, bytes_ptr, H, I, row_words, gu_scale_at, glob_at,
                xg_w, xg_s, xg_g, xu_w, xu_s, xu_g, w, mask_w, K_ROUTED: tl.constexpr, HAS_EXTRA: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr, MASKED: tl.constexpr, GROUP_SCALES: tl.constexpr):
    """Tile t's loads (past the last tile: the last tile's, never stored): (gate words, gate scale bytes, up
    words, up scale bytes, gate global, up global, rows n, store mask, expert j). gate_up_pointers' pointers,
    the row id picked from the preloaded ids."""
    tt = tl.minimum(t, tiles - 1)
    j = tt // blocks
    n = (tt - j * blocks) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = n < I
    if K_ROUTED > 0:
        e = tl.sum(tl.where(kk == tl.minimum(j, K_ROUTED - 1), ids, 0), axis=0)
    else:  # the shared expert alone: row 0's pointers stand in until replaced below
        e = tl.zeros([], dtype=tl.int64)
    gate_w = words_ptr + e * row_words  # gate rows 0..I-1 of gate_up, up rows I..2I-1
    up_w = gate_w + I * (H // 8)
    gate_s = bytes_ptr + e * row_words * 4 + gu_scale_at
    up_s = gate_s + I * (H // 16)
    g_gate = tl.load(gate_w + glob_at).to(tl.float32, bitcast=True)
    g_up = tl.load(gate_w + glob_at + 1).to(tl.float32, bitcast=True)
    if HAS_EXTRA:
        if j == K_ROUTED:
            gate_w, gate_s, g_gate = xg_w, xg_s, tl.load(xg_g)
            up_w, up_s, g_up = xu_w, xu_s, tl.load(xu_g)
    rows = n.to(tl.int64)
    gw, gs = tile_loads(gate_w, gate_s, rows, mask_n, 0, w, mask_w, H, 2 * BLOCK_G, MASKED, GROUP_SCALES)
    uw, us = tile_loads(up_w, up_s, rows, mask_n, 0, w, mask_w, H, 2 * BLOCK_G, MASKED, GROUP_SCALES)
    return gw, gs, uw, us, g_gate, g_up, n, mask_n & (n * 0 + t < tiles), j  # (a vector compare: the interpreter)


@triton.jit
def _tile_store(gw, gs, uw, us, g_gate, g_up, n, mask, j, xs, act_ptr, I, BLOCK_N: tl.constexpr,
                BLOCK_G: tl.constexpr, DECODE: tl.constexpr, GROUP_SCALES: tl.constexpr):
    """act[j, n] from a tile's loads: rows_step's sums (zeros, then one K step) and _gate_up_rows' tail."""
    acc = tl.zeros([BLOCK_N, BLOCK_G if GROUP_SCALES else 2 * BLOCK_G], dtype=tl.float32)
    acc2 = acc
    acc += tile_math(gw, gs, xs, 2 * BLOCK_G, DECODE, GROUP_SCALES)
    acc2 += tile_math(uw, us, xs, 2 * BLOCK_G, DECODE, GROUP_SCALES)
    gate = tl.sum(acc, axis=1) * (g_gate * 16384.0)  # 2^14: the codes' scaling, exact
    up = tl.sum(acc2, axis=1) * (g_up * 16384.0)
    tl.store(act_ptr + j * I + n, gate / (1.0 + tl.exp(-gate)) * up, mask=mask)


@triton.jit(do_not_specialize=["words_ptr", "bytes_ptr", "row_words"])
def gate_up_stream_kernel(x_ptr, ids_ptr, words_ptr, bytes_ptr, act_ptr, H, I, row_words, gu_scale_at, glob_at,
                          xg_w, xg_s, xg_g, xu_w, xu_s, xu_g, tiles, K_ROUTED: tl.constexpr, KP: tl.constexpr,
                          HAS_EXTRA: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr,
                          MASKED: tl.constexpr, DECODE: tl.constexpr, X_SPLIT: tl.constexpr,
                          GROUP_SCALES: tl.constexpr, USE_GDC: tl.constexpr = False):
    """Program pid of P: tiles pid, pid + P, ... (expert major), each tile's loads issued a turn ahead."""
    gdc_prologue(USE_GDC)  # PDL: nothing is read before the previous kernel ends
    pid, programs = tl.program_id(0), tl.num_programs(0)
    w = tl.arange(0, 2 * BLOCK_G)
    mask_w = w < H // 8
    xs = x_tiles(x_ptr, w, mask_w, 2 * BLOCK_G, MASKED, X_SPLIT)
    kk = tl.arange(0, KP)
    ids = tl.load(ids_ptr + kk, mask=kk < K_ROUTED, other=0).to(tl.int64)
    blocks = tl.cdiv(I, BLOCK_N)
    gw, gs, uw, us, g_gate, g_up, n, mask, j = _tile_loads(
        pid, tiles, blocks, ids, kk, words_ptr, bytes_ptr, H, I, row_words, gu_scale_at, glob_at, xg_w, xg_s, xg_g,
        xu_w, xu_s, xu_g, w, mask_w, K_ROUTED, HAS_EXTRA, BLOCK_N, BLOCK_G, MASKED, GROUP_SCALES)
    for t in range(pid, tiles, programs):
        gw2, gs2, uw2, us2, g_gate2, g_up2, n2, mask2, j2 = _tile_loads(
            t + programs, tiles, blocks, ids, kk, words_ptr, bytes_ptr, H, I, row_words, gu_scale_at, glob_at,
            xg_w, xg_s, xg_g, xu_w, xu_s, xu_g, w, mask_w, K_ROUTED, HAS_EXTRA, BLOCK_N, BLOCK_G, MASKED,
            GROUP_SCALES)
        _tile_store(gw, gs, uw, us, g_gate, g_up, n, mask, j, xs, act_ptr, I, BLOCK_N, BLOCK_G, DECODE,
                    GROUP_SCALES)
        gw, gs, uw, us, g_gate, g_up, n, mask, j = gw2, gs2, uw2, us2, g_gate2, g_up2, n2, mask2, j2


def stream_programs(device: torch.device) -> int:
    """The launch's persistent programs: PROGRAMS_PER_SM an SM (the interpreter: 3, so programs take turns)."""
    if device.type != "cuda":
        return 3
    return device_sms(device) * PROGRAMS_PER_SM


def expert_gate_up_stream(x: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor, hidden: int, inter: int,
                          extra: tuple | None = None, out: torch.Tensor | None = None, *,
                          block_n: int | None = None, num_warps: int | None = None, decode: str | None = None,
                          x_split: bool = True, group_scales: bool = False,
                          programs: int | None = None) -> torch.Tensor:
    """expert_gate_up(x, ids, rows, hidden, inter, extra, out)'s act fp32 [n, I], the same bytes at the same
    block_n / num_warps / x_split / group_scales, the whole row in one K step (hidden <= 4,096), from `programs`
    persistent programs (None: stream_programs). ids: at most 64 routed experts (a register vector). num_warps:
    expert_gate_up's default (None: 4, or 1 with nvfp4_experts_decode.ONE_WARP)."""
    words = _check(rows, hidden, inter)
    k = ids.shape[-1]
    n = k + (extra is not None)
    if n == 0:
        raise ValueError("no expert to run: give routed ids or the shared expert")
    if k > 64 or hidden > 4096:
        raise ValueError(f"the streamed gate/up keeps k <= 64 ids and a whole row of H <= 4096 in registers, got "
                         f"k={k}, H={hidden} (use expert_gate_up)")
    if block_n is None:  # expert_gate_up's defaults
        block_n = 2 if rows.is_cuda else min(64, triton.next_power_of_2(inter))
    if num_warps is None:
        num_warps = 1 if experts_decode.ONE_WARP else 4
    if out is None:
        out = torch.empty(n, inter, device=x.device, dtype=torch.float32)
    gate = up = (words, rows, out)  # unused stand-ins of the right pointer types
    if extra is not None:
        gate, up = _matrix(*extra[:3]), _matrix(*extra[3:])
    bg = _block_g(hidden, None)
    tiles = n * triton.cdiv(inter, block_n)
    programs = min(programs or stream_programs(x.device), tiles)
    off = _row_offsets(hidden, inter)
    gate_up_stream_kernel[(programs,)](
        x.reshape(-1).contiguous(), ids.reshape(-1).contiguous(), words, rows, out, hidden, inter, words.stride(0),
        off["gu_scale_at"], off["glob_at"], *gate, *up, tiles, K_ROUTED=k, KP=triton.next_power_of_2(max(k, 1)),
        HAS_EXTRA=extra is not None, BLOCK_N=block_n, BLOCK_G=bg,
        MASKED=inter % block_n != 0 or (hidden // 16) % bg != 0, DECODE=_decode(decode, rows), X_SPLIT=x_split,
        GROUP_SCALES=group_scales, num_warps=num_warps, **pdl_launch(x.device))
    return out
