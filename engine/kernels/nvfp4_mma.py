"""Batch-1 NVFP4 GEMV on the integer tensor cores (mma.sync m16n8k32 s8), no layout conversion.

Why: the step's NVFP4 GEMVs looked bound by instruction issue, not by their bytes. The LM head (gemv_multi, 286
MB) takes ~129 us against a 63 us plain read of its bytes at 5.8 SASS instructions a code, and the integer dots
(nvfp4_int_dot: dp2a) still spend 3.0-3.8 a code (docs/RESULTS.md sessions 18-25). Here one warp does a tile of
16 rows at 1.8 instructions a code (scripts/sass_nvfp4_mma.py counts them): per 8 codes one XOR, three shifts and
four PRMTs, then two MMAs per 32 codes for the whole warp, and per 16-code group a few integer and float
operations. Measured (session 26, H100): right (the plain path's bytes) but slower, the LM head alone 147.9 us
against gemv_multi's 130.5 and gemv_int's 110.6, so issue is not what bounds it; PAIRS tests its loads.
(Tried before and removed: Triton's tl.dot on the tensor cores for the LM head, 1.088x the step, and for the
experts, fp16, 1.05-1.09x: its layout conversions through shared memory cost more than the dot saved. Here no
tl.dot and no tl.load take part in the tile: one inline PTX block a step does the loads, the decode, the MMAs and
the scaling, each lane from its own %tid.x.)

The split. Lane (g, t) = (laneid >> 2, laneid & 3) holds rows g and g + 8 of the tile (the MMA's A rows) and owns
the quarter t of K: codes t K/4 ... (t + 1) K/4 - 1 of both rows. In MMA block b its A registers hold word b of
its quarter, codes 0-3 in k-slots 4t..4t+3 and codes 4-7 in 16+4t..16+4t+3. Any order of K is a valid dot as
long as B follows it; B's column 2t + h holds, at lane t's slots, the high (h = 0) or low (h = 1) bytes of x's
int16 values, and zeros elsewhere. So C[g][2t] and C[g][2t + 1], which lane (g, t) holds, are the high and low
parts of the integer dot of *its own* words: no lane exchanges anything until the rows' final sums.
- A's int8 values: 2 x E2M1 is 0, 1, 2, 3, 4, 6, 8, 12 by magnitude. PRMT looks a code's 3-bit magnitude up in
  an 8-byte table, and where the code's bit 3 (its sign) is set it writes the selected byte's sign instead, 0.
  So PRMT(table, word) is A+ (the positive codes' magnitudes, 0 for the negative) and PRMT(table, word ^
  0x88888888) is A- (the negative codes' magnitudes): dot = A+ . x - A- . x, two MMAs into two accumulators.
- x: each 16-element block quantized to q = floor(x (QMAX / amax) + 0.5) with |q| <= QMAX = 32639, so that
  hi = (q + 128) >> 8 and lo = q - 256 hi are both int8 and q = 256 hi + lo (nvfp4_hilo.quantize_hilo).
- A group's integer dot (2 blocks: 16 codes of each row) is exact (|d| <= 16 * 12 * 32639 < 2^23), then
  d * (E4M3 scale * x's block scale) is added to the lane's fp32 sum in group order (the products and sums
  rounded one by one: no FMA, so Triton's interpreter gives the same bytes). The four quarters' sums add as
  (s0 + s1) + (s2 + s3) (butterfly shuffles; every lane of a quad gets the same bits), times global / 2.

DECODE "plain" (Triton's interpreter; or compiled, as the GPU tier's check) computes each lane's integer group
dots with tl.load and integer arithmetic: the same integers, the same fp32 order, so the same bytes.
The PTX path needs K % 64 == 0, rows and x's bytes 16-byte aligned (torch's allocations are).
Reference: gemv_mma_reference (the same integers and order of the products in torch; another order of the sums).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import gdc_prologue, pdl_launch
from .nvfp4_hilo import QMAX, quantize_hilo
from .nvfp4_int_dot import _e2m1_int, gemv_int_reference, tables
from .nvfp4_triton import _store_exact, exact_out

# The fused step's NVFP4 LM head through gemv_mma (decode_fused.logits), x quantized by its own launch: logits
# within x's int16 blocks of gemv_multi's (1.7e-5 of the largest), not its bytes. Off: at 1 warp its GPU A/B
# (profile_decode arm "lmimma", docs/RESULTS.md session 26, H100) made the step 1.008x; at 4 warps (LM_WARPS 4)
# 0.989x, 5 of 5 rounds (session 27, H100), its bf16-level gate ([lmimma4]) not yet run. scripts/
# bench_nvfp4_int_dot.py has it alone against gemv_multi.
LM_HEAD = False
# Warps a 16-row tile of the LM head, each a part of K (gemv_mma's warps; profile_decode value "lmwarps"). Alone
# (scripts/bench_nvfp4_int_dot.py, session 27, H100): 148.4 us at 1 warp, 147.7 at 2, 109.3 at 4; gemv_multi 133.0.
# 4 goes with LM_HEAD once its gate passes.
LM_WARPS = 1
# Each quad's loads of a row as 64 contiguous bytes (tile_sums' PAIRS: lane t's groups 2t, 2t + 1, 8 + 2t, 9 + 2t,
# ...) instead of each lane reading a 16-byte piece of its own quarter's line (32 lines an instruction). Why: the
# first GPU figures (docs/RESULTS.md session 26, H100) had the tile at 147.9 us for the LM head against 110.6 for
# the dp2a GEMV with ~half its instructions: its loads, not its issue, are the suspect. Off until its A/B
# (profile_decode arm "mmapairs"); the same integers, the fp32 sums in another order.
PAIRS = False


def steps_groups(k: int, warps: int = 1) -> int:
    """G, the 16-code groups a lane takes in one PTX block (its loads at once): 4, 2 or 1, whichever divides the
    K / 64 W groups of its quarter of its warp's part."""
    if k % (64 * warps):
        raise ValueError(f"the MMA tile needs K a multiple of 64 x its {warps} warp(s), got {k}")
    q = k // (64 * warps)
    return 4 if q % 4 == 0 else 2 if q % 2 == 0 else 1


def pairs_fit(k: int, warps: int = 1) -> bool:
    """PAIRS' layout fits: whole steps of 16 groups in every warp's part (G 4)."""
    return k % (256 * warps) == 0


def _load_ptx(G: int, pairs: bool = False) -> str:
    """The loads of a step: rows r / r8 words (2G each), x's bytes (4G words), both rows' scale bytes (G each), x's
    block scales (G floats). pairs (G 4): groups 0, 1 at the pointers and 2, 3 eight groups further on, the
    weights past L1 (streamed once)."""
    if pairs:
        w = "ld.global.nc.L1::no_allocate.v4.b32"  # weights: read once, no kernel writes them (past L1)
        return (f"{w} {{wr0, wr1, wr2, wr3}}, [$4]; {w} {{wr4, wr5, wr6, wr7}}, [$4+64];\n"
                f"{w} {{wq0, wq1, wq2, wq3}}, [$5]; {w} {{wq4, wq5, wq6, wq7}}, [$5+64];\n"
                "ld.global.v4.b32 {x0, x1, x2, x3}, [$6]; ld.global.v4.b32 {x4, x5, x6, x7}, [$6+16];\n"
                "ld.global.v4.b32 {x8, x9, x10, x11}, [$6+128]; ld.global.v4.b32 {x12, x13, x14, x15}, [$6+144];\n"
                "ld.global.u16 hb, [$7]; ld.global.u16 e0, [$7+8]; mov.b32 sr, {hb, e0};\n"
                "ld.global.u16 hb, [$8]; ld.global.u16 e0, [$8+8]; mov.b32 sq, {hb, e0};\n"
                "ld.global.v2.f32 {xs0, xs1}, [$9]; ld.global.v2.f32 {xs2, xs3}, [$9+32];\n")
    def words(dst: str, n: int, src: str) -> str:
        out = []
        for at in range(0, n, 4):
            m = min(4, n - at)
            regs = ", ".join(f"{dst}{at + i}" for i in range(m))
            out.append(f"ld.global.v{m}.b32 {{{regs}}}, [{src}+{4 * at}];" if m > 1 else
                       f"ld.global.b32 {regs}, [{src}+{4 * at}];")
        return "\n".join(out) + "\n"
    scale = {4: "ld.global.b32 sr, [$7]; ld.global.b32 sq, [$8];\n",
             2: "ld.global.u16 hb, [$7]; cvt.u32.u16 sr, hb; ld.global.u16 hb, [$8]; cvt.u32.u16 sq, hb;\n",
             1: "ld.global.u8 hb, [$7]; cvt.u32.u16 sr, hb; ld.global.u8 hb, [$8]; cvt.u32.u16 sq, hb;\n"}[G]
    xs = ", ".join(f"xs{i}" for i in range(G))
    xsl = f"ld.global.v{G}.f32 {{{xs}}}, [$9];\n" if G > 1 else "ld.global.f32 xs0, [$9];\n"
    return words("wr", 2 * G, "$4") + words("wq", 2 * G, "$5") + words("x", 4 * G, "$6") + scale + xsl


def _block_ptx(wr: str, wq: str, b0: str, b1: str, first: bool) -> str:
    """One MMA block: row r's word wr and row r8's wq split into A+ / A- by PRMT, both MMAs against x's (b0, b1)."""
    acc_p, acc_n = ("z, z, z, z", "z, z, z, z") if first else ("p0, p1, p2, p3", "n0, n1, n2, n3")
    return (f"prmt.b32 a0, $10, $11, {wr}; shr.u32 h, {wr}, 16; prmt.b32 a2, $10, $11, h;\n"
            f"xor.b32 h, {wr}, 0x88888888; prmt.b32 m0, $10, $11, h; shr.u32 h, h, 16; prmt.b32 m2, $10, $11, h;\n"
            f"prmt.b32 a1, $10, $11, {wq}; shr.u32 h, {wq}, 16; prmt.b32 a3, $10, $11, h;\n"
            f"xor.b32 h, {wq}, 0x88888888; prmt.b32 m1, $10, $11, h; shr.u32 h, h, 16; prmt.b32 m3, $10, $11, h;\n"
            "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {p0, p1, p2, p3}, {a0, a1, a2, a3}, "
            f"{{{b0}, {b1}}}, {{{acc_p}}};\n"
            "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {n0, n1, n2, n3}, {m0, m1, m2, m3}, "
            f"{{{b0}, {b1}}}, {{{acc_n}}};\n")


def _group_ptx(i: int) -> str:
    """Group i of the step: its two blocks, then d = 256 hi + lo for both rows, times scale * x's scale, summed."""
    sel = hex(0x40 + 0x11 * i)  # bytes i of sr and of sq (at 4 + i) into the low two bytes
    return (_block_ptx(f"wr{2 * i}", f"wq{2 * i}", f"x{4 * i}", f"x{4 * i + 1}", True)
            + _block_ptx(f"wr{2 * i + 1}", f"wq{2 * i + 1}", f"x{4 * i + 2}", f"x{4 * i + 3}", False)
            + "sub.s32 d0, p0, n0; sub.s32 h, p1, n1; mad.lo.s32 d0, d0, 256, h;\n"
            "sub.s32 d1, p2, n2; sub.s32 h, p3, n3; mad.lo.s32 d1, d1, 256, h;\n"
            "cvt.rn.f32.s32 f0, d0; cvt.rn.f32.s32 f1, d1;\n"
            f"prmt.b32 h, sr, sq, {sel}; cvt.u16.u32 hb, h; cvt.rn.f16x2.e4m3x2 h, hb; mov.b32 {{e0, e1}}, h;\n"
            "cvt.f32.f16 c0, e0; cvt.f32.f16 c1, e1;\n"
            f"mul.rn.f32 c0, c0, xs{i}; mul.rn.f32 c1, c1, xs{i};\n"
            "mul.rn.f32 f0, f0, c0; mul.rn.f32 f1, f1, c1;\n"
            "add.rn.f32 ar, ar, f0; add.rn.f32 aq, aq, f1;\n")


def step_ptx(G: int, pairs: bool = False) -> str:
    """A step of G groups. Outputs $0 / $1: rows r / r8's running sums (fp32 bits). Inputs: $2 / $3 the sums so far;
    pointers $4 / $5 rows r / r8's first word of the step, $6 x's bytes (this lane's B column: the high or low
    bytes of its quarter's lane, or zeros), $7 / $8 the rows' first scale byte, $9 x's first block scale;
    $10 / $11 the magnitude table's words (nvfp4_int_dot.TABLES[0], [1])."""
    regs = (", ".join(f"wr{i}, wq{i}" for i in range(2 * G)) + ", " + ", ".join(f"x{i}" for i in range(4 * G))
            + ", a0, a1, a2, a3, m0, m1, m2, m3, p0, p1, p2, p3, n0, n1, n2, n3, h, z, sr, sq, d0, d1")
    floats = ", ".join(f"xs{i}" for i in range(G)) + ", f0, f1, c0, c1, ar, aq"
    return ("{ .reg .b32 " + regs + "; .reg .f32 " + floats + "; .reg .b16 hb, e0, e1;\n"
            "mov.b32 z, 0; mov.b32 ar, $2; mov.b32 aq, $3;\n"
            + _load_ptx(G, pairs) + "".join(_group_ptx(i) for i in range(G)) + "mov.b32 $0, ar; mov.b32 $1, aq; }")


STEP_PTX_1 = tl.constexpr(step_ptx(1))
STEP_PTX_2 = tl.constexpr(step_ptx(2))
STEP_PTX_4 = tl.constexpr(step_ptx(4))
STEP_PTX_PAIRS = tl.constexpr(step_ptx(4, pairs=True))
_STEP_CONSTRAINTS = tl.constexpr("=r,=r,r,r,l,l,l,l,l,l,r,r")
# The quad's four quarter sums: lane t gets s_t + s_{t^1}, then that plus the pair across: (s0 + s1) + (s2 + s3)
QUAD_PTX = tl.constexpr("{ .reg .f32 t;\n"
                        "shfl.sync.bfly.b32 t, $2, 1, 0x1f, 0xffffffff; add.rn.f32 $0, $2, t;\n"
                        "shfl.sync.bfly.b32 t, $0, 2, 0x1f, 0xffffffff; add.rn.f32 $0, $0, t;\n"
                        "shfl.sync.bfly.b32 t, $3, 1, 0x1f, 0xffffffff; add.rn.f32 $1, $3, t;\n"
                        "shfl.sync.bfly.b32 t, $1, 2, 0x1f, 0xffffffff; add.rn.f32 $1, $1, t; }")


@triton.jit
def thread_ids(W: tl.constexpr, DECODE: tl.constexpr):
    """[32 W] int32: each element's thread in the program (W warps). On the PTX path the hardware's %tid.x, so
    that every operand a thread computes from it is its own whatever layout Triton gives the tensor; in the
    interpreter, element e is thread e."""
    e = tl.arange(0, 32 * W)
    if DECODE == "asm":
        return tl.inline_asm_elementwise("mov.u32 $0, %tid.x;", "=r,r", [e], dtype=tl.int32, is_pure=True, pack=1)
    return e


@triton.jit
def _step_asm(acc_r, acc_q, wr, wq, xb, sr, sq, xs, t0, t1, G: tl.constexpr, PAIRS: tl.constexpr = False):
    b = tl.pointer_type(tl.int8)
    # the sums as int32 bits: the operands are broadcast together, and a float beside a pointer is refused
    args = [acc_r.to(tl.int32, bitcast=True), acc_q.to(tl.int32, bitcast=True), wr.to(b), wq.to(b), xb.to(b),
            sr.to(b), sq.to(b), xs.to(b), t0, t1]
    ptx: tl.constexpr = STEP_PTX_PAIRS if PAIRS else STEP_PTX_4 if G == 4 else STEP_PTX_2 if G == 2 else STEP_PTX_1
    # not pure: its loads must stay after the PDL wait (gdc_prologue), where the previous kernel's x is visible
    r, q = tl.inline_asm_elementwise(ptx, _STEP_CONSTRAINTS, args, dtype=(tl.int32, tl.int32), is_pure=False,
                                     pack=1)
    return r.to(tl.float32, bitcast=True), q.to(tl.float32, bitcast=True)


@triton.jit
def _group_dot_plain(w, q):
    """[32] exact int32: each lane's group of 16 codes (its two words at w) times q [32, 16]."""
    c = tl.arange(0, 16)
    lo, hi = tl.load(w), tl.load(w + 1)
    word = tl.where(c[None, :] < 8, lo[:, None], hi[:, None])
    codes = (word >> (4 * (c[None, :] % 8))) & 15
    return tl.sum(_e2m1_int(codes) * q, axis=1)


@triton.jit
def _step_plain(acc_r, acc_q, wr, wq, xq, K: tl.constexpr, sr, sq, xs, G: tl.constexpr, PAIRS: tl.constexpr = False):
    """_step_asm's sums with tl.load and integer arithmetic: xq is this lane's own high bytes at the step (its low
    bytes K further on); PAIRS: groups 2 and 3 eight groups after 0 and 1."""
    c = tl.arange(0, 16)
    for i in tl.static_range(G):
        o: tl.constexpr = 8 * (i // 2) + i % 2 if PAIRS else i  # the group's place after the step's first
        at = xq[:, None] + 16 * o + c[None, :]
        q = tl.load(at).to(tl.int32) * 256 + tl.load(at + K).to(tl.int32)
        d_r = _group_dot_plain(wr + 2 * o, q)
        d_q = _group_dot_plain(wq + 2 * o, q)
        x_s = tl.load(xs + o)
        s_r = tl.load(sr + o).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32) * x_s
        s_q = tl.load(sq + o).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32) * x_s
        acc_r = acc_r + d_r.to(tl.float32) * s_r
        acc_q = acc_q + d_q.to(tl.float32) * s_q
    return acc_r, acc_q


@triton.jit
def _quad_sums(acc_r, acc_q, W: tl.constexpr, DECODE: tl.constexpr):
    """(s0 + s1) + (s2 + s3) of each quad's quarter sums, for both rows: every lane of the quad on the PTX path,
    thread 4q + t's element (any t) in the interpreter's [32 W]."""
    if DECODE == "asm":
        return tl.inline_asm_elementwise(QUAD_PTX, "=f,=f,f,f", [acc_r, acc_q], dtype=(tl.float32, tl.float32),
                                         is_pure=True, pack=1)
    QUADS: tl.constexpr = 8 * W
    r01, r23 = tl.split(tl.reshape(acc_r, [QUADS, 2, 2]).permute(0, 2, 1))  # [quads, 2]: (s0, s1), (s2, s3)
    q01, q23 = tl.split(tl.reshape(acc_q, [QUADS, 2, 2]).permute(0, 2, 1))
    r_quad = tl.sum(r01, axis=1) + tl.sum(r23, axis=1)  # two terms a sum: one order
    q_quad = tl.sum(q01, axis=1) + tl.sum(q23, axis=1)
    four = tl.full([QUADS, 4], 0.0, tl.float32)
    return tl.reshape(r_quad[:, None] + four, [32 * W]), tl.reshape(q_quad[:, None] + four, [32 * W])


@triton.jit
def tile_sums(w_r, w_q, s_r, s_q, hl_ptr, xs_ptr, zeros_ptr, tables_ptr, tid, K: tl.constexpr, G: tl.constexpr,
              W: tl.constexpr, DECODE: tl.constexpr, PAIRS: tl.constexpr = False):
    """(row r, row r8) fp32 [32 W] for thread tid of W warps, lane (g, t) = ((tid & 31) >> 2, tid & 3) of warp
    p = tid >> 5: the sums over warp p's part of K (K / W codes: lane t's quarter of it, K / 4W) of the 16-code
    groups' (integer dot) * E4M3 scale * x's block scale, before the global scale, the same in every lane of the
    quad. w_r / w_q: pointers to the first word of rows g / g + 8 (int32, K / 8 a row); s_r / s_q: their first
    scale bytes (K / 16 a row); hl_ptr: x's high bytes [K] then low bytes [K] (quantize_hilo); xs_ptr: x's block
    scales [K / 16]. part_sums adds the warps' parts. PAIRS (pairs_fit): lane t's groups are instead its part's
    2t, 2t + 1, 8 + 2t, 9 + 2t, then 16 further on a step, so that a quad's loads of a row are 64 contiguous bytes
    (a quarter each reads its own 128-byte line)."""
    t = tid & 3
    g = (tid & 31) >> 2
    if PAIRS:
        at = (tid >> 5) * (K // W) + t * 32  # the lane's first code: its part's group 2t
    else:
        at = (tid >> 5) * (K // W) + t * (K // (4 * W))
    loader = (g >> 1) == t  # lane (g, t) holds B's column g: x's bytes where g // 2 == t, zeros elsewhere
    xq = hl_ptr + at
    xb = tl.where(loader, xq + (g & 1) * K, zeros_ptr)
    w_r, w_q = w_r + at // 8, w_q + at // 8
    s_r, s_q = s_r + at // 16, s_q + at // 16
    xs = xs_ptr + at // 16
    t0 = tl.load(tables_ptr + 0 * tid)
    t1 = tl.load(tables_ptr + 1 + 0 * tid)
    acc_r = tl.zeros([32 * W], dtype=tl.float32)
    acc_q = tl.zeros([32 * W], dtype=tl.float32)
    STEP: tl.constexpr = 16 if PAIRS else G  # groups from one step's first to the next's
    for s in tl.static_range(K // (64 * W) // G):
        if DECODE == "asm":
            acc_r, acc_q = _step_asm(acc_r, acc_q, w_r + 2 * STEP * s, w_q + 2 * STEP * s,
                                     tl.where(loader, xb + 16 * STEP * s, xb), s_r + STEP * s, s_q + STEP * s,
                                     xs + STEP * s, t0, t1, G, PAIRS)
        else:
            acc_r, acc_q = _step_plain(acc_r, acc_q, w_r + 2 * STEP * s, w_q + 2 * STEP * s, xq + 16 * STEP * s,
                                       K, s_r + STEP * s, s_q + STEP * s, xs + STEP * s, G, PAIRS)
    return _quad_sums(acc_r, acc_q, W, DECODE)


@triton.jit
def part_sums(acc, W: tl.constexpr):
    """[32] of the W warps' [32 W] parts (element e = thread e, the layout the tile's code checks): w0 for one
    warp, w0 + w1 for two, (w0 + w1) + (w2 + w3) for four."""
    if W == 1:
        total = acc
    elif W == 2:
        a, b = tl.split(tl.reshape(acc, [2, 32]).permute(1, 0))
        total = a + b
    else:
        ab = tl.reshape(acc, [2, 2, 32]).permute(2, 0, 1)  # [32, pair, warp in the pair]
        first, second = tl.split(ab)  # [32, pair]: w0, w2 / w1, w3
        w0, w2 = tl.split(first)
        w1, w3 = tl.split(second)
        total = (w0 + w1) + (w2 + w3)
    return total


@triton.jit
def gemv_mma_kernel(w_ptr, s_ptr, g_ptr, hl_ptr, xs_ptr, zeros_ptr, tables_ptr, out_ptr, N, K: tl.constexpr,
                    G: tl.constexpr, DECODE: tl.constexpr, OUT_BF16: tl.constexpr, USE_GDC: tl.constexpr = False,
                    PAIRS: tl.constexpr = False, W: tl.constexpr = 1):
    """Tile pid: rows 16 pid ... 16 pid + 15 (rows past N read row N - 1 and are not stored), W warps each a part
    of K (tile_sums, part_sums)."""
    gdc_prologue(USE_GDC)  # PDL: x's bytes and scales are the previous kernel's output
    tid = thread_ids(W, DECODE)
    row_r = tl.program_id(0) * 16 + ((tid & 31) >> 2)
    r = tl.minimum(row_r, N - 1).to(tl.int64)
    q = tl.minimum(row_r + 8, N - 1).to(tl.int64)
    acc_r, acc_q = tile_sums(w_ptr + r * (K // 8), w_ptr + q * (K // 8), s_ptr + r * (K // 16),
                             s_ptr + q * (K // 16), hl_ptr, xs_ptr, zeros_ptr, tables_ptr, tid, K, G, W, DECODE,
                             PAIRS)
    lane = tl.arange(0, 32)  # the parts' sums by element: element e is thread e (the layout the tile's code checks)
    out_r = tl.program_id(0) * 16 + (lane >> 2)
    glob = tl.load(g_ptr + 0 * lane) * 0.5  # the codes count double
    first = (lane & 3) == 0
    _store_exact(out_ptr + out_r, part_sums(acc_r, W) * glob, first & (out_r < N), OUT_BF16)
    _store_exact(out_ptr + out_r + 8, part_sums(acc_q, W) * glob, first & (out_r + 8 < N), OUT_BF16)


_ZEROS: dict = {}


# The furthest a step's PTX reads from its x pointer: G 4 reads 64 bytes, PAIRS two 32-byte runs 128 bytes apart
# (160). At 64 bytes PAIRS read past the buffer and the lanes without x's bytes fed garbage into the MMAs (the
# GPU tier's test of PAIRS, session 27); tests/test_kernels_nvfp4_mma.py checks every step's reach against this.
ZERO_BYTES = 256


def zeros(device: torch.device) -> torch.Tensor:
    """ZERO_BYTES zero bytes on the device: the B operand the lanes without x's bytes load, as far as a step reads
    from its x pointer. Made by the first call, which must not be inside a CUDA-graph capture (the decode step's
    eager warm-up makes it)."""
    key = str(device)
    if key not in _ZEROS:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("nvfp4_mma's zeros must be made before CUDA-graph capture (run one step eagerly)")
        _ZEROS[key] = torch.zeros(ZERO_BYTES, dtype=torch.int8, device=device)
    return _ZEROS[key]


def check_alignment(*tensors: torch.Tensor) -> None:
    """The PTX path's vector loads: 16-byte aligned starts."""
    if any(t.data_ptr() % 16 for t in tensors):
        raise ValueError("the MMA tile needs its rows, scales and x's bytes 16-byte aligned: pass contiguous "
                         "tensors that own their storage")


def gemv_mma(packed: torch.Tensor, scale: torch.Tensor, scale2: torch.Tensor, x: torch.Tensor,
             out_dtype: torch.dtype = torch.float32, *, xq: tuple | None = None, out: torch.Tensor | None = None,
             decode: str | None = None, pairs: bool | None = None, warps: int = 1) -> torch.Tensor:
    """NVFP4 weight (packed uint8 [N, K/2], E4M3 scales [N, K/16], fp32 global) times x [K] -> [N], 16 rows a
    program of `warps` warps (each a part of K). xq: x already quantize_hilo'd (None: one more launch here).
    pairs (None: PAIRS): the quads' contiguous layout where it fits (pairs_fit)."""
    n, k = packed.shape[0], 2 * packed.shape[1]
    if packed.dtype != torch.uint8 or scale.shape != (n, k // 16) or x.numel() != k:
        raise ValueError(f"need packed uint8 [N, K/2], scales [N, K/16] and x [K]; got {tuple(packed.shape)}, "
                         f"{tuple(scale.shape)}, {tuple(x.shape)}")
    G = steps_groups(k, warps)
    if out_dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"out_dtype must be float32 or bfloat16, got {out_dtype}")
    decode = decode or ("asm" if x.is_cuda else "plain")
    hl, xs = xq if xq is not None else quantize_hilo(x.reshape(-1))
    if hl.numel() != 2 * k or xs.numel() != k // 16:
        raise ValueError(f"xq must be quantize_hilo of {k} values, got {hl.numel()} bytes")
    w = packed.contiguous().view(torch.int32)
    s = scale.contiguous().view(torch.uint8)
    if decode == "asm":
        check_alignment(w, s, hl, xs)
    if out is None:
        out = torch.empty(n, device=x.device, dtype=out_dtype)
    gemv_mma_kernel[(triton.cdiv(n, 16),)](
        w, s, scale2.reshape(1).to(torch.float32), hl, xs, zeros(x.device), tables(x.device), exact_out(out), n,
        K=k, G=G, DECODE=decode, OUT_BF16=out.dtype == torch.bfloat16, num_warps=warps, W=warps,
        enable_fp_fusion=False, PAIRS=(PAIRS if pairs is None else pairs) and pairs_fit(k, warps),
        **pdl_launch(x.device))
    return out


def gemv_mma_reference(packed: torch.Tensor, scale: torch.Tensor, scale2: torch.Tensor, x: torch.Tensor):
    """gemv_mma's arithmetic in torch (fp32 [N]): exact integer group sums, each times (E4M3 scale * x's block
    scale), summed in fp32 (in torch's order, not the tile's): gemv_int's with x's blocks to QMAX."""
    return gemv_int_reference(packed, scale, scale2, x, QMAX)
