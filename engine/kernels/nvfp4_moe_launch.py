"""The batch-1 NVFP4 MoE's gate/up and down projections in one launch (expert_gate_up, then expert_down_parts).

Why: the two were separate launches, so each layer paid one launch's ramp and drain between them (~3 us of the
step a launch on the H200, docs/RESULTS.md session 15), and the down programs could read none of their weights
until the last gate/up program had finished. Here one 1-D launch holds both kinds of program:
  - a gate/up program does expert_gate_up's work for one (expert j, row block) and then counts itself on
    ready[j] (its act stores made visible first: a fence, a CTA barrier, a release atomic);
  - a down program loads its expert's weight tile (which depends on nothing of this launch) first, then waits
    until ready[j] counts every gate/up program of expert j (an acquire atomic, then a fence), then reads
    act[j] and does expert_down_parts' work for one (output tile, expert), with its sums= / tail as there.
So the down weights stream while the gate/up programs still run, and one launch boundary goes.

Forward progress: a down program spins, so it must never hold an SM slot that an unstarted gate/up program
needs. CUDA does not promise to start a grid's blocks in index order, so no program trusts its index: each
takes a ticket (an atomic counter) at its start, and the tickets hand out every gate/up item before any down
item. A spinning down program therefore only waits on gate/up items already held by running programs.
Expert j's last down program past its wait (done[j]) sets ready[j] and done[j] back to 0 for the next launch (a
graph replay), and the program with the last ticket the ticket; counters: launch.new_counter(device, 2 n + 1).

The same arithmetic as the two launches, program for program (the same helpers; the down weights are only
loaded earlier): byte-equal to expert_gate_up then expert_down_parts at the same num_warps (in Triton's
interpreter any num_warps). Reference: gate_up's and down_parts' references in turn.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .decode_norm import round_code
from .launch import gdc_prologue, pdl_launch
from .nvfp4_expert_rows import tile_loads, tile_math, x_tiles
from .nvfp4_experts_decode import (_block_g, _check, _decode, _gate_up_rows, _matrix, _row_offsets,
                                   expert_gate_up_reference)
from .nvfp4_experts_parts import BLOCK_M, _sums_tail, expert_down_parts_reference
from .nvfp4_triton import exact_out
from .parts_norm import parts_norm_tail

ONE_LAUNCH = False  # off until its GPU A/B (profile_decode arm "onelaunch")
# Work items by ticket (safe whatever order the blocks start in). Off: by program index, which relies on the
# hardware starting a grid's blocks in index order (true on NVIDIA GPUs in practice, not promised): the A/B arm
# "onelaunch+no-moetickets" measures what the 3,456 atomics on one counter cost (session 16: the ticketed launch
# took 21.2 us a layer against 9.3 + 6.9 for the two launches).
TICKETS = True
MAX_HIDDEN, MAX_INTER = 4096, 1024  # both kinds of program decode a whole row in one K step (registers)


def counters_needed(experts: int) -> int:
    """The int32 counters (launch.new_counter) of a launch over `experts` experts (routed + shared)."""
    return 2 * experts + 1


def fits(hidden: int, inter: int) -> bool:
    """Whether expert_moe takes this geometry (else the two launches)."""
    return hidden <= MAX_HIDDEN and inter <= MAX_INTER


@triton.jit
def _fence(FENCE: tl.constexpr):
    if FENCE:
        tl.inline_asm_elementwise("fence.acq_rel.gpu; mov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False,
                                  pack=1)


@triton.jit
def _backoff(ON: tl.constexpr):
    if ON:
        tl.inline_asm_elementwise("nanosleep.u32 100; mov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False,
                                  pack=1)


@triton.jit
def _down_item(act_ptr, wts_ptr, ids_ptr, words_ptr, bytes_ptr, parts_ptr, H, I, row_words, dn_at, dn_scale_at,
               glob_at, xd_w, xd_s, xd_g, extra_scale_ptr, ready_ptr, done_ptr, x_ptr, new_x_out_ptr,
               sums_ptr, sums_counters_ptr, j, tile, tiles, gate_up_blocks, K_ROUTED: tl.constexpr,
               HAS_EXTRA: tl.constexpr, HAS_EXTRA_SCALE: tl.constexpr, N_DOWN: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_G: tl.constexpr, MASKED: tl.constexpr, DECODE: tl.constexpr, X_SPLIT: tl.constexpr,
               GROUP_SCALES: tl.constexpr, TILE_SUMS: tl.constexpr, ROUND: tl.constexpr, FENCE: tl.constexpr,
               WAIT: tl.constexpr):
    """parts[j, tile's outputs] as expert_down_parts' program (tile, j) computes them (routed_down / extra_down
    in one K step), its weights loaded before the wait for act[j]."""
    m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = m < H
    w = tl.arange(0, 2 * BLOCK_G)
    mask_w = w < I // 8
    if j < K_ROUTED:
        e = tl.load(ids_ptr + j).to(tl.int64)
        base = words_ptr + e * row_words
        words, sc = tile_loads(base + dn_at, bytes_ptr + e * row_words * 4 + dn_scale_at, m, mask_m, 0, w, mask_w,
                               I, 2 * BLOCK_G, MASKED, GROUP_SCALES)
        y_scale = tl.load(wts_ptr + j).to(tl.float32) * (tl.load(base + glob_at + 2).to(tl.float32, bitcast=True)
                                                         * 16384.0)
    else:
        words, sc = tile_loads(xd_w, xd_s, m, mask_m, 0, w, mask_w, I, 2 * BLOCK_G, MASKED, GROUP_SCALES)
        y_scale = tl.load(xd_g) * 16384.0
        if HAS_EXTRA_SCALE:
            y_scale = tl.load(extra_scale_ptr).to(tl.float32) * y_scale
    # Wait for every gate/up program of expert j (their act stores visible: release on their side).
    if WAIT:
        while tl.atomic_add(ready_ptr + j, 0, sem="acquire", scope="gpu") < gate_up_blocks:
            _backoff(FENCE)  # fewer polls of the counter the gate/up programs are adding to
        _fence(FENCE)
    xs = x_tiles(act_ptr + j * I, w, mask_w, 2 * BLOCK_G, MASKED, X_SPLIT)
    acc = tl.zeros([BLOCK_M, BLOCK_G if GROUP_SCALES else 2 * BLOCK_G], dtype=tl.float32)
    acc += tile_math(words, sc, xs, 2 * BLOCK_G, DECODE, GROUP_SCALES)  # rows_part's one K step
    tl.store(parts_ptr + j * H + m, tl.sum(acc, axis=1) * y_scale, mask=mask_m)
    # Expert j's last down program past its wait sets j's counters back (all of j's gate/up programs counted).
    if tl.atomic_add(done_ptr + j, 1, sem="relaxed", scope="gpu") == tiles - 1:
        tl.atomic_xchg(ready_ptr + j, 0, sem="relaxed", scope="gpu")
        tl.atomic_xchg(done_ptr + j, 0, sem="relaxed", scope="gpu")
    if TILE_SUMS:
        parts_norm_tail(parts_ptr, x_ptr, x_ptr, new_x_out_ptr, x_ptr, sums_ptr, sums_counters_ptr, 0.0, H, tile,
                        tiles, K_ROUTED + 1, BLOCK_M, ROUND, 16, FENCE, True, N_DOWN)


@triton.jit(do_not_specialize=["words_ptr", "bytes_ptr", "row_words"])
def expert_moe_kernel(x_ptr, ids_ptr, wts_ptr, words_ptr, bytes_ptr, act_ptr, parts_ptr, H, I, row_words,
                      gu_scale_at, glob_at, dn_at, dn_scale_at, xg_w, xg_s, xg_g, xu_w, xu_s, xu_g, xd_w, xd_s,
                      xd_g, extra_scale_ptr, counters_ptr, res_ptr, new_x_out_ptr, sums_ptr, sums_counters_ptr,
                      K_ROUTED: tl.constexpr, HAS_EXTRA: tl.constexpr, HAS_EXTRA_SCALE: tl.constexpr,
                      N_GATE_UP: tl.constexpr, N_DOWN: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_G_GU: tl.constexpr, MASKED_GU: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_G_DN: tl.constexpr, MASKED_DN: tl.constexpr, DECODE: tl.constexpr,
                      X_SPLIT: tl.constexpr, GROUP_SCALES_GU: tl.constexpr, GROUP_SCALES_DN: tl.constexpr,
                      TILE_SUMS: tl.constexpr = False, ROUND: tl.constexpr = 0, FENCE: tl.constexpr = False,
                      USE_GDC: tl.constexpr = False, WAIT: tl.constexpr = True, STALL_US: tl.constexpr = 0,
                      TICKETS: tl.constexpr = True):
    """A 1-D grid of N_GATE_UP * blocks + N_DOWN * tiles programs; each takes the work item of its ticket.
    counters_ptr: ready[N_GATE_UP] (gate/up programs counted per expert), done[N_GATE_UP] (down programs past
    their wait), then the ticket. TICKETS False: a program's item is its index (see the module's note).
    WAIT False / STALL_US (the ordering test's negative control only): no wait; each gate/up program sleeps first."""
    gdc_prologue(USE_GDC)  # PDL: nothing is read before the previous kernel ends
    ready_ptr = counters_ptr
    done_ptr = counters_ptr + N_GATE_UP
    ticket_ptr = done_ptr + N_GATE_UP
    blocks = tl.cdiv(I, BLOCK_N)
    tiles = tl.cdiv(H, BLOCK_M)
    gate_up_items = N_GATE_UP * blocks
    if TICKETS:
        t = tl.atomic_add(ticket_ptr, 1, sem="relaxed", scope="gpu")
        if t == gate_up_items + N_DOWN * tiles - 1:  # the last ticket: every program has one
            tl.atomic_xchg(ticket_ptr, 0, sem="relaxed", scope="gpu")
    else:
        t = tl.program_id(0)
    if t < gate_up_items:
        j = t // blocks
        n = (t - j * blocks) * BLOCK_N + tl.arange(0, BLOCK_N)
        for _ in tl.static_range(STALL_US):
            tl.inline_asm_elementwise("nanosleep.u32 1000; mov.u32 $0, 0;", "=r", [], dtype=tl.int32,
                                      is_pure=False, pack=1)
        _gate_up_rows(x_ptr, x_ptr, x_ptr, x_ptr, ids_ptr, words_ptr, bytes_ptr, act_ptr, H, I, row_words,
                      gu_scale_at, glob_at, xg_w, xg_s, xg_g, xu_w, xu_s, xu_g, j, n, K_ROUTED, HAS_EXTRA,
                      BLOCK_G_GU, MASKED_GU, DECODE, X_SPLIT, GROUP_SCALES_GU, False)
        _fence(FENCE)  # this thread's act stores before the CTA's release below
        tl.debug_barrier()
        tl.atomic_add(ready_ptr + j, 1, sem="release", scope="gpu")
    else:
        d = t - gate_up_items
        j = d // tiles
        _down_item(act_ptr, wts_ptr, ids_ptr, words_ptr, bytes_ptr, parts_ptr, H, I, row_words, dn_at,
                   dn_scale_at, glob_at, xd_w, xd_s, xd_g, extra_scale_ptr, ready_ptr, done_ptr,
                   res_ptr, new_x_out_ptr, sums_ptr, sums_counters_ptr, j, d - j * tiles, tiles, blocks,
                   K_ROUTED, HAS_EXTRA, HAS_EXTRA_SCALE, N_DOWN, BLOCK_M, BLOCK_G_DN, MASKED_DN,
                   DECODE, X_SPLIT, GROUP_SCALES_DN, TILE_SUMS, ROUND, FENCE, WAIT)


def expert_moe(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor, hidden: int,
               inter: int, counters: torch.Tensor, gate_up_extra: tuple | None = None,
               down_extra: tuple | None = None, extra_scale: torch.Tensor | None = None,
               out: torch.Tensor | None = None, *, write_shared: bool = True, sums: tuple | None = None,
               block_n: int | None = None, block_m: int = BLOCK_M, num_warps: int = 4,
               decode: str | None = None, wait: bool = True, stall_us: int = 0):
    """expert_gate_up(x, ids, rows, hidden, inter, gate_up_extra) then expert_down_parts(act, weights, ids, rows,
    hidden, inter, down_extra, extra_scale, out, write_shared=, sums=) in one launch: fp32 parts [k + 1, 1, H],
    or with sums = (x residual [1, H], launch.new_counter(device, H / block_m)) (new_x, tile sums).
    gate_up_extra (the shared expert's gate + up triples) and down_extra come together or not at all; with
    write_shared=False the shared row of `out` is left to the caller (the overlap's split). counters:
    launch.new_counter(device, counters_needed(n)), n = k + 1 with the shared expert, else k; one set a call
    site.
    Both kinds of program decode the rows in one K step (the whole row of H and of I: up to 4,096 and 1,024
    here; larger rows take the two launches). wait=False, stall_us: the ordering test's negative control (no
    wait for act; every gate/up program first sleeps stall_us; CUDA only)."""
    words = _check(rows, hidden, inter)
    k = ids.shape[-1]
    if (gate_up_extra is None) != (down_extra is None):
        raise ValueError("give the shared expert's gate/up and down together, or neither")
    if write_shared != (down_extra is not None):
        raise ValueError("write_shared needs the shared expert (and the shared expert is written when given)")
    n_gu = k + (gate_up_extra is not None)
    if n_gu == 0:
        raise ValueError("no expert to run: give routed ids or the shared expert")
    if counters.dtype != torch.int32 or counters.numel() != counters_needed(n_gu) or counters.device != x.device:
        raise ValueError(f"counters must be launch.new_counter(device, {counters_needed(n_gu)})")
    if not fits(hidden, inter):
        raise ValueError(f"one launch decodes whole rows: hidden <= {MAX_HIDDEN} and inter <= {MAX_INTER}, got "
                         f"{hidden}, {inter} (use expert_gate_up and expert_down_parts)")
    bg_gu, bg_dn = _block_g(hidden, None), _block_g(inter, None)
    if block_n is None:  # expert_gate_up's default
        block_n = 2 if rows.is_cuda else min(64, triton.next_power_of_2(inter))
    if out is None:
        out = torch.empty(k + 1, 1, hidden, device=x.device, dtype=torch.float32)
    if out.shape != (k + 1, 1, hidden) or out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError(f"out must be fp32 [{k + 1}, 1, {hidden}] contiguous")
    act = torch.empty(n_gu, inter, device=x.device, dtype=torch.float32)
    gate = up = down = (words, rows, act)  # unused stand-ins of the right pointer types
    if gate_up_extra is not None:
        gate, up, down = _matrix(*gate_up_extra[:3]), _matrix(*gate_up_extra[3:]), _matrix(*down_extra)
    scale = extra_scale.reshape(-1) if extra_scale is not None else act
    tiles = triton.cdiv(hidden, block_m)
    tail = _sums_tail(sums, x.device, hidden, tiles, True) if sums is not None else None
    res = new_x_out = tile_sums = sum_counters = act  # stand-ins without sums=
    if tail is not None:
        res, _, new_x_out, _, tile_sums, sum_counters, _ = tail["args"]
    off = _row_offsets(hidden, inter)
    n_down = n_gu  # every expert that ran gate/up writes its part
    grid = n_gu * triton.cdiv(inter, block_n) + n_down * tiles
    expert_moe_kernel[(grid,)](
        x.reshape(-1).contiguous(), ids.reshape(-1).contiguous(), weights.reshape(-1).contiguous(), words, rows,
        act, out, hidden, inter, words.stride(0), off["gu_scale_at"], off["glob_at"], off["dn_at"],
        off["dn_scale_at"], *gate, *up, *down, scale, counters, res, new_x_out, tile_sums, sum_counters,
        K_ROUTED=k, HAS_EXTRA=gate_up_extra is not None, HAS_EXTRA_SCALE=extra_scale is not None,
        N_GATE_UP=n_gu, N_DOWN=n_down, BLOCK_N=block_n, BLOCK_G_GU=bg_gu,
        MASKED_GU=inter % block_n != 0 or (hidden // 16) % bg_gu != 0, BLOCK_M=block_m, BLOCK_G_DN=bg_dn,
        MASKED_DN=hidden % block_m != 0 or (inter // 16) % bg_dn != 0, DECODE=_decode(decode, rows), X_SPLIT=True,
        GROUP_SCALES_GU=False, GROUP_SCALES_DN=True, TILE_SUMS=tail is not None,
        ROUND=round_code(x.dtype) if tail is not None else 0, FENCE=x.device.type == "cuda",
        WAIT=wait, STALL_US=stall_us, TICKETS=TICKETS, num_warps=num_warps, **pdl_launch(x.device))
    return tail["result"] if tail is not None else out


def expert_moe_reference(x, weights, ids, rows, hidden, inter, gate_up_extra=None, down_extra=None,
                         extra_scale=None) -> torch.Tensor:
    """The fp32 parts [k + 1, 1, H] (row k: the shared expert's, else zeros) from the two references."""
    act = expert_gate_up_reference(x, ids, rows, hidden, inter, gate_up_extra)
    return expert_down_parts_reference(act, weights, ids, rows, hidden, inter, down_extra, extra_scale)
