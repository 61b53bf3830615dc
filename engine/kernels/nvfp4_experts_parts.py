"""The batch-1 MoE down projection split over the experts: one program per (tile of H outputs, expert).

Why: expert_down (nvfp4_experts_decode.py) gives each program a tile of outputs and loops over the k + 1
experts inside it, so only H / block_m programs run (256 for the real geometry, 10 us best on the H200 for
5.3 MB: ~0.5 TB/s). Here the grid is (H / block_m, k + 1): every expert's rows load at once across the GPU, and
each program stores its expert's weighted partial, parts[j] = w_j * (down_j @ act[j]) (fp32 [k + 1, H]). The
sum over the experts is left to the consumer, the next residual add + RMSNorm (decode_norm.add_rms_norm with a
3-D delta), which adds the parts in the fixed order j = 0..k and rounds once: no atomics, no extra launch,
deterministic, and the bytes do not depend on where a row lives (bank or slot).

Row k of parts is the shared expert: its down projection times extra_scale (extra), or the given addend (the
shared expert computed apart, beside the miss copy), or zeros.

Reference: expert_down_parts_reference below (dequantize, then the plain fp32 math).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .decode_norm import round_code
from .launch import gdc_prologue, pdl_launch
from .nvfp4_triton import exact_out
from .parts_norm import parts_norm_tail
from ..quant.formats import dequant_nvfp4
from ..quant.nvfp4_rows import dequant_expert_rows
from .nvfp4_down_groups import extra_down_groups, preload_down, preloaded_part, routed_down_groups
from .nvfp4_expert_rows import extra_down, routed_down, x_tiles
from .nvfp4_experts_decode import _block_g, _check, _decode, _matrix, _row_offsets, requested_programs
from .route_keys import check_route_logits, routed_expert

BLOCK_M = 16  # outputs a program (the H200 sweep's best, docs/RESULTS.md session 6)
# Each thread owns whole 16-code groups of its rows, loaded, decoded and dotted in one PTX block a group
# (nvfp4_down_groups.rows_groups): no layout conversion between the words, the activations and the scales. Under
# the H200's Triton 3.6.0 (scripts/sass_down_groups.py) the step's 2-warp program of 16 rows with its tile-sums
# tail compiles to 1,720 SASS instructions instead of 1,872 (both the routed and the shared branch), 48 registers
# instead of 96, 4 barriers instead of 36, 3 shared loads instead of 34: the decode itself (a LOP3, ~0.9 SHF, a
# HADD2.F32 and an FFMA a code) is the same, so this removes the layout's share only. The parts within an fp32
# rounding of rows_part's (another order of the sums), not their bytes. One program a tile only. On since session
# 27 with ROUTE and PRELOAD (below): the three together, over the group gate/up at 2 rows, made the resident 16K
# step 0.969x back to back against session 26's default (0.977x for the gate/up's part alone, the same 5
# interleaved rounds, every round; H100, docs/RESULTS.md session 27); the bf16-level / graph == eager gate
# [gugroups+dngroups] passed on the GPU.
GROUPS = True
# Where the integer gate/up routes itself (moe_fused.routes_itself: resident experts), the down launch's routed
# programs find their own expert too (route_keys.route_rank_key, the same key as gate/up's), before the PDL wait:
# then the rows' loads follow the wait at once instead of after a read of gate/up's ids (one L2 round trip off
# each program's chain). The logits are router_norm's, the launch before gate/up: gate/up's programs signal
# launch_dependents only after their own griddepcontrol.wait (gdc_prologue), which returns when router_norm has
# completed and its writes are performed, so they are in L2 before this launch starts; they are read from L2
# (ld.global.cg), past an L1 that may hold an earlier step's line. The same ids, so the same bytes (the GPU tier's
# switches6 case). On since session 27 (with GROUPS, PRELOAD: see GROUPS); "no-dnroute" reads the ids.
ROUTE = True
# Where the down launch routes itself (ROUTE) on the group path (GROUPS), each program loads its rows' code words
# and scale bytes (and the global scale) before the PDL wait too, into registers (nvfp4_down_groups.preload_down),
# and after it only the activations: the rows' DRAM latency leaves the chain after the wait wherever the
# program is resident before gate/up ends (gate/up's second partial wave, or one wave at gubn=2). The rows are
# resident experts' (ROUTE's condition: no slot is filled in the step), which no kernel writes. The same chains,
# sums and scales as the group path, so its bytes (the GPU tier's switches7 case). On since session 27 (see
# GROUPS); "no-dnpre" loads the rows after the wait.
PRELOAD = True


@triton.jit
def _part_rows(act_ptr, wts_ptr, ids_ptr, words_ptr, bytes_ptr, parts_ptr, H, I, row_words, dn_at, dn_scale_at,
               glob_at, xd_w, xd_s, xd_g, extra_scale_ptr, addend_ptr, j, m, xs, w, mask_w,
               K_ROUTED: tl.constexpr, HAS_EXTRA: tl.constexpr, HAS_EXTRA_SCALE: tl.constexpr,
               HAS_ADDEND: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_G: tl.constexpr, MASKED: tl.constexpr,
               DECODE: tl.constexpr, X_SPLIT: tl.constexpr, GROUP_SCALES: tl.constexpr, ONE_STEP: tl.constexpr,
               GROUPS: tl.constexpr = False, e_routed=None, ROUTED: tl.constexpr = False):
    """parts[j, m] for expert j (0..k-1 routed, k the shared one) and outputs m; GROUPS: the rows through
    nvfp4_down_groups (DECODE "asm" or "plain"); ROUTED: routed expert j is e_routed, not ids[j]."""
    mask_m = m < H
    if j < K_ROUTED:
        if GROUPS:
            y, y_scale = routed_down_groups(act_ptr, wts_ptr, ids_ptr, words_ptr, bytes_ptr, j, m, mask_m, I,
                                            row_words, dn_at, dn_scale_at, glob_at, BLOCK_G, DECODE, e_routed,
                                            ROUTED)
        else:
            part, y_scale = routed_down(act_ptr, wts_ptr, ids_ptr, words_ptr, bytes_ptr, j, m, mask_m, I, row_words,
                                        dn_at, dn_scale_at, glob_at, BLOCK_G, MASKED, DECODE, X_SPLIT, GROUP_SCALES,
                                        xs, w, mask_w, ONE_STEP, e_routed, ROUTED)
            y = tl.sum(part, axis=1)
        out = y * y_scale
    else:
        out = tl.zeros([BLOCK_M], dtype=tl.float32)
        if HAS_EXTRA:
            if GROUPS:
                y, y_scale = extra_down_groups(act_ptr, xd_w, xd_s, xd_g, extra_scale_ptr, m, mask_m, I, K_ROUTED,
                                               HAS_EXTRA_SCALE, BLOCK_G, DECODE)
            else:
                part, y_scale = extra_down(act_ptr, xd_w, xd_s, xd_g, extra_scale_ptr, m, mask_m, I, K_ROUTED,
                                           HAS_EXTRA_SCALE, BLOCK_G, MASKED, DECODE, X_SPLIT, GROUP_SCALES, xs, w,
                                           mask_w, ONE_STEP)
                y = tl.sum(part, axis=1)
            out = y * y_scale
        if HAS_ADDEND:
            out = tl.load(addend_ptr + m, mask=mask_m, other=0.0).to(tl.float32)
    tl.store(parts_ptr + j * H + m, out, mask=mask_m)


@triton.jit(do_not_specialize=["words_ptr", "bytes_ptr", "row_words"])
def expert_down_parts_kernel(act_ptr, wts_ptr, ids_ptr, words_ptr, bytes_ptr, parts_ptr, H, I, row_words,
                             dn_at, dn_scale_at, glob_at, xd_w, xd_s, xd_g, extra_scale_ptr, addend_ptr,
                             x_ptr, norm_w_ptr, new_x_out_ptr, new_x_ptr, norm_ptr, counters_ptr, eps,
                             K_ROUTED: tl.constexpr, HAS_EXTRA: tl.constexpr, HAS_EXTRA_SCALE: tl.constexpr,
                             HAS_ADDEND: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_G: tl.constexpr,
                             MASKED: tl.constexpr, DECODE: tl.constexpr, X_SPLIT: tl.constexpr,
                             GROUP_SCALES: tl.constexpr, USE_GDC: tl.constexpr = False,
                             PERSISTENT: tl.constexpr = False, NORM_TAIL: tl.constexpr = False,
                             ROUND: tl.constexpr = 0, BLOCK_H: tl.constexpr = 16, FENCE: tl.constexpr = False,
                             TILE_SUMS: tl.constexpr = False, GROUPS: tl.constexpr = False, logits_ptr=None, E=0,
                             EARLY_ROUTE: tl.constexpr = 0, BLOCK_E: tl.constexpr = 32,
                             PRELOAD: tl.constexpr = False):
    """Grid (output tiles, k + 1 experts). PERSISTENT (the whole row in one K step): grid (programs an expert,
    k + 1); program (q, j) takes the output tiles q, q + grid, ... of expert j with act[j]'s activations
    loaded once: the same bytes as one program a tile. NORM_TAIL (one program a tile, every part written): the
    next residual add + RMSNorm in the launch's last programs (parts_norm.parts_norm_tail); with TILE_SUMS the
    new residual and its tiles' sums of squares only (then the shared part may come from a launch before).
    EARLY_ROUTE (one program a tile): routed program j finds its expert, rank j of the router's logits, before
    the PDL wait (see ROUTE); 2 (a benchmark's routing trace): the rank is still found, the row is ids[j].
    PRELOAD (with EARLY_ROUTE and GROUPS): the program's rows loaded before the wait too (see PRELOAD)."""
    j = tl.program_id(1)  # 0..k-1 routed experts, k the shared one
    e_routed = tl.zeros([], dtype=tl.int64)
    if EARLY_ROUTE > 0:
        if j < K_ROUTED:  # from L2: read before the wait (see ROUTE); 2: the trace's row, written before the
            # step's first kernel
            e_routed = routed_expert(logits_ptr, E, j, BLOCK_E, ids_ptr, EARLY_ROUTE == 2, True)
    if PRELOAD:  # the rows are resident experts' (no kernel writes them): into registers before the wait
        m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        w0, w1, sb, g_down = preload_down(ids_ptr, words_ptr, bytes_ptr, xd_w, xd_s, xd_g, j, m, m < H, I,
                                          row_words, dn_at, dn_scale_at, glob_at, e_routed, K_ROUTED, HAS_EXTRA,
                                          BLOCK_M, BLOCK_G, DECODE)
    gdc_prologue(USE_GDC)  # PDL: gate/up's act (and the routing weights) are read only after this
    if PERSISTENT:
        w = tl.arange(0, 2 * BLOCK_G)
        mask_w = w < I // 8
        xs = x_tiles(act_ptr + j * I, w, mask_w, 2 * BLOCK_G, MASKED, X_SPLIT)
        for tile in range(tl.program_id(0), tl.cdiv(H, BLOCK_M), tl.num_programs(0)):
            m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
            _part_rows(act_ptr, wts_ptr, ids_ptr, words_ptr, bytes_ptr, parts_ptr, H, I, row_words, dn_at,
                       dn_scale_at, glob_at, xd_w, xd_s, xd_g, extra_scale_ptr, addend_ptr, j, m, xs, w, mask_w,
                       K_ROUTED, HAS_EXTRA, HAS_EXTRA_SCALE, HAS_ADDEND, BLOCK_M, BLOCK_G, MASKED, DECODE,
                       X_SPLIT, GROUP_SCALES, True)
    else:
        m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        if PRELOAD:
            out = preloaded_part(act_ptr, wts_ptr, extra_scale_ptr, addend_ptr, w0, w1, sb, g_down, j, m, m < H, I,
                                 K_ROUTED, HAS_EXTRA, HAS_EXTRA_SCALE, HAS_ADDEND, BLOCK_M, BLOCK_G, DECODE)
            tl.store(parts_ptr + j * H + m, out, mask=m < H)
        else:
            _part_rows(act_ptr, wts_ptr, ids_ptr, words_ptr, bytes_ptr, parts_ptr, H, I, row_words, dn_at,
                       dn_scale_at, glob_at, xd_w, xd_s, xd_g, extra_scale_ptr, addend_ptr, j, m, None, None, None,
                       K_ROUTED, HAS_EXTRA, HAS_EXTRA_SCALE, HAS_ADDEND, BLOCK_M, BLOCK_G, MASKED, DECODE, X_SPLIT,
                       GROUP_SCALES, False, GROUPS, e_routed, EARLY_ROUTE > 0)
        if NORM_TAIL:
            parts_norm_tail(parts_ptr, x_ptr, norm_w_ptr, new_x_out_ptr, new_x_ptr, norm_ptr, counters_ptr, eps, H,
                            tl.program_id(0), tl.num_programs(0), K_ROUTED + 1, BLOCK_M, ROUND, BLOCK_H, FENCE,
                            TILE_SUMS, tl.num_programs(1))


def expert_down_parts(act: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor, hidden: int,
                      inter: int, extra: tuple | None = None, extra_scale: torch.Tensor | None = None,
                      addend: torch.Tensor | None = None, out: torch.Tensor | None = None, *,
                      write_shared: bool = True, block_m: int | None = None,
                      block_g: int | None = None, num_warps: int = 2, decode: str | None = None,
                      x_split: bool = True, group_scales: bool = True, programs: int | None = None,
                      norm: tuple | None = None, sums: tuple | None = None, groups: bool | None = None,
                      route: tuple | None = None):
    """fp32 parts [k + 1, 1, H]: parts[j] = weights[0, j] * (down_j @ act[j]) for the row rows[ids[0, j]],
    parts[k] = extra_scale * (down_extra @ act[k]) with extra = (down_packed, down_scale, down_scale2), or
    addend [1, H] (any float dtype), or zeros. act fp32 [k (+1), I] (expert_gate_up's). One launch, grid
    (H / block_m, k + 1). Summed in order by add_rms_norm (a 3-D delta).
    write_shared=False: row k is left to the caller (grid (H / block_m, k)). The shared expert computed apart
    (beside the miss copy) in the same bytes as in the joint launch: expert_gate_up with ids [1, 0] and extra,
    then this with ids [1, 0], extra and out = parts[k:], i.e. the same programs' arithmetic.
    programs: at most this many persistent programs in all, spread over the experts, each taking one expert's
    output tiles in turn with its activations loaded once (the whole row in one K step only; None: the switch
    nvfp4_experts_decode.PERSISTENT, one wave of them, else one program a tile). The same bytes either way.
    norm = (x [1, H], norm_w [H], eps, counters: launch.new_counter(device, H / block_m + 1)): the next residual
    add + RMSNorm in this launch (parts_norm.py): returns (new_x, normed), add_rms_norm(x, parts, norm_w, eps)'s
    (the norm within its order of sums), instead of the parts. One program a tile, every part written.
    groups (None: the switch GROUPS): the rows through nvfp4_down_groups (one program a tile; its PTX path needs
    the rows, the shared expert's words and act 16-byte aligned, as the engine holds them).
    sums = (x [1, H], counters: launch.new_counter(device, H / block_m)): returns (new_x, tile_sums fp32
    [H / block_m]) instead: new_x = add_rms_norm's, and each tile's sum of squares of it, for a GEMV's norm=
    (parts_norm.py TILE_SUMS). One program a tile; write_shared=False too (row k written before).
    route = (logits [E + 1] bf16/fp16, E, traced): with the switch ROUTE, the routed programs find their experts
    from the router's logits before the PDL wait instead of reading ids (which must then be route_topk's ids of
    those logits, or with traced a benchmark trace's ids, the rows taken); one program a tile. With the switch
    PRELOAD too, on the group path, the programs load their rows before the wait as well (resident rows only)."""
    if norm is not None and sums is not None:
        raise ValueError("give norm= or sums=, not both")
    block_m = BLOCK_M if block_m is None else block_m  # read at the call: profile_decode's arm value downbm
    if extra is not None and addend is not None:
        raise ValueError("give the shared expert as extra (its down projection) or as addend, not both")
    words = _check(rows, hidden, inter)
    k = ids.shape[-1]
    if out is None:
        out = torch.empty(k + 1, 1, hidden, device=act.device, dtype=torch.float32)
    if out.shape != (k + 1, 1, hidden) or out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError(f"out must be fp32 [{k + 1}, 1, {hidden}] contiguous")
    down = _matrix(*extra) if extra is not None else (words, rows, act)
    scale = extra_scale.reshape(-1) if extra_scale is not None else act
    bg = _block_g(inter, block_g)
    off = _row_offsets(hidden, inter)
    if not write_shared and (extra is not None or addend is not None):
        raise ValueError("write_shared=False leaves the shared row to the caller: give neither extra nor addend")
    experts, tiles = k + 1 if write_shared else k, triton.cdiv(hidden, block_m)
    # The switch takes the calls that ask nothing of the row path only (a part of a row's groups a step, the exact
    # decode, persistent programs, the row path's x and scale loads): the group path holds a row's groups at once.
    part_of_row = bg < _block_g(inter, None)
    row_path_only = part_of_row or decode == "exact" or programs or not x_split or not group_scales
    groups = (GROUPS and not row_path_only) if groups is None else groups
    if groups and part_of_row:
        raise ValueError(f"the group path takes a row's {inter // 16} groups in one tile: give no block_g below it")
    decode = _decode(decode, rows)
    if groups:
        decode = "asm" if decode == "asm" else "plain"  # the group path's two forms (the same integers and FMAs)
        _check_group_launch(rows, act, down[0] if extra is not None else None, programs, decode)
    else:
        programs = requested_programs(programs, act.device, num_warps, bg * 16 >= inter)
    per_expert = max(1, (programs or 0) // max(1, experts))
    persistent = programs is not None and per_expert < tiles
    early = _early_route(route if ROUTE else None, k, persistent)
    if PRELOAD and groups and early:  # the rows before the wait: only where the experts are found before it
        early["PRELOAD"] = True
    tail = (_sums_tail(sums, act.device, hidden, tiles, not persistent) if sums is not None
            else _norm_tail(norm, act.device, hidden, tiles, write_shared and not persistent))
    expert_down_parts_kernel[(per_expert if persistent else tiles, experts)](
        act.contiguous(), weights.reshape(-1).contiguous(), ids.reshape(-1).contiguous(), words, rows, out,
        hidden, inter, words.stride(0), off["dn_at"], off["dn_scale_at"], off["glob_at"], *down, scale,
        addend.reshape(-1).contiguous() if addend is not None else act, *tail["args"],
        K_ROUTED=k, HAS_EXTRA=extra is not None, HAS_EXTRA_SCALE=extra_scale is not None,
        HAS_ADDEND=addend is not None, BLOCK_M=block_m, BLOCK_G=bg,
        MASKED=hidden % block_m != 0 or (inter // 16) % bg != 0, DECODE=decode, X_SPLIT=x_split,
        GROUP_SCALES=group_scales, PERSISTENT=persistent, num_warps=num_warps, GROUPS=groups, **tail["consts"],
        **early, **pdl_launch(act.device))
    return tail["result"] if norm is not None or sums is not None else out


def _early_route(route: tuple | None, k: int, persistent: bool) -> dict:
    """The kernel's EARLY_ROUTE arguments for route = (logits, E, traced), after checking them; {} for none."""
    if route is None or k == 0:
        return {}
    logits, experts, traced = route
    flat = check_route_logits(logits, experts, k)
    if persistent:
        raise ValueError("route= runs one program a tile: give no programs= (nor the switch PERSISTENT)")
    return dict(logits_ptr=flat, E=experts, EARLY_ROUTE=2 if traced else 1,
                BLOCK_E=triton.next_power_of_2(experts))


def _check_group_launch(rows: torch.Tensor, act: torch.Tensor, shared_words: torch.Tensor | None,
                        programs: int | None, decode: str) -> None:
    """The group path's checks before its launch: one program a tile (whatever the switch PERSISTENT says) and,
    for its PTX, 16-byte aligned rows, act and shared words."""
    if programs:
        raise ValueError("the group path (groups=) runs one program a tile: give no programs=")
    if decode == "asm" and (rows.data_ptr() % 16 or rows.stride(0) % 16 or act.data_ptr() % 16
                            or (shared_words is not None and shared_words.data_ptr() % 16)):
        raise ValueError("the group path needs expert rows at a 16-byte start and stride, act and the shared "
                         "expert's words 16-byte aligned: hold the rows as quant.nvfp4_rows.padded_rows does")


def _norm_tail(norm: tuple | None, device, hidden: int, tiles: int, possible: bool) -> dict:
    """The kernel's norm-tail arguments (placeholders without one) and what the call returns with one."""
    if norm is None:
        dummy = torch.empty(1, device=device, dtype=torch.float32)
        return {"args": (dummy,) * 6 + (0.0,), "consts": {}, "result": None}
    x, norm_w, eps, counters = norm
    if not possible:
        raise ValueError("the norm tail needs one program a tile with every part written (write_shared, not "
                         "persistent programs)")
    if x.shape != (1, hidden) or not x.is_contiguous() or norm_w.shape != (hidden,):
        raise ValueError(f"norm needs x [1, {hidden}] contiguous and norm_w [{hidden}], got {tuple(x.shape)} and "
                         f"{tuple(norm_w.shape)}")
    if counters.dtype != torch.int32 or counters.numel() != tiles + 1 or counters.device != x.device:
        raise ValueError(f"norm's counters must be launch.new_counter(device, {tiles + 1}): one int32 an output "
                         f"tile and one for the row")
    new_x, normed = torch.empty_like(x), torch.empty_like(x)
    return {"args": (x, norm_w, exact_out(new_x), new_x, exact_out(normed), counters, eps),
            "consts": dict(NORM_TAIL=True, ROUND=round_code(x.dtype), BLOCK_H=triton.next_power_of_2(hidden),
                           FENCE=device.type == "cuda"),
            "result": (new_x, normed)}


def _sums_tail(sums: tuple, device, hidden: int, tiles: int, possible: bool) -> dict:
    """The kernel's arguments for sums= (parts_norm TILE_SUMS) and what the call returns."""
    x, counters = sums
    if not possible:
        raise ValueError("the tile sums need one program a tile (not persistent programs)")
    if x.shape != (1, hidden) or not x.is_contiguous():
        raise ValueError(f"sums needs x [1, {hidden}] contiguous, got {tuple(x.shape)}")
    if counters.dtype != torch.int32 or counters.numel() != tiles or counters.device != x.device:
        raise ValueError(f"sums' counters must be launch.new_counter(device, {tiles}): one int32 an output tile")
    new_x = torch.empty_like(x)
    tile_sums = torch.empty(tiles, device=x.device, dtype=torch.float32)
    return {"args": (x, x, exact_out(new_x), new_x, tile_sums, counters, 0.0),
            "consts": dict(NORM_TAIL=True, TILE_SUMS=True, ROUND=round_code(x.dtype), FENCE=device.type == "cuda"),
            "result": (new_x, tile_sums)}


def expert_down_parts_reference(act: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor,
                                hidden: int, inter: int, extra: tuple | None = None,
                                extra_scale: torch.Tensor | None = None,
                                addend: torch.Tensor | None = None) -> torch.Tensor:
    _, down = dequant_expert_rows(rows[ids.reshape(-1)], hidden, inter, torch.float32)
    wts = weights.reshape(-1).float()
    parts = [wts[j] * (down[j] @ act[j]) for j in range(ids.shape[-1])]
    if extra is not None:
        y = dequant_nvfp4(*extra) @ act[ids.shape[-1]]
        parts.append(extra_scale.reshape(()).float() * y if extra_scale is not None else y)
    elif addend is not None:
        parts.append(addend.reshape(-1).float())
    else:
        parts.append(torch.zeros(hidden, device=act.device))
    return torch.stack(parts)[:, None, :]
