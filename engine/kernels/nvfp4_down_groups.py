"""The MoE down rows' dots with each thread owning whole 16-code groups: no layout conversion in the program.

Why: expert_down_parts' tile (nvfp4_expert_rows.rows_part: words, x tiles, scale bytes laid out by their own
loads, then pair sums and a group reshape) is ~1,950 SASS instructions a 2-warp program of 16 rows under the
H200's Triton 3.6.0, 15.3 a code (docs/RESULTS.md session 19), and the launch takes 6.5 us a layer for 5.4 MB
(2.6 us is a plain read of them in the same PDL chain, session 21). Here element (m, g) of the [BLOCK_M, BLOCK_G]
tile is row m's group g: one inline PTX block loads its two code words (8 bytes), its 16 activations (four
16-byte loads: the same for every row, L1 hits) and its scale byte, turns the codes into fp16 pairs by bit
placement (nvfp4_expert_rows.e2m1_pair's: E2M1 * 2^-14, exact), each half to fp32, and chains 16 FMAs in a
fixed order. No tl.load takes part, so no layout is imposed and none converted.
PRELOAD (nvfp4_experts_parts.PRELOAD): the same block in two, LOAD_PTX (the code words and scale byte, issued
before the launch's PDL wait) and CHAIN_PTX (the activations and the FMAs, after it), the same chains.

Arithmetic (both paths): partial(m, g) = the FMA chain over codes 16g + (0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13,
10, 14, 11, 15) of decode * act, from 0; times the group's E4M3 scale; summed over g in the tile's order.
rows_part's products, in another order of the sums: an fp32 rounding's difference, not its bytes.
DECODE "plain" (Triton's interpreter, or the GPU for the byte check) does the same with tl.load, the same bit
placement and tl.fma in the same order: the same chains on one device; the sum over a row's groups follows the
tile's layout, which the plain form's tl.loads choose (within an fp32 rounding of the PTX path's). The PTX path
needs the code rows 8-byte aligned and the activations 16-byte aligned (the engine's row containers and act
buffers are).
Reference: nvfp4_experts_parts.expert_down_parts_reference (dequantized, fp32 matmul).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .nvfp4_expert_rows import down_matrix, e2m1_pair


def _pair_ptx(word: str, c: int) -> str:
    """Codes c and c + 4 of a word register -> fp16 halves in h (E2M1 * 2^-14; e2m1_pair's bit placement)."""
    if c < 3:
        return (f"shl.b32 t, {word}, {12 - 4 * c}; and.b32 t, t, 0x80008000; shl.b32 h, {word}, {9 - 4 * c}; "
                f"and.b32 h, h, 0x0E000E00; or.b32 h, h, t;\n")
    return f"and.b32 t, {word}, 0x80008000; shr.b32 h, {word}, 3; and.b32 h, h, 0x0E000E00; or.b32 h, h, t;\n"


def _group_ptx(preloaded: bool = False) -> str:
    """The group's PTX: its loads, the 16 FMAs. preloaded: the code words come in as operands $1, $2 (LOAD_PTX's,
    loaded before the PDL wait) and the block loads only the activations ($3)."""
    if preloaded:
        words, acts = ("$1", "$2"), "$3"
        body = ["{ .reg .b32 h, t; .reg .b16 l, u; .reg .f32 v, a<16>;"]
    else:
        words, acts = ("w0", "w1"), "$3"
        body = ["{ .reg .b32 w0, w1, h, t; .reg .b16 l, u, sb; .reg .f32 v, a<16>;", "ld.global.v2.b32 {w0, w1}, [$2];"]
    body += [f"ld.global.v4.f32 {{a0, a1, a2, a3}}, [{acts}]; ld.global.v4.f32 {{a4, a5, a6, a7}}, [{acts}+16];",
             f"ld.global.v4.f32 {{a8, a9, a10, a11}}, [{acts}+32]; ld.global.v4.f32 {{a12, a13, a14, a15}}, [{acts}+48];"]
    if not preloaded:
        body.append("ld.global.u8 sb, [$4]; cvt.u32.u16 $1, sb;")
    body.append("mov.f32 $0, 0f00000000;")
    for half, word in enumerate(words):
        for c in range(4):
            body.append(_pair_ptx(word, c) + "mov.b32 {l, u}, h;")
            for code, reg in ((c, "l"), (c + 4, "u")):
                body.append(f"cvt.f32.f16 v, {reg}; fma.rn.f32 $0, v, a{8 * half + code}, $0;")
    return "\n".join(body) + "}"


GROUP_PTX = tl.constexpr(_group_ptx())  # $0 the chain's sum, $1 the scale byte; $2 codes, $3 acts, $4 the scale
CHAIN_PTX = tl.constexpr(_group_ptx(preloaded=True))  # $0 the chain's sum; $1, $2 the code words, $3 acts
# A group's code words and scale byte alone: $0, $1 the words, $2 the scale byte; $3 codes, $4 the scale
LOAD_PTX = tl.constexpr("{ .reg .b16 sb; ld.global.v2.b32 {$0, $1}, [$3]; ld.global.u8 sb, [$4]; "
                        "cvt.u32.u16 $2, sb; }")


@triton.jit
def _group_asm(cw, ap, sp):
    b = tl.pointer_type(tl.int8)  # the operands are broadcast together: one pointer type for all
    # not pure: its loads must stay after the PDL wait (gdc_prologue), where gate/up's act is visible
    return tl.inline_asm_elementwise(GROUP_PTX, "=f,=r,l,l,l", [cw.to(b), ap.to(b), sp.to(b)],
                                     dtype=(tl.float32, tl.int32), is_pure=False, pack=1)


@triton.jit
def _group_plain(cw, ap, sp):
    """_group_asm's values through tl.load, the same bit placement and FMAs in the same order."""
    w0, w1, sb = _load_plain(cw, sp)
    return _chain_plain(w0, w1, ap), sb


@triton.jit
def _load_plain(cw, sp):
    """_load_asm's values through tl.load: a group's two code words and its scale byte."""
    return tl.load(cw), tl.load(cw + 1), tl.load(sp).to(tl.int32) & 0xFF


@triton.jit
def _load_asm(cw, sp):
    b = tl.pointer_type(tl.int8)
    # not pure: the PRELOAD path issues these before the PDL wait (gdc_prologue), and they must stay there
    return tl.inline_asm_elementwise(LOAD_PTX, "=r,=r,=r,l,l", [cw.to(b), sp.to(b)],
                                     dtype=(tl.int32, tl.int32, tl.int32), is_pure=False, pack=1)


@triton.jit
def _chain_asm(w0, w1, ap):
    # not pure: its activation loads must stay after the PDL wait
    return tl.inline_asm_elementwise(CHAIN_PTX, "=f,r,r,l", [w0, w1, ap.to(tl.pointer_type(tl.int8))],
                                     dtype=tl.float32, is_pure=False, pack=1)


@triton.jit
def _chain_plain(w0, w1, ap):
    """_chain_asm's value (and _group_plain's): the chain over the given words, tl.load for the activations."""
    acc = tl.zeros(w0.shape, dtype=tl.float32)
    for half in tl.static_range(2):
        word = w0 if half == 0 else w1
        for c in tl.static_range(4):
            lo, hi = e2m1_pair(word, c, "fp16")  # the bit placement the PTX does, then fp16 -> fp32
            acc = tl.fma(lo, tl.load(ap + 8 * half + c), acc)
            acc = tl.fma(hi, tl.load(ap + 8 * half + c + 4), acc)
    return acc


@triton.jit
def scale_values(sb):
    """E4M3 scale bytes (int32 holding the byte) as fp32."""
    return sb.to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)


@triton.jit
def load_words(cw, sp, DECODE: tl.constexpr):
    """Groups' two code words and scale byte at cw / sp (any tile shape): the PTX block or its tl.load form."""
    if DECODE == "asm":
        w0, w1, sb = _load_asm(cw, sp)
    else:
        w0, w1, sb = _load_plain(cw, sp)
    return w0, w1, sb


@triton.jit
def chains(w0, w1, ap, DECODE: tl.constexpr):
    """Groups' 16-FMA chains over the given words against the activations at ap (any tile shape)."""
    if DECODE == "asm":
        part = _chain_asm(w0, w1, ap)
    else:
        part = _chain_plain(w0, w1, ap)
    return part


@triton.jit
def _scaled_sum(part, sb, mask_m, mask_g):
    """The rows' sums over their groups of the chains times the groups' E4M3 scale bytes (masked ones add 0)."""
    scaled = part * scale_values(sb)
    return tl.sum(tl.where(mask_m[:, None] & mask_g[None, :], scaled, 0.0), axis=1)


@triton.jit
def _group_tile(m, mask_m, I, BLOCK_G: tl.constexpr):
    """rows_groups' tile: (row r [BLOCK_M, 1], group g [1, BLOCK_G], mask of the groups); masked rows and groups
    point at row 0 / group 0."""
    grp = tl.arange(0, BLOCK_G)
    mask_g = grp < I // 16
    return tl.where(mask_m, m, 0).to(tl.int64)[:, None], tl.where(mask_g, grp, 0)[None, :], mask_g


@triton.jit
def _group_weights(w_ptr, s_ptr, r, g, I):
    """The tile's pointers into the matrix: each group's first code word, its scale byte."""
    return w_ptr + r * (I // 8) + 2 * g, s_ptr + r * (I // 16) + g


@triton.jit
def load_groups(w_ptr, s_ptr, m, mask_m, I, BLOCK_G: tl.constexpr, DECODE: tl.constexpr):
    """Rows m's code words and scale bytes as rows_groups' tile, without the activations: (word 0, word 1,
    scale byte) int32 [BLOCK_M, BLOCK_G], for a program that loads its weights before its PDL wait
    (rows_groups_loaded takes them after it)."""
    r, g, _ = _group_tile(m, mask_m, I, BLOCK_G)
    cw, sp = _group_weights(w_ptr, s_ptr, r, g, I)
    return load_words(cw, sp, DECODE)


@triton.jit
def rows_groups_loaded(w0, w1, sb, m, mask_m, act_ptr, I, BLOCK_G: tl.constexpr, DECODE: tl.constexpr):
    """rows_groups' value with the words and scale bytes given (load_groups'): the same chains, the same sum."""
    r, g, mask_g = _group_tile(m, mask_m, I, BLOCK_G)
    ap = act_ptr + 16 * g + 0 * r
    return _scaled_sum(chains(w0, w1, ap, DECODE), sb, mask_m, mask_g)


@triton.jit
def rows_groups(w_ptr, s_ptr, m, mask_m, act_ptr, I, BLOCK_G: tl.constexpr, DECODE: tl.constexpr):
    """sum over the 16-code groups of (the group's FMA chain) * E4M3 scale, fp32 [BLOCK_M], for rows m of an
    NVFP4 matrix [*, I] (int32 words at w_ptr, I / 8 a row; scale bytes at s_ptr, I / 16 a row) against the
    activations at act_ptr (I fp32). Masked rows and groups past I / 16 read row 0 / group 0 and add 0."""
    r, g, mask_g = _group_tile(m, mask_m, I, BLOCK_G)
    cw, sp = _group_weights(w_ptr, s_ptr, r, g, I)
    ap = act_ptr + 16 * g + 0 * r  # the tile's shape for every operand: one layout, none converted
    if DECODE == "asm":
        part, sb = _group_asm(cw, ap, sp)
    else:
        part, sb = _group_plain(cw, ap, sp)
    return _scaled_sum(part, sb, mask_m, mask_g)


@triton.jit
def routed_down_groups(act_ptr, wts_ptr, ids_ptr, words_ptr, bytes_ptr, j, m, mask_m, I, row_words, dn_at,
                       dn_scale_at, glob_at, BLOCK_G: tl.constexpr, DECODE: tl.constexpr, e_routed=None,
                       ROUTED: tl.constexpr = False):
    """nvfp4_expert_rows.routed_down through rows_groups: (routed expert j's rows m summed, their scale
    weights[j] * global * 2^14); the expert e_routed where ROUTED, else ids[j]."""
    down, scales, glob = down_matrix(ids_ptr, words_ptr, bytes_ptr, j, row_words, dn_at, dn_scale_at, glob_at,
                                     e_routed, ROUTED)
    y = rows_groups(down, scales, m, mask_m, act_ptr + j * I, I, BLOCK_G, DECODE)
    g_down = tl.load(glob).to(tl.float32, bitcast=True) * 16384.0  # 2^14: the codes' scaling
    return y, tl.load(wts_ptr + j).to(tl.float32) * g_down


@triton.jit
def extra_down_groups(act_ptr, xd_w, xd_s, xd_g, extra_scale_ptr, m, mask_m, I, K_ROUTED: tl.constexpr,
                      HAS_EXTRA_SCALE: tl.constexpr, BLOCK_G: tl.constexpr, DECODE: tl.constexpr):
    """nvfp4_expert_rows.extra_down through rows_groups: (the shared expert's rows m summed, their scale)."""
    y = rows_groups(xd_w, xd_s, m, mask_m, act_ptr + K_ROUTED * I, I, BLOCK_G, DECODE)
    y_scale = tl.load(xd_g) * 16384.0
    if HAS_EXTRA_SCALE:
        y_scale = tl.load(extra_scale_ptr).to(tl.float32) * y_scale
    return y, y_scale


@triton.jit
def preload_down(ids_ptr, words_ptr, bytes_ptr, xd_w, xd_s, xd_g, j, m, mask_m, I, row_words, dn_at, dn_scale_at,
                 glob_at, e_routed, K_ROUTED: tl.constexpr, HAS_EXTRA: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_G: tl.constexpr, DECODE: tl.constexpr):
    """Program j's down rows m as load_groups' tiles and its global scale times 2^14, before the PDL wait:
    routed expert e_routed's (found before the wait too), or the shared expert's; zeros where there is none."""
    if j < K_ROUTED:
        down, scales, glob = down_matrix(ids_ptr, words_ptr, bytes_ptr, j, row_words, dn_at, dn_scale_at, glob_at,
                                         e_routed, True)
        w0, w1, sb = load_groups(down, scales, m, mask_m, I, BLOCK_G, DECODE)
        g_down = tl.load(glob).to(tl.float32, bitcast=True) * 16384.0  # 2^14: the codes' scaling
    elif HAS_EXTRA:
        w0, w1, sb = load_groups(xd_w, xd_s, m, mask_m, I, BLOCK_G, DECODE)
        g_down = tl.load(xd_g) * 16384.0
    else:
        w0 = tl.zeros([BLOCK_M, BLOCK_G], dtype=tl.int32)
        w1, sb, g_down = w0, w0, tl.zeros([], dtype=tl.float32)
    return w0, w1, sb, g_down


@triton.jit
def preloaded_part(act_ptr, wts_ptr, extra_scale_ptr, addend_ptr, w0, w1, sb, g_down, j, m, mask_m, I,
                   K_ROUTED: tl.constexpr, HAS_EXTRA: tl.constexpr, HAS_EXTRA_SCALE: tl.constexpr,
                   HAS_ADDEND: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_G: tl.constexpr, DECODE: tl.constexpr):
    """After the wait: program j's part from preload_down's tiles, nvfp4_experts_parts._part_rows' value on the
    group path (the same chains, sums and scales, in the same order)."""
    if j < K_ROUTED:
        y = rows_groups_loaded(w0, w1, sb, m, mask_m, act_ptr + j * I, I, BLOCK_G, DECODE)
        out = y * (tl.load(wts_ptr + j).to(tl.float32) * g_down)
    else:
        out = tl.zeros([BLOCK_M], dtype=tl.float32)
        if HAS_EXTRA:
            y = rows_groups_loaded(w0, w1, sb, m, mask_m, act_ptr + K_ROUTED * I, I, BLOCK_G, DECODE)
            y_scale = g_down
            if HAS_EXTRA_SCALE:
                y_scale = tl.load(extra_scale_ptr).to(tl.float32) * y_scale
            out = y * y_scale
        if HAS_ADDEND:
            out = tl.load(addend_ptr + m, mask=mask_m, other=0.0).to(tl.float32)
    return out
