"""The MoE down projection with every expert of an output tile in one program: no arrival tail, no parts buffer.

Why: expert_down_parts runs one program a (tile, expert), 1,152 at the real geometry, and leaves a part per expert;
with parts_norm.TILE_SUMS each tile's last program to arrive (a fence and an atomic in every program, then the
parts read back from L2) adds them, adds the residual and stores the tile's sum of squares. That tail grew the
launch from 5.33 to 6.99 us on the H200 (docs/RESULTS.md session 16), 40 launches a step. Here program t loads
tile t's code words and scale bytes of all k routed experts and the shared one first (one [k, rows, groups] tile,
nvfp4_down_groups' load block, so every row's bytes are in flight at once), then runs the group path's chains
against each expert's activations, adds the parts in order 0..k in registers, adds the residual and stores the
new residual's tile and its sum of squares: TILE_SUMS's two outputs, without counters, fences or atomics.

Arithmetic: each part is the group path's (nvfp4_down_groups: the same 16-FMA chain a group, times its E4M3 scale,
summed over the row's groups, times weights[j] * global * 2^14), the parts are added in expert order from part 0
and the shared part last, rounded once, then x is added and rounded: parts_norm._tile_residual's arithmetic on
expert_down_parts' group-path parts. The row sums over groups follow this tile's layout on a GPU (an fp32
rounding from the 2-D tile's order); in Triton's interpreter they are its bytes.
Reference: expert_down_tiles_reference (expert_down_parts_reference's parts, the tail's arithmetic in torch).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .decode_norm import _round_as, round_code
from .launch import gdc_prologue, pdl_launch
from .nvfp4_down_groups import _scaled_sum, chains, load_words, scale_values
from .nvfp4_experts_decode import _check, _matrix, _row_offsets
from .nvfp4_experts_parts import expert_down_parts_reference
from .nvfp4_triton import _store_exact, exact_out
from .route_keys import NONE, _id, _keys, check_route_logits
from ..quant.formats import dequant_nvfp4

# Off until its GPU A/B (profile_decode arm "dntiles"): the serial NVFP4 down launch with TILE_SUMS' outputs
# (moe_fused) goes through expert_down_tiles instead of expert_down_parts.
ON = False
# Output rows a program and its warps on a GPU (profile_decode values "dntbm" / "dntwarps"): at 4 rows and 2 warps
# the real geometry is 512 programs, each thread 2 groups of each of the 9 experts (18 chains, its 54 code words
# and scale bytes loaded before the first chain), the whole launch one wave.
BLOCK_M = 4
WARPS = 2
# Where gate/up routes itself (route= given: resident experts), each program finds all k experts from the router's
# logits and loads every row's code words and scale bytes BEFORE its PDL wait, so that after it only the
# activations (from L2), the weights and the residual are read: the rows' DRAM latency leaves the chain wherever
# the program is resident before gate/up ends (at gubn=2 gate/up is one wave and both launches fit an SM). The
# logits are router_norm's, the launch before gate/up, complete before gate/up's programs let this launch start
# (nvfp4_experts_parts.ROUTE says why), read from L2. The same experts, so the same bytes. On with the tiles;
# profile_decode's "no-dntearly" reads the ids after the wait instead.
EARLY = True


@triton.jit
def _early_experts(logits_ptr, E, ids_ptr, jj, mask_j, K_ROUTED: tl.constexpr, BLOCK_E: tl.constexpr,
                   TRACE: tl.constexpr):
    """The routed experts [KP] (int64) of ranks 0..k-1 of the router's logits, read from L2 before the PDL wait
    (see EARLY): route_keys' keys and integer maxima, route_topk's ids; with TRACE a benchmark trace's ids (written
    before the step's first kernel, read from L2), the ranks still found."""
    keys = _keys(logits_ptr, E, BLOCK_E, True)
    found = tl.zeros(jj.shape, dtype=tl.int64)
    live = tl.zeros(jj.shape, dtype=tl.int32)
    for r in tl.static_range(K_ROUTED):
        best = tl.max(keys, axis=0)
        found = tl.where(jj == r, _id(best).to(tl.int64), found)
        live = tl.where(jj == r, best, live)
        keys = tl.where(keys == best, NONE, keys)
    if TRACE:  # a key is never -2^31 + 1: the trace's ids are taken, the search stays live
        traced = tl.load(ids_ptr + jj, mask=mask_j, other=0, cache_modifier=".cg").to(tl.int64)
        found = tl.where(live == -2147483647, found, traced)
    return found


@triton.jit(do_not_specialize=["words_ptr", "bytes_ptr", "row_words"])
def expert_down_tiles_kernel(act_ptr, wts_ptr, ids_ptr, words_ptr, bytes_ptr, I, row_words, dn_at, dn_scale_at,
                             glob_at, xd_w, xd_s, xd_g, extra_scale_ptr, x_ptr, new_x_out_ptr, sums_ptr, H,
                             K_ROUTED: tl.constexpr, KP: tl.constexpr, HAS_EXTRA_SCALE: tl.constexpr,
                             BLOCK_M: tl.constexpr, BLOCK_G: tl.constexpr, DECODE: tl.constexpr,
                             ROUND: tl.constexpr, USE_GDC: tl.constexpr = False, logits_ptr=None, E=0,
                             EARLY_ROUTE: tl.constexpr = 0, BLOCK_E: tl.constexpr = 32):
    """Program t: rows m = t * BLOCK_M ... of the new residual x + sum_j parts[j] (j = 0..k-1 the routed experts
    ids[j], weighted by weights[j]; k the shared expert, times extra_scale) and their sum of squares at sums[t].
    Masked rows, groups and experts read row 0 / group 0 / expert ids[0] and add nothing.
    EARLY_ROUTE (see EARLY): the experts found from the router's logits and every row's words and scale bytes
    loaded before the PDL wait (2: a benchmark trace's ids, the ranks still found); after it only the activations,
    the weights and the residual."""
    if EARLY_ROUTE == 0:
        gdc_prologue(USE_GDC)  # PDL: act, the ids and weights are gate/up's (or route_topk's) outputs
    t = tl.program_id(0)
    m = t * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = m < H
    grp = tl.arange(0, BLOCK_G)
    mask_g = grp < I // 16
    r = tl.where(mask_m, m, 0).to(tl.int64)[:, None]  # [BLOCK_M, 1]
    g = tl.where(mask_g, grp, 0)[None, :]  # [1, BLOCK_G]
    jj = tl.arange(0, KP)
    mask_j = jj < K_ROUTED
    if EARLY_ROUTE > 0:
        e = _early_experts(logits_ptr, E, ids_ptr, jj, mask_j, K_ROUTED, BLOCK_E, EARLY_ROUTE == 2)
    else:
        e = tl.load(ids_ptr + jj, mask=mask_j, other=0).to(tl.int64)
    base = words_ptr + e * row_words  # each routed expert's row (as words)
    rows3, g3 = r[None, :, :], g[None, :, :]
    cw = (base + dn_at)[:, None, None] + rows3 * (I // 8) + 2 * g3  # [KP, BLOCK_M, BLOCK_G]: a group's first word
    sp = (bytes_ptr + e * row_words * 4 + dn_scale_at)[:, None, None] + rows3 * (I // 16) + g3
    # Every row's code words and scale bytes first (the shared expert's too), then the chains.
    w0, w1, sb = load_words(cw, sp, DECODE)
    xw0, xw1, xsb = load_words(xd_w + r * (I // 8) + 2 * g, xd_s + r * (I // 16) + g, DECODE)
    # ptxas would sink some of those loads among the chains (register pressure); none moves past a barrier, so
    # they are all issued here, and the chains wait only for the bytes they use
    tl.debug_barrier()
    glob = tl.load(base + glob_at + 2).to(tl.float32, bitcast=True) * 16384.0  # 2^14: the codes' scaling
    if EARLY_ROUTE > 0:  # the rows are resident experts' (no kernel writes them); the rest is gate/up's
        gdc_prologue(USE_GDC)
    scales = tl.load(wts_ptr + jj, mask=mask_j, other=0.0).to(tl.float32) * glob  # [KP]
    ap = act_ptr + jj[:, None, None] * I + 16 * g3 + 0 * rows3  # the tile's shape: one layout for all operands
    part = chains(w0, w1, ap, DECODE) * scale_values(sb)
    ok = mask_j[:, None, None] & mask_m[None, :, None] & mask_g[None, None, :]
    parts = tl.sum(tl.where(ok, part, 0.0), axis=2) * scales[:, None]  # [KP, BLOCK_M]
    # The parts in order from part 0: -0.0 is the fill, so a masked-out expert adds exactly nothing (x + -0 = x).
    delta = tl.sum(tl.where(jj[:, None] == 0, parts, -0.0), axis=0)
    for j in tl.static_range(1, K_ROUTED):
        delta += tl.sum(tl.where(jj[:, None] == j, parts, -0.0), axis=0)
    shared = _scaled_sum(chains(xw0, xw1, act_ptr + K_ROUTED * I + 16 * g + 0 * r, DECODE), xsb, mask_m, mask_g)
    x_scale = tl.load(xd_g) * 16384.0
    if HAS_EXTRA_SCALE:
        x_scale = tl.load(extra_scale_ptr).to(tl.float32) * x_scale
    if K_ROUTED > 0:
        delta += shared * x_scale
    else:
        delta = shared * x_scale
    x = tl.load(x_ptr + m, mask=mask_m, other=0.0).to(tl.float32)
    x = _round_as(x + _round_as(delta, ROUND), ROUND)
    _store_exact(new_x_out_ptr + m, x, mask_m, ROUND == 1)
    tl.store(sums_ptr + t, tl.sum(tl.where(mask_m, x * x, 0.0), axis=0))


def expert_down_tiles(act: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor, hidden: int,
                      inter: int, extra: tuple, extra_scale: torch.Tensor | None, x: torch.Tensor, *,
                      block_m: int | None = None, num_warps: int | None = None, decode: str | None = None,
                      route: tuple | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(new_x [1, H] in x's dtype, tile sums fp32 [H / block_m]): expert_down_parts(..., groups=True, sums=(x, ...))'s
    two results in one launch of H / block_m programs. act fp32 [k + 1, I] (gate/up's, the shared expert's last),
    weights [1, k], ids [1, k] (rows of `rows`), extra = the shared expert's (down_packed, down_scale,
    down_scale2), extra_scale its gate (fp32 [1]) or None. block_m / num_warps: None is BLOCK_M (read at the call:
    the tile sums' size) / WARPS on a GPU.
    decode: "asm" (CUDA: the group path's PTX; needs 16-byte aligned rows, act and shared words) or "plain".
    route = (logits [E + 1] bf16/fp16, E, traced): with the switch EARLY the programs find the experts and load
    their rows before the PDL wait; ids must then be route_topk's ids of those logits (gate/up writes them), or
    with traced a benchmark trace's ids (the rows taken, the ranks still found)."""
    words = _check(rows, hidden, inter)
    k = ids.shape[-1]
    if act.shape != (k + 1, inter) or act.dtype != torch.float32:
        raise ValueError(f"act must be fp32 [{k + 1}, {inter}] (k routed experts and the shared one), got "
                         f"{tuple(act.shape)} {act.dtype}")
    if x.shape != (1, hidden) or not x.is_contiguous():
        raise ValueError(f"x must be [1, {hidden}] contiguous, got {tuple(x.shape)}")
    if weights.numel() != k:
        raise ValueError(f"weights must hold the {k} routed experts' weights, got {weights.numel()}")
    on_gpu = rows.is_cuda
    block_m = block_m or BLOCK_M
    num_warps = num_warps or (WARPS if on_gpu else 2)
    decode = decode or ("asm" if on_gpu else "plain")
    if decode not in ("asm", "plain"):
        raise ValueError(f"decode must be 'asm' or 'plain', got {decode!r}")
    xd_w, xd_s, xd_g = _matrix(*extra)
    act = act.contiguous()
    if decode == "asm" and (rows.data_ptr() % 16 or rows.stride(0) % 16 or act.data_ptr() % 16
                            or xd_w.data_ptr() % 16):
        raise ValueError("the down tiles' PTX needs expert rows at a 16-byte start and stride, act and the shared "
                         "expert's words 16-byte aligned: hold the rows as quant.nvfp4_rows.padded_rows does")
    tiles = triton.cdiv(hidden, block_m)
    new_x = torch.empty_like(x)
    sums = torch.empty(tiles, device=x.device, dtype=torch.float32)
    off = _row_offsets(hidden, inter)
    scale = extra_scale.reshape(-1) if extra_scale is not None else act
    early = {}
    if route is not None and EARLY and k > 0:
        logits, experts, traced = route
        early = dict(logits_ptr=check_route_logits(logits, experts, k), E=experts, EARLY_ROUTE=2 if traced else 1,
                     BLOCK_E=triton.next_power_of_2(experts))
    expert_down_tiles_kernel[(tiles,)](
        act, weights.reshape(-1).contiguous(), ids.reshape(-1).contiguous(), words, rows, inter, words.stride(0),
        off["dn_at"], off["dn_scale_at"], off["glob_at"], xd_w, xd_s, xd_g, scale, x, exact_out(new_x), sums, hidden,
        K_ROUTED=k, KP=triton.next_power_of_2(max(k, 1)), HAS_EXTRA_SCALE=extra_scale is not None,
        BLOCK_M=block_m, BLOCK_G=triton.next_power_of_2(inter // 16), DECODE=decode, ROUND=round_code(x.dtype),
        num_warps=num_warps, **early, **pdl_launch(rows.device))
    return new_x, sums


def expert_down_tiles_reference(act: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor,
                                hidden: int, inter: int, extra: tuple, extra_scale: torch.Tensor | None,
                                x: torch.Tensor, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The plain math: the parts (dequantized, fp32 matmuls) added in order, rounded to x's dtype, plus x, rounded;
    each block_m tile's sum of squares in fp32."""
    if ids.shape[-1]:
        parts = expert_down_parts_reference(act, weights, ids, rows, hidden, inter, extra=extra,
                                            extra_scale=extra_scale)[:, 0]
    else:  # the shared expert alone
        y = dequant_nvfp4(*extra) @ act[0]
        parts = (extra_scale.reshape(()).float() * y if extra_scale is not None else y)[None]
    delta = parts[0].clone()
    for p in parts[1:]:
        delta += p
    new_x = (x.float() + delta.to(x.dtype).float()).to(x.dtype)
    tiles = new_x.float().reshape(-1).split(block_m)
    return new_x, torch.stack([(t * t).sum() for t in tiles])
