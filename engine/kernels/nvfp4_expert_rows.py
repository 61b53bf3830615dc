"""The row arithmetic of the batch-1 NVFP4 expert kernels (nvfp4_experts_decode.py, nvfp4_experts_parts.py):
decoding E2M1 codes and E4M3 scales in registers, the activations a word needs, and one program's rows times
those activations over K, as column partials that the kernels sum in a fixed order.

Two codes decode together: nibbles c and c+4 of an int32 word land in the two fp16 halves of one int32 (two
shifts, two LOP3) as s.ee.m -> fp16 bits 15, 11..9, i.e. the E2M1 value * 2^-14 (subnormals included), and one
HADD2.F32 each makes them fp32 (decode="asm": via PTX, as Triton's own 16-bit path repacks the halves with PRMTs
first). The E4M3 scale bytes go through the GPU's FP8 conversion, once per 16 codes (group scales) or per word.
decode="exact" swaps in nvfp4_triton's integer decodes (no fp16 subnormals, no FP8 conversion).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .nvfp4_triton import _e2m1_exact, _e4m3_exact


@triton.jit
def e2m1_pair(words, C: tl.constexpr, DECODE: tl.constexpr):
    """Codes C and C+4 of each int32 word (elements 8w+C and 8w+C+4) as fp32 values * 2^-14."""
    if DECODE == "exact":
        lo = _e2m1_exact((words >> (4 * C)) & 15) * 0.00006103515625
        hi = _e2m1_exact((words >> (4 * C + 16)) & 15) * 0.00006103515625
        return lo, hi
    # Sign bits 4C+3 and 4C+19 -> 15 and 31; magnitude bits -> 9..11 and 25..27. -2147450880 is 0x80008000.
    if C < 3:
        h2 = ((words << (12 - 4 * C)) & -2147450880) | ((words << (9 - 4 * C)) & 0x0E000E00)
    else:
        h2 = (words & -2147450880) | ((words >> 3) & 0x0E000E00)
    if DECODE == "asm":  # the two fp16 halves straight to fp32 (HADD2.F32 .H0/.H1, no repacking of 16-bit registers)
        return tl.inline_asm_elementwise(
            "{ .reg .b16 l, h; mov.b32 {l, h}, $2; cvt.f32.f16 $0, l; cvt.f32.f16 $1, h; }", "=f,=f,r", [h2],
            dtype=(tl.float32, tl.float32), is_pure=True, pack=1)
    lo = h2.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
    hi = (h2 >> 16).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
    return lo, hi


@triton.jit
def e4m3(bits, DECODE: tl.constexpr):
    """E4M3 scale bytes -> fp32: the GPU's FP8 conversion (sm_89+), or nvfp4_triton's integer decode."""
    if DECODE == "exact":
        return _e4m3_exact(bits.to(tl.int32))
    return bits.to(tl.float8e4nv, bitcast=True).to(tl.float32)


@triton.jit
def gate_up_pointers(ids_ptr, words_ptr, bytes_ptr, H, I, row_words, gu_scale_at, glob_at, xg_w, xg_s, xg_g, xu_w,
                     xu_s, xu_g, j, K_ROUTED: tl.constexpr, HAS_EXTRA: tl.constexpr, e_routed=None,
                     ROUTED: tl.constexpr = False):
    """Expert j's gate and up matrices (j = 0..k-1 routed: row ids[j], or e_routed where ROUTED (the program
    found it itself); j = k with HAS_EXTRA: the shared expert's own tensors): (gate words, up words, gate scale
    bytes, up scale bytes, gate global, up global)."""
    if ROUTED:
        e = e_routed
    elif K_ROUTED > 0:
        e = tl.load(ids_ptr + tl.minimum(j, K_ROUTED - 1)).to(tl.int64)
    else:  # the shared expert alone (no ids to read): row 0's pointers stand in until replaced below
        e = tl.zeros([], dtype=tl.int64)
    gate_w = words_ptr + e * row_words  # gate rows 0..I-1 of gate_up, up rows I..2I-1
    up_w = gate_w + I * (H // 8)
    gate_s = bytes_ptr + e * row_words * 4 + gu_scale_at
    up_s = gate_s + I * (H // 16)
    g_gate = tl.load(gate_w + glob_at).to(tl.float32, bitcast=True)
    g_up = tl.load(gate_w + glob_at + 1).to(tl.float32, bitcast=True)
    if HAS_EXTRA:
        if j == K_ROUTED:
            gate_w, gate_s, g_gate = xg_w, xg_s, tl.load(xg_g)
            up_w, up_s, g_up = xu_w, xu_s, tl.load(xu_g)
    return gate_w, up_w, gate_s, up_s, g_gate, g_up


@triton.jit
def x_tiles(v_ptr, w, mask_w, BLOCK_W: tl.constexpr, MASKED: tl.constexpr, X_SPLIT: tl.constexpr):
    """The activations of the words' codes: 8 fp32 tiles [BLOCK_W], tile c = v[8 * w + c]."""
    if X_SPLIT:  # two contiguous [W, 4] loads (16 B of fp32 a thread), split into the tiles in registers
        ptrs = v_ptr + 8 * w[:, None] + tl.arange(0, 4)[None, :]
        if MASKED:
            lo4 = tl.load(ptrs, mask=mask_w[:, None], other=0.0).to(tl.float32)
            hi4 = tl.load(ptrs + 4, mask=mask_w[:, None], other=0.0).to(tl.float32)
        else:
            lo4 = tl.load(ptrs).to(tl.float32)
            hi4 = tl.load(ptrs + 4).to(tl.float32)
        even, odd = tl.split(tl.reshape(lo4, [BLOCK_W, 2, 2]))  # c = 2a + b: even {0, 2}, odd {1, 3}
        x0, x2 = tl.split(even)
        x1, x3 = tl.split(odd)
        even, odd = tl.split(tl.reshape(hi4, [BLOCK_W, 2, 2]))
        x4, x6 = tl.split(even)
        x5, x7 = tl.split(odd)
        return x0, x1, x2, x3, x4, x5, x6, x7
    else:  # eight stride-8 loads (L1 hits: every program reads the same activations)
        ptrs = v_ptr + 8 * w
        if MASKED:
            return (tl.load(ptrs, mask=mask_w, other=0.0).to(tl.float32),
                    tl.load(ptrs + 1, mask=mask_w, other=0.0).to(tl.float32),
                    tl.load(ptrs + 2, mask=mask_w, other=0.0).to(tl.float32),
                    tl.load(ptrs + 3, mask=mask_w, other=0.0).to(tl.float32),
                    tl.load(ptrs + 4, mask=mask_w, other=0.0).to(tl.float32),
                    tl.load(ptrs + 5, mask=mask_w, other=0.0).to(tl.float32),
                    tl.load(ptrs + 6, mask=mask_w, other=0.0).to(tl.float32),
                    tl.load(ptrs + 7, mask=mask_w, other=0.0).to(tl.float32))
        return (tl.load(ptrs).to(tl.float32), tl.load(ptrs + 1).to(tl.float32), tl.load(ptrs + 2).to(tl.float32),
                tl.load(ptrs + 3).to(tl.float32), tl.load(ptrs + 4).to(tl.float32),
                tl.load(ptrs + 5).to(tl.float32), tl.load(ptrs + 6).to(tl.float32),
                tl.load(ptrs + 7).to(tl.float32))


@triton.jit
def tile_part(w_ptr, s_ptr, rows, mask_r, w0, w, mask_w, K, xs, BLOCK_W: tl.constexpr, MASKED: tl.constexpr,
               DECODE: tl.constexpr, GROUP_SCALES: tl.constexpr):
    """One K step of dequant(W[rows, :]) * v, times 2^-14 and summed per word -> fp32 [len(rows), BLOCK_W]
    (per 16-code group with GROUP_SCALES: [len(rows), BLOCK_W / 2]), for an NVFP4 matrix [*, K] whose packed
    bytes start at w_ptr (int32 words: K/8 a row) and E4M3 scale bytes at s_ptr (K/16 a row); w: the step's
    words of the row (from w0), xs their activations (x_tiles). Offsets are int32 within one matrix."""
    words, sc = tile_loads(w_ptr, s_ptr, rows, mask_r, w0, w, mask_w, K, BLOCK_W, MASKED, GROUP_SCALES)
    return tile_math(words, sc, xs, BLOCK_W, DECODE, GROUP_SCALES)


@triton.jit
def tile_loads(w_ptr, s_ptr, rows, mask_r, w0, w, mask_w, K, BLOCK_W: tl.constexpr, MASKED: tl.constexpr,
               GROUP_SCALES: tl.constexpr):
    """tile_part's weight loads: (the words [len(rows), BLOCK_W], their scale bytes), apart from its math (for
    gate/up programs that loaded their next tile before this one's sums: tried, nvfp4_gate_up_stream, removed
    after its A/B, docs/RESULTS.md session 18)."""
    w_ptrs = w_ptr + (rows[:, None] * (K // 8) + w[None, :])
    if MASKED:
        words = tl.load(w_ptrs, mask=mask_r[:, None] & mask_w[None, :], other=0)
    else:
        words = tl.load(w_ptrs)
    if GROUP_SCALES:  # one scale byte per 16-code group
        gg = w0 // 2 + tl.arange(0, BLOCK_W // 2)
        s_ptrs = s_ptr + (rows[:, None] * (K // 16) + gg[None, :])
        if MASKED:
            sc = tl.load(s_ptrs, mask=mask_r[:, None] & (gg < K // 16)[None, :], other=0)
        else:
            sc = tl.load(s_ptrs)
    else:  # each word's group scale (the pair's two loads hit the same byte)
        s_ptrs = s_ptr + (rows[:, None] * (K // 16) + (w // 2)[None, :])
        if MASKED:
            sc = tl.load(s_ptrs, mask=mask_r[:, None] & mask_w[None, :], other=0)
        else:
            sc = tl.load(s_ptrs)
    return words, sc


@triton.jit
def tile_math(words, sc, xs, BLOCK_W: tl.constexpr, DECODE: tl.constexpr, GROUP_SCALES: tl.constexpr):
    """tile_part's arithmetic on loaded words and scale bytes."""
    part = tl.zeros(words.shape, dtype=tl.float32)
    for c in tl.static_range(4):
        lo, hi = e2m1_pair(words, c, DECODE)
        part = part + lo * xs[c][None, :]  # two chained FMAs (one add of two products would not fuse)
        part = part + hi * xs[c + 4][None, :]
    if GROUP_SCALES:  # sum each word pair first
        pairs = tl.sum(tl.reshape(part, [part.shape[0], BLOCK_W // 2, 2]), axis=2)
        return pairs * e4m3(sc, DECODE)
    else:  # (an else: Triton compiles the code after a constexpr branch's return too)
        return part * e4m3(sc, DECODE)


@triton.jit
def rows_part(w_ptr, s_ptr, w2_ptr, s2_ptr, rows, mask_r, K, v_ptr, TWO: tl.constexpr, BLOCK_G: tl.constexpr,
               MASKED: tl.constexpr, DECODE: tl.constexpr, X_SPLIT: tl.constexpr, GROUP_SCALES: tl.constexpr):
    """(W @ v, W2 @ v) * 2^-14 before the sum over K's columns (tl.sum(axis=1) finishes them) for the rows of
    one or (TWO) two NVFP4 matrices [*, K] (tile_part) sharing the activations v (K values); BLOCK_G
    16-code groups per K step (one step when it covers K), accumulated column by column. The K loop is not
    pipelined: num_stages=1, the code every caller compiled while the pipelined K steps shared this loop
    (tried: nvfp4_experts_decode.PIPELINED, removed after its A/B, docs/RESULTS.md session 18)."""
    if GROUP_SCALES:
        acc = tl.zeros([rows.shape[0], BLOCK_G], dtype=tl.float32)
    else:
        acc = tl.zeros([rows.shape[0], 2 * BLOCK_G], dtype=tl.float32)
    acc2 = acc
    for w0 in tl.range(0, K // 8, 2 * BLOCK_G, num_stages=1):
        w = w0 + tl.arange(0, 2 * BLOCK_G)
        mask_w = w < K // 8
        xs = x_tiles(v_ptr, w, mask_w, 2 * BLOCK_G, MASKED, X_SPLIT)
        acc += tile_part(w_ptr, s_ptr, rows, mask_r, w0, w, mask_w, K, xs, 2 * BLOCK_G, MASKED, DECODE,
                          GROUP_SCALES)
        if TWO:
            acc2 += tile_part(w2_ptr, s2_ptr, rows, mask_r, w0, w, mask_w, K, xs, 2 * BLOCK_G, MASKED, DECODE,
                               GROUP_SCALES)
    return acc, acc2


@triton.jit
def rows_step(w_ptr, s_ptr, w2_ptr, s2_ptr, rows, mask_r, K, xs, w, mask_w, TWO: tl.constexpr,
               BLOCK_G: tl.constexpr, MASKED: tl.constexpr, DECODE: tl.constexpr, GROUP_SCALES: tl.constexpr):
    """rows_part where one K step covers the row, its activations xs (x_tiles of words w) given: the same
    operations in the same order (the same bytes), for a persistent program that loads xs once."""
    acc = tl.zeros([rows.shape[0], BLOCK_G if GROUP_SCALES else 2 * BLOCK_G], dtype=tl.float32)
    acc2 = acc
    acc += tile_part(w_ptr, s_ptr, rows, mask_r, 0, w, mask_w, K, xs, 2 * BLOCK_G, MASKED, DECODE, GROUP_SCALES)
    if TWO:
        acc2 += tile_part(w2_ptr, s2_ptr, rows, mask_r, 0, w, mask_w, K, xs, 2 * BLOCK_G, MASKED, DECODE,
                           GROUP_SCALES)
    return acc, acc2


@triton.jit
def routed_down(act_ptr, wts_ptr, ids_ptr, words_ptr, bytes_ptr, j, m, mask_m, I, row_words, dn_at, dn_scale_at,
                 glob_at, BLOCK_G: tl.constexpr, MASKED: tl.constexpr, DECODE: tl.constexpr, X_SPLIT: tl.constexpr,
                 GROUP_SCALES: tl.constexpr, xs=None, w=None, mask_w=None, ONE_STEP: tl.constexpr = False,
                 e_routed=None, ROUTED: tl.constexpr = False):
    """Routed expert j's down rows m against act[j]: (column partials, their scale weights[j] * global * 2^14).
    ONE_STEP: act[j]'s activations xs (words w) given (rows_step). ROUTED: the expert is e_routed (the program
    found it itself), not ids[j]."""
    down, scales, glob = down_matrix(ids_ptr, words_ptr, bytes_ptr, j, row_words, dn_at, dn_scale_at, glob_at,
                                     e_routed, ROUTED)
    if ONE_STEP:
        y, _ = rows_step(down, scales, down, scales, m, mask_m, I, xs, w, mask_w, False, BLOCK_G, MASKED, DECODE,
                          GROUP_SCALES)
    else:
        y, _ = rows_part(down, scales, down, scales, m, mask_m, I, act_ptr + j * I, False, BLOCK_G, MASKED, DECODE,
                          X_SPLIT, GROUP_SCALES)
    g_down = tl.load(glob).to(tl.float32, bitcast=True) * 16384.0  # 2^14: the codes' scaling
    return y, tl.load(wts_ptr + j).to(tl.float32) * g_down


@triton.jit
def down_matrix(ids_ptr, words_ptr, bytes_ptr, j, row_words, dn_at, dn_scale_at, glob_at, e_routed=None,
                ROUTED: tl.constexpr = False):
    """Routed expert j's down matrix: (its int32 words, its scale bytes, the word of its fp32 global); the expert
    is ids[j], or e_routed where ROUTED."""
    if ROUTED:
        e = e_routed
    else:
        e = tl.load(ids_ptr + j).to(tl.int64)
    base = words_ptr + e * row_words
    return base + dn_at, bytes_ptr + e * row_words * 4 + dn_scale_at, base + glob_at + 2


@triton.jit
def extra_down(act_ptr, xd_w, xd_s, xd_g, extra_scale_ptr, m, mask_m, I, K_ROUTED: tl.constexpr,
                HAS_EXTRA_SCALE: tl.constexpr, BLOCK_G: tl.constexpr, MASKED: tl.constexpr, DECODE: tl.constexpr,
                X_SPLIT: tl.constexpr, GROUP_SCALES: tl.constexpr, xs=None, w=None, mask_w=None,
                ONE_STEP: tl.constexpr = False):
    """The extra (shared) expert's down rows m against act[k]: (column partials, their scale)."""
    if ONE_STEP:
        y, _ = rows_step(xd_w, xd_s, xd_w, xd_s, m, mask_m, I, xs, w, mask_w, False, BLOCK_G, MASKED, DECODE,
                          GROUP_SCALES)
    else:
        y, _ = rows_part(xd_w, xd_s, xd_w, xd_s, m, mask_m, I, act_ptr + K_ROUTED * I, False, BLOCK_G, MASKED,
                          DECODE, X_SPLIT, GROUP_SCALES)
    y_scale = tl.load(xd_g) * 16384.0
    if HAS_EXTRA_SCALE:
        y_scale = tl.load(extra_scale_ptr).to(tl.float32) * y_scale
    return y, y_scale
