"""The batch-1 NVFP4 expert kernels with a row read as int64 words, one per 16-code scale group (the lm_head
GEMV's tile, gemv_codes.nvfp4_block), over rows at an 8-byte stride and start (the engine holds them at 16:
quant/nvfp4_rows.nvfp4_expert_row_stride).

Why: expert_gate_up spends ~10 sm_90 SASS instructions a code at its launch (2 gate + 2 up rows, 4 warps), of
which the decode and the FMAs are ~4.2; the rest is a program's fixed work spread over only 64 codes a thread:
x brought to each thread through shared memory (37 barriers), its bf16 -> fp32 repacking, the reductions.
Here x is loaded as a tile of the words' own shape (a zero stride over the rows, so the compiler gives each
thread the x of its own columns once, with no exchange) and the gate and up rows are one tile of 2 * block_n
rows, so a thread holds 128 codes at 2 warps: ~6.2 instructions a code where nvfp4_experts_decode's kernel
has ~10 (scripts/sass_expert_loads.py). The GPU A/B decides (the switch GROUPS, off until then).

Same math as nvfp4_experts_decode / nvfp4_experts_parts (same outputs, references and callers: the two
wrappers there dispatch here), another order of fp32 sums, so other bytes: every row container of an engine
takes the same kernel (all are at the 16-byte stride). A row's sum: each group's 16 codes in one FMA chain,
times its E4M3 scale, then the groups summed over the tile in a fixed order (deterministic, no atomics).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import gdc_prologue, pdl_launch
from .nvfp4_expert_rows import e2m1_pair, e4m3

# Off until the paired A/B on the GPU (profile_decode arm "groups", scripts/bench_nvfp4_experts_decode.py
# --grids groups).
GROUPS = False


@triton.jit
def groups_dot(x_ptr, wrow, srow, mask_r, K: tl.constexpr, CHUNK: tl.constexpr, CHUNKS: tl.constexpr,
               DECODE: tl.constexpr, ROW_MASK: tl.constexpr):
    """sum over K of dequant(W[r]) * x * 2^-14 for R rows given by their int64 group words wrow [R] (pointers)
    and E4M3 scale bytes srow [R]: fp32 [R]. The tile [R, CHUNKS, CHUNK] of groups; x [K] (any float dtype).
    mask_r [R]: the valid rows, read only where ROW_MASK."""
    G: tl.constexpr = K // 16
    EVEN: tl.constexpr = CHUNKS * CHUNK == G
    g = tl.arange(0, CHUNK)
    grp = (tl.arange(0, CHUNKS) * CHUNK)[:, None] + g[None, :]  # [CHUNKS, CHUNK]
    # The same groups, seen as runs of 2 (an int64 pair is one 16 B load), so the scale bytes get the words'
    # layout (gemv_codes.nvfp4_block).
    grp2 = (tl.arange(0, CHUNKS) * CHUNK)[:, None] + ((g // 2) * 2 + g % 2)[None, :]
    rows0 = tl.zeros([wrow.shape[0], 1, 1], dtype=tl.int32)  # x's zero stride over the rows: the tile's layout
    xs = x_ptr + 16 * (grp[None, :, :] + rows0)
    if EVEN and not ROW_MASK:  # (a row mask, even one constant along the row, costs the 16-byte loads)
        words = tl.load(wrow[:, None, None] + grp[None, :, :])
        scale = tl.load(srow[:, None, None] + grp2[None, :, :])
    elif EVEN:
        words = tl.load(wrow[:, None, None] + grp[None, :, :], mask=mask_r[:, None, None], other=0)
        scale = tl.load(srow[:, None, None] + grp2[None, :, :], mask=mask_r[:, None, None], other=0)
    else:
        mask_g = (grp < G)[None, :, :]
        words = tl.load(wrow[:, None, None] + grp[None, :, :], mask=mask_r[:, None, None] & mask_g, other=0)
        scale = tl.load(srow[:, None, None] + grp2[None, :, :], mask=mask_r[:, None, None] & mask_g, other=0)
        mask_x = mask_g & (rows0 == 0)
    lo = words.to(tl.int32)  # codes 0-7 of the group
    hi = (words >> 32).to(tl.int32)  # codes 8-15
    part = tl.zeros(words.shape, dtype=tl.float32)
    for c in tl.static_range(4):  # one FMA chain of 16 codes a group
        for half in tl.static_range(2):
            a, b = e2m1_pair(lo if half == 0 else hi, c, DECODE)
            at = xs + (8 * half + c)
            if EVEN:
                xa = tl.load(at).to(tl.float32)
                xb = tl.load(at + 4).to(tl.float32)
            else:
                xa = tl.load(at, mask=mask_x, other=0.0).to(tl.float32)
                xb = tl.load(at + 4, mask=mask_x, other=0.0).to(tl.float32)
            part += a * xa
            part += b * xb
    return tl.sum(tl.sum(part * e4m3(scale, DECODE), axis=2), axis=1)


@triton.jit
def expert_gate_up_groups_kernel(x_ptr, ids_ptr, w64_ptr, w32_ptr, bytes_ptr, act_ptr, gu_scale_at, glob_at,
                                 xg_w, xg_s, xg_g, xu_g, xu_w_at, xu_s_at, H: tl.constexpr, I: tl.constexpr,
                                 ROW_BYTES: tl.constexpr, K_ROUTED: tl.constexpr, HAS_EXTRA: tl.constexpr,
                                 BLOCK_N: tl.constexpr, CHUNK: tl.constexpr, CHUNKS: tl.constexpr,
                                 DECODE: tl.constexpr, USE_GDC: tl.constexpr = False):
    """Program (j, b): act[j, b * BLOCK_N + n] = SiLU(gate . x) * (up . x) for expert j (routed: row ids[j];
    j = K_ROUTED with HAS_EXTRA: the shared expert's own matrices, its up matrix xu_w_at words / xu_s_at bytes
    from its gate's); its gate and up rows as one tile. K_ROUTED 0 needs HAS_EXTRA (the shared expert alone)."""
    gdc_prologue(USE_GDC)  # PDL: nothing is read before the previous kernel ends
    G: tl.constexpr = H // 16
    ROW_MASK: tl.constexpr = I % BLOCK_N != 0
    j = tl.program_id(0)
    r = tl.arange(0, 2 * BLOCK_N)
    is_up = r >= BLOCK_N
    n = tl.program_id(1) * BLOCK_N + tl.where(is_up, r - BLOCK_N, r)
    # The compiler proves a row's 16-byte runs (one load for two group words) through products and sums, not
    # through a select (tl.where) or a base pointer chosen at run time: hence up = 0 / 1 times the up offset,
    # and the tile code twice.
    up = is_up.to(tl.int64)
    if HAS_EXTRA and j == K_ROUTED:
        acc = groups_dot(x_ptr, xg_w + (n * G + up * xu_w_at), xg_s + (n * G + up * xu_s_at), n < I, H, CHUNK,
                         CHUNKS, DECODE, ROW_MASK)
        g_gate, g_up = tl.load(xg_g), tl.load(xu_g)
    else:
        e = tl.load(ids_ptr + j).to(tl.int64)  # j < K_ROUTED here
        rows = n * G + up * (I * G)  # gate rows 0..I-1 of gate_up, up rows I..2I-1
        acc = groups_dot(x_ptr, w64_ptr + e * (ROW_BYTES // 8) + rows,
                         bytes_ptr + e * ROW_BYTES + gu_scale_at + rows, n < I, H, CHUNK, CHUNKS, DECODE, ROW_MASK)
        g_gate = tl.load(w32_ptr + e * (ROW_BYTES // 4) + glob_at).to(tl.float32, bitcast=True)
        g_up = tl.load(w32_ptr + e * (ROW_BYTES // 4) + glob_at + 1).to(tl.float32, bitcast=True)
    gate, up = tl.split(tl.permute(tl.reshape(acc, [2, BLOCK_N]), [1, 0]))
    gate = gate * (g_gate * 16384.0)  # 2^14: the codes' scaling, exact
    up = up * (g_up * 16384.0)
    out = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(act_ptr + j * I + out, gate / (1.0 + tl.exp(-gate)) * up, mask=out < I)


@triton.jit
def expert_down_parts_groups_kernel(act_ptr, wts_ptr, ids_ptr, w64_ptr, w32_ptr, bytes_ptr, parts_ptr, dn_at,
                                    dn_scale_at, glob_at, xd_w, xd_s, xd_g, extra_scale_ptr, addend_ptr,
                                    H: tl.constexpr, I: tl.constexpr, ROW_BYTES: tl.constexpr,
                                    K_ROUTED: tl.constexpr, HAS_EXTRA: tl.constexpr, HAS_EXTRA_SCALE: tl.constexpr,
                                    HAS_ADDEND: tl.constexpr, BLOCK_M: tl.constexpr, CHUNK: tl.constexpr,
                                    CHUNKS: tl.constexpr, DECODE: tl.constexpr, USE_GDC: tl.constexpr = False):
    """Program (b, j): parts[j, m] for outputs m of tile b: weights[j] * (down_j . act[j]) for a routed expert
    (row ids[j]); for j = K_ROUTED the shared expert's down (times extra_scale), or the addend, or zeros.
    dn_at: the down codes' start in int64 words."""
    gdc_prologue(USE_GDC)  # PDL: nothing is read before the previous kernel ends
    G: tl.constexpr = I // 16
    ROW_MASK: tl.constexpr = H % BLOCK_M != 0
    j = tl.program_id(1)
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = m < H
    if j < K_ROUTED:
        e = tl.load(ids_ptr + j).to(tl.int64)
        y = groups_dot(act_ptr + j * I, w64_ptr + e * (ROW_BYTES // 8) + dn_at + m * G,
                       bytes_ptr + e * ROW_BYTES + dn_scale_at + m * G, mask_m, I, CHUNK, CHUNKS, DECODE, ROW_MASK)
        g_down = tl.load(w32_ptr + e * (ROW_BYTES // 4) + glob_at + 2).to(tl.float32, bitcast=True) * 16384.0
        out = y * (tl.load(wts_ptr + j).to(tl.float32) * g_down)
    else:
        out = tl.zeros([BLOCK_M], dtype=tl.float32)
        if HAS_EXTRA:
            y = groups_dot(act_ptr + K_ROUTED * I, xd_w + m * G, xd_s + m * G, mask_m, I, CHUNK, CHUNKS, DECODE,
                           ROW_MASK)
            y_scale = tl.load(xd_g) * 16384.0
            if HAS_EXTRA_SCALE:
                y_scale = tl.load(extra_scale_ptr).to(tl.float32) * y_scale
            out = y * y_scale
        if HAS_ADDEND:
            out = tl.load(addend_ptr + m, mask=mask_m, other=0.0).to(tl.float32)
    tl.store(parts_ptr + j * H + m, out, mask=mask_m)


def groups_rows(rows: torch.Tensor, groups: bool | None) -> bool:
    """Whether a launch over these rows takes the group-word kernels: groups=None follows GROUPS; either way only
    rows at an 8-byte stride and start can (else the caller's 4-byte kernels)."""
    aligned = rows.stride(0) % 8 == 0 and rows.shape[1] % 8 == 0 and rows.data_ptr() % 8 == 0
    return aligned and (GROUPS if groups is None else groups)


MAX_CHUNK = 64  # group words across a row a step: 2 (16 B) a thread of a warp


def _chunks(k_in: int, chunk: int | None) -> tuple[int, int]:
    """(CHUNK, CHUNKS): CHUNK group words across a row a step (at most MAX_CHUNK), CHUNKS steps of them covering
    the K / 16 groups."""
    groups = k_in // 16
    chunk = min(chunk or MAX_CHUNK, triton.next_power_of_2(groups))
    return chunk, triton.next_power_of_2(triton.cdiv(groups, chunk))


def _group_words(packed: torch.Tensor) -> torch.Tensor:
    """A QuantLinear's NVFP4 codes [N, K/2] as int64 words [N, K/16] (a 16-code group each)."""
    packed = packed.contiguous()
    if packed.data_ptr() % 8:
        raise ValueError("NVFP4 codes must start on an 8-byte boundary for the group-word kernels")
    return packed.view(torch.int64)


def extra_matrix(packed: torch.Tensor, scale: torch.Tensor, scale2: torch.Tensor) -> tuple:
    """The shared expert's (codes as group words, scale bytes, fp32 global) for these kernels."""
    return (_group_words(packed), scale.contiguous().view(torch.uint8), scale2.reshape(1).to(torch.float32))


def gate_up_groups(x: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor, words: torch.Tensor, hidden: int,
                   inter: int, off: dict, extra: tuple | None, out: torch.Tensor, decode: str, *,
                   block_n: int | None = None, num_warps: int | None = None, chunk: int | None = None
                   ) -> torch.Tensor:
    """expert_gate_up (nvfp4_experts_decode) over group words: the same arguments there, rows uint8 and words
    their int32 view, off its _row_offsets. block_n: 2 on a GPU (whole experts in the interpreter)."""
    k = ids.shape[-1]
    n = k + (extra is not None)
    if block_n is None:
        block_n = 2 if rows.is_cuda else min(64, triton.next_power_of_2(inter))
    shared = (rows.view(torch.int64), rows, out, out, 0, 0)  # unused stand-ins of the right types
    if extra is not None:
        (gw, gs, gg), (uw, us, ug) = extra_matrix(*extra[:3]), extra_matrix(*extra[3:])
        # the up matrix as offsets from the gate's (element sizes 8 and 1)
        shared = (gw, gs, gg, ug, (uw.data_ptr() - gw.data_ptr()) // 8, us.data_ptr() - gs.data_ptr())
    chunk, chunks = _chunks(hidden, chunk)
    expert_gate_up_groups_kernel[(n, triton.cdiv(inter, block_n))](
        x.reshape(-1).contiguous(), ids.reshape(-1).contiguous(), rows.view(torch.int64), words, rows, out,
        off["gu_scale_at"], off["glob_at"], *shared, H=hidden, I=inter, ROW_BYTES=rows.stride(0), K_ROUTED=k,
        HAS_EXTRA=extra is not None, BLOCK_N=block_n, CHUNK=chunk, CHUNKS=chunks, DECODE=decode,
        num_warps=num_warps or 2, **pdl_launch(x.device))
    return out


def down_parts_groups(act: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor,
                      words: torch.Tensor, hidden: int, inter: int, off: dict, extra: tuple | None,
                      extra_scale: torch.Tensor | None, addend: torch.Tensor | None, out: torch.Tensor,
                      experts: int, decode: str, *, block_m: int | None = None, num_warps: int | None = None,
                      chunk: int | None = None) -> torch.Tensor:
    """expert_down_parts (nvfp4_experts_parts) over group words, its arguments checked there; experts: the
    grid's experts (k + 1, or k with write_shared off)."""
    if block_m is None:
        block_m = 16 if act.is_cuda else min(64, triton.next_power_of_2(hidden))
    down = extra_matrix(*extra) if extra is not None else (rows.view(torch.int64), rows, act)
    chunk, chunks = _chunks(inter, chunk)
    expert_down_parts_groups_kernel[(triton.cdiv(hidden, block_m), experts)](
        act.contiguous(), weights.reshape(-1).contiguous(), ids.reshape(-1).contiguous(), rows.view(torch.int64),
        words, rows, out, off["dn_at"] // 2, off["dn_scale_at"], off["glob_at"], *down,
        extra_scale.reshape(-1) if extra_scale is not None else act,
        addend.reshape(-1).contiguous() if addend is not None else act, H=hidden, I=inter,
        ROW_BYTES=rows.stride(0), K_ROUTED=ids.shape[-1], HAS_EXTRA=extra is not None,
        HAS_EXTRA_SCALE=extra_scale is not None, HAS_ADDEND=addend is not None, BLOCK_M=block_m, CHUNK=chunk,
        CHUNKS=chunks, DECODE=decode, num_warps=num_warps or 2, **pdl_launch(act.device))
    return out
