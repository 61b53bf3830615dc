"""Batch-1 NVFP4 expert gate/up on the tensor cores: expert_gate_up's output from fewer instructions a code.

Why it was built: expert_gate_up (nvfp4_experts_decode.py) spends ~9 SASS instructions a weight code on the H200
(decode, fp16 -> fp32, one FMA, the activations' loads and the reductions), and session 12 read it as bound by
issue (9.27 us against 2.2 us of HBM time for its 10.6 MB). Measured, it is not: this kernel, at about half the
instructions a code, is slower (FUSED below says by how much). It stays as an arm and a base. Here a code costs
its decode (~2 instructions: two codes per shift/mask/or into one register of two fp16) and, in the default
form, one fp16x2 multiply by its block scale a pair; the tensor cores do the multiply-adds (tl.dot, fp32
accumulate). Two forms of one K step of STEP_K codes:
  scaled (default): A = (e2m1 * 2^-14) * (scale * 2^7) in fp16 [BLOCK_N rows, STEP_K], B = x in each of 16
    columns; every column of A @ B is the rows' dot.
  block-diagonal (scale_in_a=False, STEP_K = 256): A = e2m1 * 2^-14 (exact), B's column c holds the activations
    of the step's 16-code group c and zeros elsewhere, so D[n, c] is row n's dot with group c and the E4M3 scale
    of (n, c) multiplies D in fp32. More tensor-core work and a B of 16x the values to build.
Then gate = sum * global * 2^7 (2^14), act = SiLU(gate) * up. The codes of a word are decoded in the order 0, 4,
1, 5, 2, 6, 3, 7, so that one decoded register (codes c and c + 4) is one 32-bit operand register, and the
activations are gathered in the same order (the same join tree applied to the code indices).
The K range can be split over SPLIT programs a row tile (more warps in flight: one warp a program streams too
little); the tile's last program to arrive adds the partials in a fixed order (launch.last_to_arrive).

Precision: the activations go to fp16, exact for |x| in [2^-14, 65504] (below: within 2^-25 absolute); x here
is an RMSNorm output, |x_i| <= sqrt(H) * |1 + w_i| (fp16_safe_norm says when that bound fits fp16; the step
checks it once). Scaled weights are exact where |e2m1 * scale| >= 2^-7 (fp16 normals), else rounded to fp16
subnormals. Products are exact and summed in fp32: the bf16 level of expert_gate_up, not its bytes (another
order of sums). Deterministic, the launch fixed by the shapes, no host reads: graph replay equals eager byte for
byte, and a row gives the same bytes from the bank or a slot (its pointer and stride are not specialized on).

Reference: nvfp4_experts_decode.expert_gate_up_reference (dequantize, then fp32 math).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .launch import gdc_prologue, last_to_arrive, new_counter, pdl_launch
from .nvfp4_expert_rows import e4m3, gate_up_pointers
from .nvfp4_experts_decode import _check, _decode, _matrix, _row_offsets

# The switch of the fused decode step (profile_decode arm "mma") and the launch it uses. Off: measured slower on
# the H200 (session 13, docs/RESULTS.md): the sweep's best launch 13.47 us against expert_gate_up's 9.35 us at
# the real geometry, and the resident 16K step 1.05-1.09x in five of five paired rounds, with about half the
# SASS instructions a code. So expert_gate_up is not bound by issue: the next design has to put more bytes in
# flight (wider loads, fewer dependent phases), not fewer instructions.
FUSED = False
CONFIG = dict(split=4, block_n=16, num_warps=1)

GROUPS = tl.constexpr(16)  # the B operand's 16 columns (tl.dot's smallest N): 16 scale groups in the block-
STEP = 256  # diagonal form, whose K step is then 256 codes; the scaled form takes steps of min(256, K range)


@triton.jit
def _pairs(words):
    """int32 words -> four int32 of two fp16 each: (code c, code c + 4) as e2m1 * 2^-14, c = 0..3. The sign
    from nibble bit 3 to fp16 bit 15, e e m to bits 11..9 (e == 0: the fp16 subnormal 0.5 * m * 2^-14)."""
    p0 = ((words << 12) & -2147450880) | ((words << 9) & 0x0E000E00)  # -2147450880: 0x80008000
    p1 = ((words << 8) & -2147450880) | ((words << 5) & 0x0E000E00)
    p2 = ((words << 4) & -2147450880) | ((words << 1) & 0x0E000E00)
    p3 = (words & -2147450880) | ((words >> 3) & 0x0E000E00)
    return p0, p1, p2, p3


@triton.jit
def _halves(p):
    """An int32 of two fp16 -> (low, high) fp16 tensors (plain Triton: the interpreter's path)."""
    lo = p.to(tl.int16).to(tl.float16, bitcast=True)
    hi = (p >> 16).to(tl.int16).to(tl.float16, bitcast=True)
    return lo, hi


@triton.jit
def _join8(o0, o1, o2, o3, o4, o5, o6, o7):
    """Eight [..., W] tensors -> [..., W, 2, 2, 2]: the fixed join tree (applied to codes and to their indices)."""
    return tl.join(tl.join(tl.join(o0, o1), tl.join(o2, o3)), tl.join(tl.join(o4, o5), tl.join(o6, o7)))


@triton.jit
def _codes_fp16(words, DECODE: tl.constexpr):
    """int32 words [R, W] -> fp16 [R, W * 8]: each word's codes in the order 0,4,1,5,2,6,3,7, so that the two
    fp16 of one decoded register (codes c and c + 4) sit side by side (the join tree puts o_i and o_{i+4} next
    to each other): the tensor-core operand takes them as one 32-bit register, no repacking."""
    if DECODE == "asm":
        o0, o1, o2, o3, o4, o5, o6, o7 = tl.inline_asm_elementwise(
            """{ .reg .b32 a, b, p;
            shl.b32 a, $8, 12; and.b32 a, a, 0x80008000; shl.b32 b, $8, 9; and.b32 b, b, 0x0E000E00;
            or.b32 p, a, b; mov.b32 {$0, $4}, p;
            shl.b32 a, $8, 8; and.b32 a, a, 0x80008000; shl.b32 b, $8, 5; and.b32 b, b, 0x0E000E00;
            or.b32 p, a, b; mov.b32 {$2, $6}, p;
            shl.b32 a, $8, 4; and.b32 a, a, 0x80008000; shl.b32 b, $8, 1; and.b32 b, b, 0x0E000E00;
            or.b32 p, a, b; mov.b32 {$1, $5}, p;
            and.b32 a, $8, 0x80008000; shr.b32 b, $8, 3; and.b32 b, b, 0x0E000E00;
            or.b32 p, a, b; mov.b32 {$3, $7}, p; }""",
            "=h,=h,=h,=h,=h,=h,=h,=h,r", [words], dtype=(tl.float16,) * 8, is_pure=True, pack=1)
    else:
        p0, p1, p2, p3 = _pairs(words)
        o0, o4 = _halves(p0)
        o2, o6 = _halves(p1)
        o1, o5 = _halves(p2)
        o3, o7 = _halves(p3)
    j = _join8(o0, o1, o2, o3, o4, o5, o6, o7)
    return tl.reshape(j, [words.shape[0], words.shape[1] * 8])


@triton.jit
def _scale_x128(sbytes, DECODE: tl.constexpr):
    """E4M3 scale bytes (uint8) -> scale * 2^7, exact: as an int32 of two equal fp16 (the GPU's FP8 conversion
    and one fp16x2 multiply: 2^-2 .. 57,344 fits fp16), or fp32 in the interpreter's path."""
    if DECODE == "asm":
        out = tl.inline_asm_elementwise(
            """{ .reg .b16 lo, hi; .reg .b32 k;
            mov.b32 {lo, hi}, $1; cvt.rn.f16x2.e4m3x2 $0, lo; mov.b32 k, 0x58005800; mul.rn.f16x2 $0, $0, k; }""",
            "=r,r", [sbytes.to(tl.int32) * 257], dtype=tl.int32, is_pure=True, pack=1)
    else:
        out = e4m3(sbytes, DECODE) * 128.0
    return out


@triton.jit
def _scaled_codes_fp16(words, s2, DECODE: tl.constexpr):
    """int32 words [R, W] and each word's scale * 2^7 [R, W] (_scale_x128's) -> fp16 [R, W * 8] of
    (e2m1 * 2^-14) * (scale * 2^7) = e2m1 * scale * 2^-7, codes in _codes_fp16's order. scale * 2^7 is exact in
    fp16 (2^-2 .. 57,344), and so is the product where it is an fp16 normal, |e2m1 * scale| >= 2^-7 (at most
    6 * 448 * 2^-7 = 21); smaller terms round to fp16 subnormals (absolute 2^-25 * 2^7 of a term)."""
    if DECODE == "asm":
        o0, o1, o2, o3, o4, o5, o6, o7 = tl.inline_asm_elementwise(
            """{ .reg .b32 a, b, p;
            shl.b32 a, $8, 12; and.b32 a, a, 0x80008000; shl.b32 b, $8, 9; and.b32 b, b, 0x0E000E00;
            or.b32 p, a, b; mul.rn.f16x2 p, p, $9; mov.b32 {$0, $4}, p;
            shl.b32 a, $8, 8; and.b32 a, a, 0x80008000; shl.b32 b, $8, 5; and.b32 b, b, 0x0E000E00;
            or.b32 p, a, b; mul.rn.f16x2 p, p, $9; mov.b32 {$2, $6}, p;
            shl.b32 a, $8, 4; and.b32 a, a, 0x80008000; shl.b32 b, $8, 1; and.b32 b, b, 0x0E000E00;
            or.b32 p, a, b; mul.rn.f16x2 p, p, $9; mov.b32 {$1, $5}, p;
            and.b32 a, $8, 0x80008000; shr.b32 b, $8, 3; and.b32 b, b, 0x0E000E00;
            or.b32 p, a, b; mul.rn.f16x2 p, p, $9; mov.b32 {$3, $7}, p; }""",
            "=h,=h,=h,=h,=h,=h,=h,=h,r,r", [words, s2], dtype=(tl.float16,) * 8, is_pure=True, pack=1)
        out = tl.reshape(_join8(o0, o1, o2, o3, o4, o5, o6, o7), [words.shape[0], words.shape[1] * 8])
    else:  # the product is exact in fp32, rounded once to fp16 as mul.rn does
        c = tl.reshape(_codes_fp16(words, DECODE), [words.shape[0], words.shape[1], 8]).to(tl.float32)
        out = tl.reshape((c * s2[:, :, None]).to(tl.float16), [words.shape[0], words.shape[1] * 8])
    return out


@triton.jit
def _code_index(W: tl.constexpr):
    """The code index (8 w + c) at each position of _codes_fp16's output row [W * 8]."""
    base = 8 * tl.arange(0, W)
    j = _join8(base, base + 2, base + 1, base + 3, base + 4, base + 6, base + 5, base + 7)
    return tl.reshape(j, [W * 8])


@triton.jit
def _step_dot(w_ptr, s_ptr, rows, mask_n, k0, H, b, STEP_K: tl.constexpr, DECODE: tl.constexpr,
              MASKED: tl.constexpr, SCALE_IN_A: tl.constexpr):
    """One K step (STEP_K codes from k0) of one matrix's rows, fp32 [BLOCK_N, 16] (times 2^-7 where SCALE_IN_A,
    else 2^-14: the decoded weights' scaling). SCALE_IN_A: the
    block scales multiply the decoded codes (fp16) and b holds x in every column (each column of the result is
    the row's dot); else b is block-diagonal (column c: group c's activations) and the scales multiply the
    result's columns."""
    if SCALE_IN_A:  # words as [rows, groups, 2]: a group's scale byte loaded once for its two words
        G: tl.constexpr = STEP_K // 16
        g = k0 // 16 + tl.arange(0, G)
        w = (2 * g)[:, None] + tl.arange(0, 2)[None, :]  # [G, 2]
        w_offs = rows[:, None, None] * (H // 8) + w[None, :, :]
        s_offs = rows[:, None] * (H // 16) + g[None, :]
        if MASKED:
            words = tl.load(w_ptr + w_offs, mask=mask_n[:, None, None], other=0)
            sc = tl.load(s_ptr + s_offs, mask=mask_n[:, None], other=0)
        else:
            words = tl.load(w_ptr + w_offs)
            sc = tl.load(s_ptr + s_offs)
        words = tl.reshape(words, [rows.shape[0], STEP_K // 8])
        s2 = _scale_x128(sc, DECODE)  # once a group, then the same register for its two words
        s2 = tl.reshape(tl.broadcast_to(s2[:, :, None], [rows.shape[0], G, 2]), [rows.shape[0], STEP_K // 8])
        d = tl.dot(_scaled_codes_fp16(words, s2, DECODE), b)
    else:
        w = k0 // 8 + tl.arange(0, STEP_K // 8)
        g = k0 // 16 + tl.arange(0, GROUPS)
        if MASKED:
            words = tl.load(w_ptr + (rows[:, None] * (H // 8) + w[None, :]), mask=mask_n[:, None], other=0)
            sc = tl.load(s_ptr + (rows[:, None] * (H // 16) + g[None, :]), mask=mask_n[:, None], other=0)
        else:
            words = tl.load(w_ptr + (rows[:, None] * (H // 8) + w[None, :]))
            sc = tl.load(s_ptr + (rows[:, None] * (H // 16) + g[None, :]))
        d = tl.dot(_codes_fp16(words, DECODE), b) * e4m3(sc, DECODE)
    return d


@triton.jit
def _act_store(act_ptr, j, n, mask_n, gate, up, g_gate, g_up, I, UNIT: tl.constexpr):
    """act = SiLU(gate) * up from the two sums, UNIT (2^14 or 2^7: the decoded weights' scaling) and the globals."""
    gate = gate * (g_gate * UNIT)  # exact: a power of 2
    up = up * (g_up * UNIT)
    tl.store(act_ptr + j * I + n, gate / (1.0 + tl.exp(-gate)) * up, mask=mask_n)


@triton.jit(do_not_specialize=["words_ptr", "bytes_ptr", "row_words"])
def expert_gate_up_mma_kernel(x_ptr, ids_ptr, words_ptr, bytes_ptr, act_ptr, part_ptr, counters_ptr, row_words,
                              gu_scale_at, glob_at, xg_w, xg_s, xg_g, xu_w, xu_s, xu_g, H: tl.constexpr,
                              I: tl.constexpr, K_ROUTED: tl.constexpr, HAS_EXTRA: tl.constexpr,
                              BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, STEP_K: tl.constexpr,
                              DECODE: tl.constexpr,
                              MASKED: tl.constexpr, SCALE_IN_A: tl.constexpr = True, FENCE: tl.constexpr = False,
                              USE_GDC: tl.constexpr = False):
    """Grid (k (+1) experts, I / BLOCK_N, SPLIT): program (j, q, s) takes BLOCK_N gate rows and the same up
    rows of expert j over the s-th of SPLIT equal K ranges, STEP_K codes a step (all steps' loads in flight: a
    static loop). SPLIT > 1: it stores its two partial sums, and the tile's last program to arrive adds the
    SPLIT partials in the order s = 0, 1, ... (the same bytes whoever arrives last) and writes act."""
    gdc_prologue(USE_GDC)  # PDL: nothing is read before the previous kernel ends
    j = tl.program_id(0)
    q = tl.program_id(1)
    n = q * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = n < I
    gate_w, up_w, gate_s, up_s, g_gate, g_up = gate_up_pointers(
        ids_ptr, words_ptr, bytes_ptr, H, I, row_words, gu_scale_at, glob_at, xg_w, xg_s, xg_g, xu_w, xu_s, xu_g, j,
        K_ROUTED, HAS_EXTRA)
    rows = n  # int32 offsets within one matrix (the 64-bit part is in the matrix pointers): fewer instructions
    pos = tl.arange(0, STEP_K)
    idx = _code_index(STEP_K // 8)  # the activation each column position of the decoded tile multiplies
    col = tl.arange(0, GROUPS)
    in_group = (pos // 16)[:, None] == col[None, :]
    acc_g = tl.zeros([BLOCK_N, GROUPS], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_N, GROUPS], dtype=tl.float32)
    K_PART: tl.constexpr = H // SPLIT
    for t in tl.static_range(K_PART // STEP_K):
        k0 = tl.program_id(2) * K_PART + t * STEP_K
        xv = tl.load(x_ptr + k0 + idx).to(tl.float16)
        if SCALE_IN_A:
            b = tl.broadcast_to(xv[:, None], [STEP_K, GROUPS])
        else:  # [256, 16]: group c's activations in column c
            b = tl.where(in_group, xv[:, None], tl.zeros_like(xv)[:, None])
        acc_g += _step_dot(gate_w, gate_s, rows, mask_n, k0, H, b, STEP_K, DECODE, MASKED, SCALE_IN_A)
        acc_u += _step_dot(up_w, up_s, rows, mask_n, k0, H, b, STEP_K, DECODE, MASKED, SCALE_IN_A)
    if SCALE_IN_A:  # every column holds the row's dot: take column 0 (adding zeros: exact)
        acc_g = tl.where(col[None, :] == 0, acc_g, 0.0)
        acc_u = tl.where(col[None, :] == 0, acc_u, 0.0)
    gate = tl.sum(acc_g, axis=1)
    up = tl.sum(acc_u, axis=1)
    UNIT: tl.constexpr = 128.0 if SCALE_IN_A else 16384.0  # 2^7 (scales in the weights) or 2^14
    if SPLIT == 1:
        _act_store(act_ptr, j, n, mask_n, gate, up, g_gate, g_up, I, UNIT)
    else:
        tile = j * tl.num_programs(1) + q
        lane = tl.arange(0, BLOCK_N)
        mine = part_ptr + (tile * SPLIT + tl.program_id(2)) * (2 * BLOCK_N) + lane
        tl.store(mine, gate)
        tl.store(mine + BLOCK_N, up)
        if last_to_arrive(counters_ptr + tile, SPLIT, FENCE):
            gate = tl.zeros([BLOCK_N], dtype=tl.float32)
            up = tl.zeros([BLOCK_N], dtype=tl.float32)
            for s in tl.static_range(SPLIT):  # in order: the bytes do not depend on who arrived last
                theirs = part_ptr + (tile * SPLIT + s) * (2 * BLOCK_N) + lane
                gate += tl.load(theirs, cache_modifier=".cg")
                up += tl.load(theirs + BLOCK_N, cache_modifier=".cg")
            _act_store(act_ptr, j, n, mask_n, gate, up, g_gate, g_up, I, UNIT)


def fp16_safe_norm(weight: torch.Tensor, hidden: int) -> bool:
    """Whether every output of the model's (zero-centered) RMSNorm with this weight fits fp16 with room: an
    output is x_i / rms(x) * (1 + w_i) and |x_i| <= sqrt(H) * rms(x) (the sum of squares bounds each square),
    so |out_i| <= sqrt(H) * |1 + w_i|; a factor 2 of headroom for the bf16 rounding. One host read: call it
    at load or on an eager step, never inside a capture."""
    return float((1.0 + weight.detach().float()).abs().max()) * math.sqrt(hidden) * 2 < 65504.0


def step_codes(hidden: int, split: int, scale_in_a: bool = True) -> int | None:
    """The K step of a launch (codes), or None where the shapes do not allow one: each program's K range
    (hidden / split) whole steps of a power of 2 >= 16 codes (tl.dot's smallest K), at most 256; the block-
    diagonal form needs steps of exactly 256 (16 groups, the B operand's 16 columns)."""
    if split < 1 or hidden % split:
        return None
    part = hidden // split
    step = min(STEP, part)
    if part % step or step % 16 or step & (step - 1) or (not scale_in_a and step != STEP):
        return None
    return step


def expert_gate_up_mma(x: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor, hidden: int, inter: int,
                       extra: tuple | None = None, out: torch.Tensor | None = None, *, counters=None,
                       block_n: int = 16, split: int = 4, num_warps: int = 1, num_stages: int = 2,
                       decode: str | None = None, scale_in_a: bool = True) -> torch.Tensor:
    """expert_gate_up's act fp32 [k (+1), I] (the same arguments) on the tensor cores. hidden / split must be
    whole K steps (step_codes); block_n a power of 2 >= 16 (tl.dot's smallest M). split > 1 needs counters =
    counters_for(...) made before any CUDA-graph capture (launch.new_counter)."""
    words = _check(rows, hidden, inter)
    step = step_codes(hidden, split, scale_in_a)
    if step is None:
        raise ValueError(f"expert_gate_up_mma cannot split hidden {hidden} into {split} ranges of whole K steps "
                         f"(a power of 2 >= 16 codes{'' if scale_in_a else ', 256 for the block-diagonal form'})")
    if block_n < 16 or block_n & (block_n - 1):
        raise ValueError(f"block_n must be a power of 2 >= 16, got {block_n}")
    k = ids.shape[-1]
    n = k + (extra is not None)
    tiles = triton.cdiv(inter, block_n)
    if out is None:
        out = torch.empty(n, inter, device=x.device, dtype=torch.float32)
    if split > 1:
        if counters is None:
            counters = new_counter(x.device, n * tiles)
        if counters.dtype != torch.int32 or counters.numel() < n * tiles:
            raise ValueError(f"counters must be launch.new_counter(device, >= {n * tiles})")
        part = torch.empty(n * tiles * split * 2 * block_n, device=x.device, dtype=torch.float32)
    else:
        counters = part = out
    gate = up = (words, rows, out)
    if extra is not None:
        gate, up = _matrix(*extra[:3]), _matrix(*extra[3:])
    off = _row_offsets(hidden, inter)
    expert_gate_up_mma_kernel[(n, tiles, split)](
        x.reshape(-1).contiguous(), ids.reshape(-1).contiguous(), words, rows, out, part, counters,
        words.stride(0), off["gu_scale_at"], off["glob_at"], *gate, *up, H=hidden, I=inter, K_ROUTED=k,
        HAS_EXTRA=extra is not None, BLOCK_N=block_n, SPLIT=split, STEP_K=step, DECODE=_decode(decode, rows),
        MASKED=inter % block_n != 0, SCALE_IN_A=scale_in_a, FENCE=x.is_cuda, num_warps=num_warps,
        num_stages=num_stages, **pdl_launch(x.device))
    return out


def counters_for(device: torch.device, experts: int, inter: int, block_n: int = 16) -> torch.Tensor:
    """The arrival counters of one call site's split launches (one an (expert, row tile)); made eagerly."""
    return new_counter(device, experts * triton.cdiv(inter, block_n))
