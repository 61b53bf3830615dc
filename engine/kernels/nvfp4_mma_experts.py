"""The batch-1 experts' gate/up (nvfp4_int_experts.expert_gate_up_int) on the integer tensor cores (nvfp4_mma).

Why: the integer gate/up is the step's second-largest bar (40 launches, ~7.9 us each for ~3.6 us of a plain read
of their 10.6 MB, docs/RESULTS.md session 22) at 3.3-5.7 SASS instructions a code and 4,608 one-warp programs
that each route themselves. Here a program of W warps does one MMA tile of 16 rows: tile rows g = gate rows
8 t ... 8 t + 7 of its expert and rows g + 8 = the same up rows, so that lane (g, 0) ends with both sums of
output 8 t + g and stores act = SiLU(gate) * up itself. Warp p takes the part p of K (nvfp4_mma.tile_sums), and
the parts add in a fixed order (nvfp4_mma.part_sums). 2.0-2.4 instructions a code before routing (1, 2 or 4
warps; scripts/sass_nvfp4_mma.py), 9 x I / 8 programs (576 for the real geometry at I 512), each warp routing
itself once (route_keys) where the experts are resident.

act[j] = SiLU(g) * u, g and u each the sum over 16-code groups of (exact integer dot) * E4M3 scale * x's block
scale in the tile's fixed order, times the global / 2; x in nvfp4_hilo's int16 blocks (|q| <= 32639, high and
low bytes), made by router_norm(quantize="hilo") or quantize_hilo. Not expert_gate_up_int's bytes: its x
blocks are scaled to 32767 and its sums go in another order (act within ~2e-4 of the fp32 reference, relative
to its largest). DECODE "plain" (the interpreter) gives the PTX path's bytes (the GPU tier checks it).
Reference: expert_gate_up_mma_reference (the same integers; the fp32 sums in torch's order).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import gdc_prologue, pdl_launch
from .nvfp4_expert_rows import gate_up_pointers
from .nvfp4_experts_decode import _row_offsets
from .nvfp4_int_dot import tables
from .nvfp4_int_experts import expert_gate_up_int_reference, launch_operands
from . import nvfp4_mma
from .nvfp4_hilo import QMAX, quantize_hilo
from .nvfp4_mma import check_alignment, pairs_fit, part_sums, steps_groups, thread_ids, tile_sums, zeros
from .route_keys import WARP_EXPERTS, routed_expert, routed_expert_warps, store_route

# The fused step's NVFP4 experts' gate/up through expert_gate_up_mma (moe_fused._gate_up), x's bytes from the
# router's launch: act within x's int16 blocks of the integer kernel's, not its bytes. Off: its GPU A/B (profile_
# decode arm "gumma", docs/RESULTS.md session 26, H100) made the resident 16K step 1.043x (5 of 5 rounds; 2 warps
# 1.056x); nvfp4_mma.PAIRS (its loads) not measured yet.
ON = False
# Warps a program on a GPU (each a part of K): 4 make the real gate/up 2,304 warps of ~450 instructions in one
# wave (576 programs at 76 registers a thread); profile_decode's "guwarps=".
WARPS = 4


def takes(hidden: int, device: torch.device) -> bool:
    """ON, and the hidden size in whole 64-code blocks of every warp's part on this device."""
    return ON and hidden % (64 * (WARPS if device.type == "cuda" else 1)) == 0


@triton.jit(do_not_specialize=["words_ptr", "bytes_ptr", "row_words"])
def expert_gate_up_mma_kernel(hl_ptr, xs_ptr, zeros_ptr, tables_ptr, ids_ptr, words_ptr, bytes_ptr, act_ptr, I,
                              row_words, gu_scale_at, glob_at, xg_w, xg_s, xg_g, xu_w, xu_s, xu_g, H: tl.constexpr,
                              K_ROUTED: tl.constexpr, HAS_EXTRA: tl.constexpr, G: tl.constexpr, W: tl.constexpr,
                              DECODE: tl.constexpr, USE_GDC: tl.constexpr = False, logits_ptr=None, E=0,
                              wts_out_ptr=None, ids_out_ptr=None, shared_out_ptr=None, ROUTE: tl.constexpr = 0,
                              BLOCK_E: tl.constexpr = 32, KP: tl.constexpr = 1, F16: tl.constexpr = False,
                              W_BF16: tl.constexpr = True, WARP_ROUTE: tl.constexpr = False,
                              PAIRS: tl.constexpr = False):
    """Program (j, t): expert j (0..k-1 routed, k the extra one), outputs 8 t ... 8 t + 7 of its act. ROUTE as
    expert_gate_up_int_kernel's: the routed programs find their expert (rank j of the router's 16-bit logits),
    program (k, 0) (the shared expert's; (0, 0) without one) stores route_topk's outputs; ROUTE 2: a benchmark
    trace's rows. WARP_ROUTE (E <= 256, k <= 8): the rank found by every warp alone (route_keys.
    routed_expert_warps)."""
    gdc_prologue(USE_GDC)  # PDL: x's bytes and the ids are the previous kernels' outputs
    j = tl.program_id(0)
    e_routed = tl.zeros([], dtype=tl.int64)
    if ROUTE > 0:
        if j < K_ROUTED:
            if WARP_ROUTE:  # each warp alone (REDUX a round), not a cross-warp max and barrier a round
                e_routed = routed_expert_warps(logits_ptr, E, j, W, DECODE, ids_ptr, ROUTE == 2)
            else:
                e_routed = routed_expert(logits_ptr, E, j, BLOCK_E, ids_ptr, ROUTE == 2)  # 2: the trace's row
        # route_topk's outs from a program that does not route itself (the shared expert's first) where there is
        # one: at W warps store_route's rounds take a cross-warp max and a barrier each
        if (j == (K_ROUTED if HAS_EXTRA else 0)) & (tl.program_id(1) == 0):
            store_route(logits_ptr, wts_out_ptr, ids_out_ptr, shared_out_ptr, E, K_ROUTED, KP, BLOCK_E, F16, W_BF16)
    gate_w, up_w, gate_s, up_s, g_gate, g_up = gate_up_pointers(
        ids_ptr, words_ptr, bytes_ptr, H, I, row_words, gu_scale_at, glob_at, xg_w, xg_s, xg_g, xu_w, xu_s, xu_g, j,
        K_ROUTED, HAS_EXTRA, e_routed, ROUTE > 0)
    tid = thread_ids(W, DECODE)
    n = tl.program_id(1) * 8 + ((tid & 31) >> 2)
    r = tl.minimum(n, I - 1).to(tl.int64)
    gate, up = tile_sums(gate_w + r * (H // 8), up_w + r * (H // 8), gate_s + r * (H // 16), up_s + r * (H // 16),
                         hl_ptr, xs_ptr, zeros_ptr, tables_ptr, tid, H, G, W, DECODE, PAIRS)
    gate = part_sums(gate, W) * (g_gate * 0.5)  # the codes count double
    up = part_sums(up, W) * (g_up * 0.5)
    lane = tl.arange(0, 32)  # the parts' sums by element: element e is thread e (the layout the tile's code checks)
    out = tl.program_id(1) * 8 + (lane >> 2)
    tl.store(act_ptr + j * I + out, gate / (1.0 + tl.exp(-gate)) * up, mask=((lane & 3) == 0) & (out < I))


def expert_gate_up_mma(x: torch.Tensor, ids: torch.Tensor | None, rows: torch.Tensor, hidden: int, inter: int,
                       extra: tuple | None = None, out: torch.Tensor | None = None, *, xq: tuple | None = None,
                       warps: int | None = None, decode: str | None = None, route: tuple | None = None,
                       pairs: bool | None = None) -> torch.Tensor:
    """expert_gate_up_int's act fp32 [k (+1), I] (its arguments, see there) on the integer tensor cores. xq: x
    already quantize_hilo'd (router_norm(quantize="hilo")); None: quantized here, one more launch. warps (None:
    WARPS on a GPU, 1 in the interpreter, whose time goes by programs): a program's warps, each a part of K.
    route: as expert_gate_up_int's (the routed programs find their experts and fill route_topk's outs).
    pairs (None: nvfp4_mma.PAIRS): the quads' contiguous layout where it fits (nvfp4_mma.pairs_fit)."""
    warps = warps or (WARPS if rows.is_cuda else 1)
    G = steps_groups(hidden, warps)
    words, ids, routing, out, gate, up = launch_operands(ids, rows, hidden, inter, extra, out, route)
    if route is not None:
        routing["WARP_ROUTE"] = route[1] <= WARP_EXPERTS and ids.shape[-1] <= 8
    k = ids.shape[-1]
    n = k + (extra is not None)
    hl, xs = xq if xq is not None else quantize_hilo(x.reshape(-1))
    if hl.numel() != 2 * hidden or xs.numel() != hidden // 16:
        raise ValueError(f"xq must be quantize_hilo of {hidden} values, got {hl.numel()} bytes")
    decode = decode or ("asm" if rows.is_cuda else "plain")
    if decode == "asm":
        if rows.stride(0) % 16:
            raise ValueError(f"the MMA tile needs expert rows at a 16-byte stride (got {rows.stride(0)}): hold "
                             "them as quant.nvfp4_rows.padded_rows does")
        check_alignment(rows, hl, xs, gate[0], up[0])
    off = _row_offsets(hidden, inter)
    expert_gate_up_mma_kernel[(n, triton.cdiv(inter, 8))](
        hl, xs, zeros(rows.device), tables(rows.device), ids.reshape(-1).contiguous(), words, rows, out, inter,
        words.stride(0), off["gu_scale_at"], off["glob_at"], *gate, *up, H=hidden, K_ROUTED=k,
        HAS_EXTRA=extra is not None, G=G, W=warps, DECODE=decode, num_warps=warps, enable_fp_fusion=False,
        PAIRS=(nvfp4_mma.PAIRS if pairs is None else pairs) and pairs_fit(hidden, warps), **routing,
        **pdl_launch(rows.device))
    return out


def expert_gate_up_mma_reference(x: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor, hidden: int, inter: int,
                                 extra: tuple | None = None) -> torch.Tensor:
    """expert_gate_up_mma's arithmetic in torch: the integer kernel's reference with x's blocks to nvfp4_hilo.QMAX."""
    return expert_gate_up_int_reference(x, ids, rows, hidden, inter, extra, QMAX)
