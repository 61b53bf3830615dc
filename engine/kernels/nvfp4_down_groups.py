"""The MoE down rows' dots with each thread owning whole 16-code groups: no layout conversion in the program.

Why: expert_down_parts' tile (nvfp4_expert_rows.rows_part: words, x tiles, scale bytes laid out by their own
loads, then pair sums and a group reshape) is ~1,950 SASS instructions a 2-warp program of 16 rows under the
H200's Triton 3.6.0, 15.3 a code (docs/RESULTS.md session 19), and the launch takes 6.5 us a layer for 5.4 MB
(2.6 us is a plain read of them in the same PDL chain, session 21). Here element (m, g) of the [BLOCK_M, BLOCK_G]
tile is row m's group g: one inline PTX block loads its two code words (8 bytes), its 16 activations (four
16-byte loads: the same for every row, L1 hits) and its scale byte, turns the codes into fp16 pairs by bit
placement (nvfp4_expert_rows.e2m1_pair's: E2M1 * 2^-14, exact), each half to fp32, and chains 16 FMAs in a
fixed order. No tl.load takes part, so no layout is imposed and none converted.

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


def _group_ptx() -> str:
    body = ["{ .reg .b32 w0, w1, h, t; .reg .b16 l, u, sb; .reg .f32 v, a<16>;",
            "ld.global.v2.b32 {w0, w1}, [$2];",
            "ld.global.v4.f32 {a0, a1, a2, a3}, [$3]; ld.global.v4.f32 {a4, a5, a6, a7}, [$3+16];",
            "ld.global.v4.f32 {a8, a9, a10, a11}, [$3+32]; ld.global.v4.f32 {a12, a13, a14, a15}, [$3+48];",
            "ld.global.u8 sb, [$4]; cvt.u32.u16 $1, sb;", "mov.f32 $0, 0f00000000;"]
    for half, word in enumerate(("w0", "w1")):
        for c in range(4):
            body.append(_pair_ptx(word, c) + "mov.b32 {l, u}, h;")
            for code, reg in ((c, "l"), (c + 4, "u")):
                body.append(f"cvt.f32.f16 v, {reg}; fma.rn.f32 $0, v, a{8 * half + code}, $0;")
    return "\n".join(body) + "}"


GROUP_PTX = tl.constexpr(_group_ptx())  # $0 the chain's sum, $1 the scale byte; $2 codes, $3 acts, $4 the scale


@triton.jit
def _group_asm(cw, ap, sp):
    b = tl.pointer_type(tl.int8)  # the operands are broadcast together: one pointer type for all
    # not pure: its loads must stay after the PDL wait (gdc_prologue), where gate/up's act is visible
    return tl.inline_asm_elementwise(GROUP_PTX, "=f,=r,l,l,l", [cw.to(b), ap.to(b), sp.to(b)],
                                     dtype=(tl.float32, tl.int32), is_pure=False, pack=1)


@triton.jit
def _group_plain(cw, ap, sp):
    """_group_asm's values through tl.load, the same bit placement and FMAs in the same order."""
    acc = tl.zeros(cw.shape, dtype=tl.float32)
    for half in tl.static_range(2):
        word = tl.load(cw + half)
        for c in tl.static_range(4):
            lo, hi = e2m1_pair(word, c, "fp16")  # the bit placement the PTX does, then fp16 -> fp32
            acc = tl.fma(lo, tl.load(ap + 8 * half + c), acc)
            acc = tl.fma(hi, tl.load(ap + 8 * half + c + 4), acc)
    return acc, tl.load(sp).to(tl.int32) & 0xFF


@triton.jit
def rows_groups(w_ptr, s_ptr, m, mask_m, act_ptr, I, BLOCK_G: tl.constexpr, DECODE: tl.constexpr):
    """sum over the 16-code groups of (the group's FMA chain) * E4M3 scale, fp32 [BLOCK_M], for rows m of an
    NVFP4 matrix [*, I] (int32 words at w_ptr, I / 8 a row; scale bytes at s_ptr, I / 16 a row) against the
    activations at act_ptr (I fp32). Masked rows and groups past I / 16 read row 0 / group 0 and add 0."""
    grp = tl.arange(0, BLOCK_G)
    mask_g = grp < I // 16
    g = tl.where(mask_g, grp, 0)[None, :]
    r = tl.where(mask_m, m, 0).to(tl.int64)[:, None]
    cw = w_ptr + r * (I // 8) + 2 * g
    sp = s_ptr + r * (I // 16) + g
    ap = act_ptr + 16 * g + 0 * r  # the tile's shape for every operand: one layout, none converted
    if DECODE == "asm":
        part, sb = _group_asm(cw, ap, sp)
    else:
        part, sb = _group_plain(cw, ap, sp)
    scaled = part * sb.to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)
    return tl.sum(tl.where(mask_m[:, None] & mask_g[None, :], scaled, 0.0), axis=1)


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
