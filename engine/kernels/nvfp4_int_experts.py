"""The batch-1 experts' gate/up (nvfp4_experts_decode.expert_gate_up) as integer dot products (nvfp4_int_dot).

Why: expert_gate_up is the step's largest kernel (9.3 us a layer, 40 layers) and Nsight Compute has it issuing
instructions half its time at 9.4 SASS instructions a code (docs/RESULTS.md session 18). The same rows, routed
ids and shared expert, with each word's eight codes turned into int8 by PRMTs and multiplied into x's int16
pairs by dp2a (nvfp4_int_dot.word_dot). x comes quantized (nvfp4_int_dot.quantize_x16: int16 pairs and fp32
scales per 16-element block), so that one quantization serves every program of the launch.

act[j] = SiLU(g) * u with g = gate_j x, u = up_j x, each the sum over 16-code groups of (the group's exact
integer dot) * E4M3 scale * x's block scale, in fp32 in a fixed order, times the global / 2. Not
expert_gate_up's bytes: x's int16 blocks put act within ~2e-4 of the fp32 reference (relative to its largest),
under bf16's 2^-9. Reference: expert_gate_up_int_reference (the same integers and order of scaling in torch);
nvfp4_experts_decode.expert_gate_up_reference for the value it approximates.

Status: on by default (the switch ON, decode_fused), since its GPU A/B (session 19).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .launch import gdc_prologue, pdl_launch, prefetch_l2
from .nvfp4_expert_rows import gate_up_pointers
from .nvfp4_experts_decode import _check, _matrix, _row_offsets
from .nvfp4_int_dot import gemv_int_reference, quantize_x16, rows_dot, tables, x_pair_tiles
from .nvfp4_int_groups import gate_up_groups
from .route_keys import route_args, routed_expert, store_route
from ..quant.nvfp4_rows import unpack_nvfp4_expert

# The fused step's NVFP4 experts' gate/up through expert_gate_up_int, x quantized by the router's launch
# (router_norm(quantize=True)) or, where no router_norm runs, by quantize_x16. On: its GPU A/B (profile_decode arm
# "guint", docs/RESULTS.md session 19) made the resident 16K step 0.988x, faster in 7 of 7 interleaved rounds
# (gate/up 9.25 -> 7.85 us, router_norm 3.13 -> 3.79 us). act at the level of x's int16 blocks, not
# expert_gate_up's bytes; "no-guint" is the float kernel.
ON = True
# The down rows as integer dots (dnint) lost 1.08x the step (docs/RESULTS.md session 21); history: 52f5195
# The routed gate/up programs find their own experts from the router's 16-bit logits (expert_gate_up_int route=)
# where the experts are resident (no slot map to ensure first): no route_topk launch (moe_fused.routes_itself).
# Leaving route_topk out made the step 0.938x (the drop-route ceiling, docs/RESULTS.md session 15); the same
# search in expert_gate_up's 4-warp programs cost them 2.1 us (a cross-warp max and a barrier a round: routeup,
# neutral, removed). At one warp a program a round is one REDUX. The same bytes as route_topk + the gate/up.
# On: its GPU A/B (arm "routeint", docs/RESULTS.md session 21) made the resident 16K step 0.983x (per-round ratios
# 0.981 0.981 1.000 0.997 0.983), 302 launches a step instead of 342; "no-routeint" keeps route_topk.
ROUTE = True
# Each routed program asks L2 for its share of its expert's down rows (codes and scales: one contiguous run of
# the expert's row) once its own loads are out, so that expert_down_parts, the next launch, reads them from L2.
# Why: gate/up reads its 10 MB at ~1.3 TB/s (a quarter of the DRAM peak), and the GEMVs read 25-40 % faster from
# L2 (docs/RESULTS.md session 15, "hot"). A hint: no byte of any output moves. Off: its one unpaired figure
# (profile_decode arm "downpf", docs/RESULTS.md session 22) was neutral, 1.779 against 1.781 ms, so down's 6.5 us
# is not its weights' DRAM time; the paired A/B is the next session's.
DOWN_PREFETCH = False
# Each thread owns whole 16-code groups of its rows, loaded and dotted in one PTX block a group
# (nvfp4_int_groups.gate_up_groups): no layout conversion between the words, x's pairs and the scales. Under the
# H200's Triton 3.6.0 (scripts/sass_nvfp4_int_dot.py, sm_90) the 1-row program is 488 SASS instructions instead
# of 728 (3.8 a code instead of 5.7); routing itself, 952 instead of 1,200, of which a routed program of rank j
# runs ~550 + 26 j instead of ~798 + 26 j (store_route's 376 run in program (0, 0) alone): ~28 % fewer
# instructions a launch. act within an fp32 rounding of rows_dot's (the same integers, the fp32 sums in another
# order on a GPU), not its bytes. On since session 27: with BLOCK_N_GPU 2 the resident 16K step was 0.977x back to
# back in two paired A/Bs on an H100 (sessions 26 and 27, 5 of 5 rounds each; docs/RESULTS.md), and its bf16-level
# / graph == eager gate ([gugroups2]) passed; "no-gugroups" is the row path.
GROUPS = True
# The group path's register cap on a GPU: at 64 a one-warp program an SM takes 32 of them (the block limit), at its
# uncapped 66 only 28 (registers go by 8 a thread); capped, the routing program compiles to the same 1,056
# instructions with nothing spilled (Triton 3.6.0, sm_90).
GROUPS_MAXNREG = 64
# Rows of gate and up a program on a GPU (block_n None): 1, at one warp, the fastest of five of the row path alone
# on the H200 (docs/RESULTS.md session 19). The group path compiles to 848 instructions at 2 rows (3.3 a code, 64
# registers; 70 routing itself, 28 programs an SM: 2,304 programs are one H200 wave): 2 since session 27, with
# GROUPS (above); profile_decode's "gubn=1" is the one-row program.
BLOCK_N_GPU = 2


@triton.jit(do_not_specialize=["words_ptr", "bytes_ptr", "row_words"])
def expert_gate_up_int_kernel(pairs_ptr, xs_ptr, tables_ptr, ids_ptr, words_ptr, bytes_ptr, act_ptr, I, row_words,
                              gu_scale_at, glob_at, xg_w, xg_s, xg_g, xu_w, xu_s, xu_g, H: tl.constexpr,
                              K_ROUTED: tl.constexpr, HAS_EXTRA: tl.constexpr, BLOCK_N: tl.constexpr,
                              BLOCK_G: tl.constexpr, DECODE: tl.constexpr, USE_GDC: tl.constexpr = False,
                              logits_ptr=None, E=0, wts_out_ptr=None, ids_out_ptr=None, shared_out_ptr=None,
                              ROUTE: tl.constexpr = 0, BLOCK_E: tl.constexpr = 32, KP: tl.constexpr = 1,
                              F16: tl.constexpr = False, W_BF16: tl.constexpr = True, dn_at=0, dn_bytes=0,
                              DOWN_LINES: tl.constexpr = 0, GROUPS: tl.constexpr = False):
    """Program (j, t): expert j (0..k-1 routed, k the extra one), rows t * BLOCK_N ... of its gate and up.
    ROUTE: each routed program finds its expert, rank j of the router's 16-bit logits (route_keys.py), instead of
    reading ids[j], and program (0, 0) stores route_topk's outputs for the down launch (weights, ids, the shared
    gate's sigmoid); ROUTE 2 (a benchmark's routing trace): the rows are ids[j], the trace's, and the rank is
    still found, so that the launch does a user's work.
    DOWN_LINES > 0 (CUDA only): routed program (j, t) asks L2 for DOWN_LINES 128-byte lines of its expert's
    down codes and scales (dn_bytes from word dn_at of its row on), the programs of an expert interleaved.
    GROUPS: the dots through nvfp4_int_groups.gate_up_groups (a thread's groups its own) instead of rows_dot."""
    gdc_prologue(USE_GDC)  # PDL: x's pairs and the ids are the previous kernels' outputs
    j = tl.program_id(0)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = n < I
    rows = n.to(tl.int64)
    e_routed = tl.zeros([], dtype=tl.int64)
    if ROUTE > 0:
        if j < K_ROUTED:
            e_routed = routed_expert(logits_ptr, E, j, BLOCK_E, ids_ptr, ROUTE == 2)  # 2: the trace's row
        if j + tl.program_id(1) == 0:
            store_route(logits_ptr, wts_out_ptr, ids_out_ptr, shared_out_ptr, E, K_ROUTED, KP, BLOCK_E, F16, W_BF16)
    gate_w, up_w, gate_s, up_s, g_gate, g_up = gate_up_pointers(
        ids_ptr, words_ptr, bytes_ptr, H, I, row_words, gu_scale_at, glob_at, xg_w, xg_s, xg_g, xu_w, xu_s, xu_g, j,
        K_ROUTED, HAS_EXTRA, e_routed, ROUTE > 0)
    if GROUPS:
        gate, up = gate_up_groups(gate_w, up_w, gate_s, up_s, pairs_ptr, xs_ptr, tables_ptr, rows, mask_n, H,
                                  BLOCK_N, BLOCK_G, DECODE)
    else:
        p0, p1, p2, p3, tp0, tn0, xs = x_pair_tiles(pairs_ptr, xs_ptr, tables_ptr, H, BLOCK_N, BLOCK_G)
        gate = rows_dot(gate_w, gate_s, rows, mask_n, p0, p1, p2, p3, tp0, tn0, xs, H, BLOCK_G, DECODE)
        up = rows_dot(up_w, up_s, rows, mask_n, p0, p1, p2, p3, tp0, tn0, xs, H, BLOCK_G, DECODE)
    if DOWN_LINES > 0:
        if j < K_ROUTED:
            _prefetch_down(gate_w, dn_at, dn_bytes, DOWN_LINES)
    gate = gate * (g_gate * 0.5)  # the codes count double
    up = up * (g_up * 0.5)
    tl.store(act_ptr + j * I + n, gate / (1.0 + tl.exp(-gate)) * up, mask=mask_n)


@triton.jit
def down_lines(t, programs, down_bytes, DOWN_LINES: tl.constexpr):
    """Program t of `programs`' share of a down run of down_bytes: its 128-byte lines t, t + programs, ...; a slot
    past the run is line t again (asked twice, no line outside the run)."""
    line = t + programs * tl.arange(0, DOWN_LINES)
    return tl.where(line * 128 < down_bytes, line, t)


@triton.jit
def _prefetch_down(gate_w, dn_at, down_bytes, DOWN_LINES: tl.constexpr):
    """down_lines of this program, of the run from word dn_at of the row whose first word is gate_w, asked of L2."""
    base = (gate_w + dn_at).to(tl.pointer_type(tl.int8))
    line = down_lines(tl.program_id(1), tl.num_programs(1), down_bytes, DOWN_LINES)
    prefetch_l2(base + line.to(tl.int64) * 128, True)


def down_run(hidden: int, inter: int) -> tuple[int, int]:
    """(the word it starts at, its bytes): an expert row's down codes and scales, one run up to its globals."""
    off = _row_offsets(hidden, inter)
    return off["dn_at"], 4 * (off["glob_at"] - off["dn_at"])


def down_prefetch_lines(down_bytes: int, programs: int) -> int:
    """DOWN_LINES: the lines each of an expert's `programs` asks for, a power of 2, so that they cover its down
    run of down_bytes."""
    return triton.next_power_of_2(triton.cdiv(triton.cdiv(down_bytes, 128), programs))


def expert_gate_up_int(x: torch.Tensor, ids: torch.Tensor | None, rows: torch.Tensor, hidden: int, inter: int,
                       extra: tuple | None = None, out: torch.Tensor | None = None, *, xq: tuple | None = None,
                       block_n: int | None = None, num_warps: int = 1, decode: str | None = None,
                       route: tuple | None = None, down_prefetch: bool | None = None,
                       groups: bool | None = None) -> torch.Tensor:
    """expert_gate_up's act fp32 [k (+1), I] (its arguments, see there) through integer dots. xq: x already
    quantized (quantize_x16's (pairs, scales)); None: quantized here, one more launch. block_n (None: 1 row
    on a GPU, at one warp: the fastest of five alone on the H200, 7.93 us against expert_gate_up's 9.26, docs/
    RESULTS.md session 19; in the interpreter, whose time goes by programs, whole experts).
    route = (logits [E + 1] bf16/fp16, E, weights_out [1, k], ids_out [1, k] int64, shared_out [1] fp32): the
    routed programs find their experts (the kernel's ROUTE) from the router + shared-gate logits, and the launch
    fills the outs as route_topk would, byte for byte; ids is then None, or a benchmark trace's ids [1, k] (the
    rows from the trace, the rank still found).
    down_prefetch (None: the switch DOWN_PREFETCH; CUDA only, else ignored): the routed programs ask L2 for their
    experts' down rows (see DOWN_PREFETCH). No output byte depends on it.
    groups (None: the switch GROUPS): the dots through nvfp4_int_groups (see GROUPS); its PTX path needs the rows,
    the shared expert's words and x's pairs 16-byte aligned (the engine's containers are)."""
    if block_n is None:
        block_n = BLOCK_N_GPU if rows.is_cuda else min(64, triton.next_power_of_2(inter))
    if hidden % 16:
        raise ValueError(f"hidden must be a multiple of 16, got {hidden}")
    words, ids, routing, out, gate, up = launch_operands(ids, rows, hidden, inter, extra, out, route)
    k = ids.shape[-1]
    n = k + (extra is not None)
    pairs, xs = xq if xq is not None else quantize_x16(x.reshape(-1))
    if pairs.numel() != hidden // 2 or xs.numel() != hidden // 16:
        raise ValueError(f"xq must be quantize_x16 of {hidden} values, got {pairs.numel()} pairs")
    groups = GROUPS if groups is None else groups
    decode = decode or ("asm" if rows.is_cuda else "plain")
    if groups and decode == "asm":
        _check_group_alignment(rows, pairs, gate[0], up[0])
    off = _row_offsets(hidden, inter)
    programs = triton.cdiv(inter, block_n)
    down_prefetch = DOWN_PREFETCH if down_prefetch is None else down_prefetch
    if down_prefetch and rows.is_cuda and k > 0:  # the interpreter has no PTX to prefetch with
        dn_at, dn_bytes = down_run(hidden, inter)
        routing.update(dn_at=dn_at, dn_bytes=dn_bytes, DOWN_LINES=down_prefetch_lines(dn_bytes, programs))
    expert_gate_up_int_kernel[(n, programs)](
        pairs, xs, tables(rows.device), ids.reshape(-1).contiguous(), words, rows, out, inter, words.stride(0),
        off["gu_scale_at"], off["glob_at"], *gate, *up, H=hidden, K_ROUTED=k, HAS_EXTRA=extra is not None,
        BLOCK_N=block_n, BLOCK_G=triton.next_power_of_2(hidden // 16),
        DECODE=decode, num_warps=num_warps, GROUPS=groups, **routing, **pdl_launch(rows.device),
        **({"maxnreg": GROUPS_MAXNREG} if groups and block_n == 1 and rows.is_cuda else {}))
    return out


def launch_operands(ids: torch.Tensor | None, rows: torch.Tensor, hidden: int, inter: int, extra: tuple | None,
                    out: torch.Tensor | None, route: tuple | None) -> tuple:
    """What an experts' gate/up launch takes beside x, checked (the integer kernels' and nvfp4_mma_experts'):
    (rows as words, the ids (route's outs where the programs route themselves), route's keyword arguments, act's
    fp32 [k (+1), I] out, the shared expert's gate and up as the kernels read them, or stand-ins)."""
    words = _check(rows, hidden, inter)
    routing = route_args(route, ids)
    if route is not None:
        routing["KP"] = triton.next_power_of_2(route[3].shape[-1])
        ids = ids if ids is not None else route[3]
    n = ids.shape[-1] + (extra is not None)
    if out is None:
        out = torch.empty(n, inter, device=rows.device, dtype=torch.float32)
    elif out.shape != (n, inter) or out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError(f"out must be fp32 [{n}, {inter}] contiguous, got {tuple(out.shape)} {out.dtype}")
    gate = up = (words, rows, out)  # unused stand-ins of the right pointer types
    if extra is not None:
        gate, up = _matrix(*extra[:3]), _matrix(*extra[3:])
    return words, ids, routing, out, gate, up


def _check_group_alignment(rows: torch.Tensor, pairs: torch.Tensor, *words: torch.Tensor) -> None:
    """The group path's PTX loads 8 bytes of a row's words and 16 of x's pairs at once: rows at a 16-byte start and
    stride (quant.nvfp4_rows.padded_rows makes them so), the shared expert's words and the pairs 16-byte aligned."""
    if rows.data_ptr() % 16 or rows.stride(0) % 16:
        raise ValueError(f"the group path needs expert rows at a 16-byte start and stride (got stride "
                         f"{rows.stride(0)}): hold them as quant.nvfp4_rows.padded_rows does")
    if pairs.data_ptr() % 16 or any(w.data_ptr() % 16 for w in words):
        raise ValueError("the group path needs x's pairs and the shared expert's words 16-byte aligned")


def expert_gate_up_int_reference(x: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor, hidden: int, inter: int,
                                 extra: tuple | None = None, qmax: int = 32767) -> torch.Tensor:
    """expert_gate_up_int's arithmetic in torch: each expert's gate and up through gemv_int_reference (x's blocks
    to qmax: nvfp4_mma_experts' reference is this one at nvfp4_hilo.QMAX)."""
    xf = x.reshape(-1)
    mats = [unpack_nvfp4_expert(rows[e], hidden, inter)[:2] for e in ids.reshape(-1).tolist()]
    if extra is not None:
        mats.append((tuple(extra[:3]), tuple(extra[3:])))
    act = []
    for (gp, gs, gg), (upk, us, ug) in mats:
        g = gemv_int_reference(gp, gs, gg, xf, qmax)
        u = gemv_int_reference(upk, us, ug, xf, qmax)
        act.append(F.silu(g) * u)
    return torch.stack(act)
