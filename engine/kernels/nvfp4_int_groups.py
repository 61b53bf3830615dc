"""The integer gate/up's dots with each thread owning whole 16-code groups: no layout conversion in the program.

Why: in expert_gate_up_int's one-warp program (nvfp4_int_dot.rows_dot twice) Triton lays out the weight words,
x's int16 pairs, x's block scales and the E4M3 scale bytes each by its own load's contiguity, and converts
between those layouts: under the H200's Triton 3.6.0 (sm_90, scripts/sass_nvfp4_int_dot.py) the 1-row program
is 728 SASS instructions for its 128 codes a thread (5.7 a code), of which the 16 words' integer dots are ~270;
the rest is 58 SHFL, 64 SEL, 16 STS / 8 LDS and a barrier moving pairs and sums between lanes, the group sums'
shuffles and single-word loads. Nsight Compute had the float gate/up issuing instructions half its time
(docs/RESULTS.md session 18): a program with fewer instructions a code is the lever that is left there.

Here element (n, g) of a [BLOCK_N, BLOCK_G] tile is row n's group g (two words) of both gate and up, and one
inline PTX block does all its loads (the two rows' words, 8 bytes each; x's 8 pairs, two 16-byte loads; x's
block scale; the two scale bytes) and the four words' integer dots (nvfp4_int_dot.word_dot's PRMT + dp2a). No
tl.load takes part, so no layout is imposed and none converted: a thread's groups stay its own, and the only
movement between lanes is the final sum of each row. The arithmetic is rows_dot's: each group's exact integer
dot, times (its E4M3 scale times x's block scale), added in fp32 (in the tile's order: the bytes are those of
this tile, not rows_dot's: an ulp's difference from the sums' order).

DECODE "plain" (Triton's interpreter) loads the same values with tl.load and runs word_dot's integer form: the
same integers, so the same bytes (the GPU tier checks it). The PTX path needs 8-byte aligned word rows and
16-byte aligned pairs: the engine's row containers (quant/nvfp4_rows.ROW_ALIGN) and x16_buffers give both.
Reference: nvfp4_int_dot.gemv_int_reference (the same integers, another order of the fp32 sums).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .nvfp4_int_dot import word_dot


def _word_ptx(word: str, pairs: tuple[str, str, str, str], acc: str, first: bool) -> str:
    """word_dot's PTX (nvfp4_int_dot) for one word register into acc (first: acc starts at 0)."""
    a, b, c, d = pairs
    start = "0" if first else acc
    return (f"and.b32 m, {word}, 0x77777777;\n"
            f"shr.u32 s, {word}, 1; and.b32 s, s, 0x44444444; or.b32 s, s, 0x32103210;\n"
            "prmt.b32 p, $11, 0x0C080604, m; prmt.b32 n, $12, 0xF4F8FAFC, m; prmt.b32 w, p, n, s;\n"
            f"dp2a.lo.s32.s32 {acc}, {a}, w, {start}; dp2a.hi.s32.s32 {acc}, {b}, w, {acc};\n"
            "shr.u32 m, m, 16; shr.u32 s, s, 16;\n"
            "prmt.b32 p, $11, 0x0C080604, m; prmt.b32 n, $12, 0xF4F8FAFC, m; prmt.b32 w, p, n, s;\n"
            f"dp2a.lo.s32.s32 {acc}, {c}, w, {acc}; dp2a.hi.s32.s32 {acc}, {d}, w, {acc};\n")


# Outputs: $0 / $1 the gate / up group's integer dot, $2 / $3 their E4M3 scale bytes, $4 x's block scale (fp32
# bits). Inputs (pointers): $5 / $6 the gate / up group's two words, $7 x's 8 pairs, $8 x's block scale, $9 / $10
# the gate / up scale byte; $11 / $12 the tables' first words (nvfp4_int_dot.TABLES[0], [2]).
GROUP_PTX = tl.constexpr("{ .reg .b32 g0, g1, u0, u1, q0, q1, q2, q3, q4, q5, q6, q7, m, s, p, n, w; .reg .b16 sb;\n"
             "ld.global.v2.b32 {g0, g1}, [$5]; ld.global.v2.b32 {u0, u1}, [$6];\n"
             "ld.global.v4.b32 {q0, q1, q2, q3}, [$7]; ld.global.v4.b32 {q4, q5, q6, q7}, [$7+16];\n"
             "ld.global.b32 $4, [$8];\n"
             "ld.global.u8 sb, [$9]; cvt.u32.u16 $2, sb;\n"
             "ld.global.u8 sb, [$10]; cvt.u32.u16 $3, sb;\n"
             + _word_ptx("g0", ("q0", "q1", "q2", "q3"), "$0", True)
             + _word_ptx("g1", ("q4", "q5", "q6", "q7"), "$0", False)
             + _word_ptx("u0", ("q0", "q1", "q2", "q3"), "$1", True)
             + _word_ptx("u1", ("q4", "q5", "q6", "q7"), "$1", False)
             + "}")  # a constexpr: a global the kernel reads


@triton.jit
def _group_asm(gw, uw, xp, xsp, gs, us, tp0, tn0):
    """(gate dot, up dot, gate scale byte, up scale byte, x's block scale bits) of the groups at these pointers,
    in one PTX block (GROUP_PTX)."""
    b = tl.pointer_type(tl.int8)  # the operands are broadcast together: one pointer type for all
    # not pure: its loads must stay after the PDL wait (gdc_prologue), where the previous kernel's x is visible
    return tl.inline_asm_elementwise(
        GROUP_PTX, "=r,=r,=r,=r,=r,l,l,l,l,l,l,r,r",
        [gw.to(b), uw.to(b), xp.to(b), xsp.to(b), gs.to(b), us.to(b), tp0, tn0],
        dtype=(tl.int32, tl.int32, tl.int32, tl.int32, tl.int32), is_pure=False, pack=1)


@triton.jit
def _group_plain(gw, uw, xp, xsp, gs, us, tp0, tn0):
    """_group_asm's values through tl.load and word_dot's integer form (the interpreter's path)."""
    q0, q1, q2, q3 = tl.load(xp), tl.load(xp + 1), tl.load(xp + 2), tl.load(xp + 3)
    q4, q5, q6, q7 = tl.load(xp + 4), tl.load(xp + 5), tl.load(xp + 6), tl.load(xp + 7)
    ig = (word_dot(tl.load(gw), q0, q1, q2, q3, tp0, tn0, "plain")
          + word_dot(tl.load(gw + 1), q4, q5, q6, q7, tp0, tn0, "plain"))
    iu = (word_dot(tl.load(uw), q0, q1, q2, q3, tp0, tn0, "plain")
          + word_dot(tl.load(uw + 1), q4, q5, q6, q7, tp0, tn0, "plain"))
    sg = tl.load(gs).to(tl.int32) & 0xFF
    su = tl.load(us).to(tl.int32) & 0xFF
    return ig, iu, sg, su, tl.load(xsp).to(tl.int32, bitcast=True)


@triton.jit
def _scaled(isum, scale_byte, xs):
    """A group's integer dot times its E4M3 scale times x's block scale (rows_dot's order of the products)."""
    return isum.to(tl.float32) * (scale_byte.to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32) * xs)


@triton.jit
def gate_up_groups(gate_w, up_w, gate_s, up_s, pairs_ptr, xs_ptr, tables_ptr, rows, mask_n, K: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_G: tl.constexpr, DECODE: tl.constexpr):
    """(gate, up) fp32 [BLOCK_N]: rows `rows` (int64; masked by mask_n) of the gate and up matrices (words at
    gate_w / up_w, K / 8 a row; scale bytes at gate_s / up_s, K / 16 a row) times x (its int16 pairs and block
    scales), each the sum over 16-code groups of (exact integer dot) * E4M3 scale * x's block scale, before the
    global scales. Masked rows and groups past K / 16 read row 0 / group 0 and add 0."""
    grp = tl.arange(0, BLOCK_G)
    mask_g = grp < K // 16
    g = tl.where(mask_g, grp, 0)[None, :]
    r = tl.where(mask_n, rows, 0)[:, None]
    gw = gate_w + r * (K // 8) + 2 * g
    uw = up_w + r * (K // 8) + 2 * g
    gs = gate_s + r * (K // 16) + g
    us = up_s + r * (K // 16) + g
    xp = pairs_ptr + 8 * g + 0 * r  # the tile's shape for every operand: one layout, none converted
    xsp = xs_ptr + g + 0 * r
    tp0 = tl.load(tables_ptr)
    tn0 = tl.load(tables_ptr + 2)
    if DECODE == "asm":
        ig, iu, sg, su, xb = _group_asm(gw, uw, xp, xsp, gs, us, tp0, tn0)
    else:
        ig, iu, sg, su, xb = _group_plain(gw, uw, xp, xsp, gs, us, tp0, tn0)
    xs = xb.to(tl.float32, bitcast=True)
    valid = mask_n[:, None] & mask_g[None, :]
    gate = tl.sum(tl.where(valid, _scaled(ig, sg, xs), 0.0), axis=1)
    up = tl.sum(tl.where(valid, _scaled(iu, su, xs), 0.0), axis=1)
    return gate, up
