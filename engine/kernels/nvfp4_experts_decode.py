"""Batch-1 (decode) NVFP4 experts in two launches: routed experts and the shared expert together.

expert_gate_up: one launch writes act[j] = SiLU(gate_j x) * (up_j x) in fp32 for the k routed experts (rows of
the bank or slot cache, layout in quant/nvfp4_rows.py) and, with `extra`, the shared expert's three separate
NVFP4 linears as act[k]. expert_down: one launch; each program owns a tile of H outputs and sums
weights[j] * (down_j act[j]) for j = 0..k-1, then extra_scale * (down_extra act[k]), then `addend`, in that
fixed order in fp32, and stores once (each expert's per-column partials add up element by element in that
order, then one sum over the columns). No partial buffer, no torch sum, no atomics: deterministic, and the
bytes do not depend on where a row lives (bank or slot: the rows' pointer and stride are not specialized on,
so both get the same compiled code). No host reads of ids (CUDA-graph capturable).

Speed (memory-bound; the lead sweeps the launch keywords on the GPU, scripts/bench_nvfp4_experts_decode.py):
each program holds the whole K row (H = 2048 for gate_up, I = 512 for down) of a few rows as a 2-D tile of
int32 words, 8 E2M1 codes each (contiguous along the row: 128 B a warp per load; rows are only 4-byte aligned,
1,769,484 B apart, so wider loads are not possible). Two codes decode together: nibbles c and c+4 of a word
land in the two fp16 halves of one int32 (two shifts, two LOP3) as s.ee.m -> fp16 bits 15, 11..9, i.e. the
E2M1 value * 2^-14 (subnormals included), and one HADD2.F32 each makes them fp32 (decode="asm": via PTX, as
Triton's own 16-bit path repacks the halves with PRMTs first). The E4M3 scale bytes go through the GPU's FP8
conversion, once per 16 codes (group_scales) or per word. Gate and up share one pass over x; the activations a
word needs, v[8w .. 8w+7], come as eight stride-8 loads or (x_split) two contiguous ones split in registers.
sm_90 SASS (compiled here with Triton's ptxas, no GPU) is ~6 instructions per code for gate_up, ~7.6 for
down; the decode itself is ~4 (2 integer, 1 conversion, 1 FMA). decode="exact" swaps in nvfp4_triton's
integer decodes (no fp16 subnormals, no FP8 conversion: for sm_80, or a GPU that flushes subnormals).

References: expert_gate_up_reference / expert_down_reference below (dequant_expert_rows and dequant_nvfp4, then
the plain fp32 math in the same summation order).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .launch import gdc_prologue, pdl_launch
from ..quant.formats import dequant_nvfp4
from ..quant.nvfp4_rows import dequant_expert_rows, nvfp4_expert_row_bytes
from .nvfp4_triton import _e2m1_exact, _e4m3_exact, _store_exact, exact_out


@triton.jit
def _e2m1_pair(words, C: tl.constexpr, DECODE: tl.constexpr):
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
def _e4m3(bits, DECODE: tl.constexpr):
    """E4M3 scale bytes -> fp32: the GPU's FP8 conversion (sm_89+), or nvfp4_triton's integer decode."""
    if DECODE == "exact":
        return _e4m3_exact(bits.to(tl.int32))
    return bits.to(tl.float8e4nv, bitcast=True).to(tl.float32)


@triton.jit
def _x_tiles(v_ptr, w, mask_w, BLOCK_W: tl.constexpr, MASKED: tl.constexpr, X_SPLIT: tl.constexpr):
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
def _tile_part(w_ptr, s_ptr, rows, mask_r, w0, w, mask_w, K, xs, BLOCK_W: tl.constexpr, MASKED: tl.constexpr,
               DECODE: tl.constexpr, GROUP_SCALES: tl.constexpr):
    """One K step of dequant(W[rows, :]) * v, times 2^-14 and summed per word -> fp32 [len(rows), BLOCK_W]
    (per 16-code group with GROUP_SCALES: [len(rows), BLOCK_W / 2]), for an NVFP4 matrix [*, K] whose packed
    bytes start at w_ptr (int32 words: K/8 a row) and E4M3 scale bytes at s_ptr (K/16 a row); w: the step's
    words of the row (from w0), xs their activations (_x_tiles). Offsets are int32 within one matrix."""
    w_ptrs = w_ptr + (rows[:, None] * (K // 8) + w[None, :])
    if MASKED:
        words = tl.load(w_ptrs, mask=mask_r[:, None] & mask_w[None, :], other=0)
    else:
        words = tl.load(w_ptrs)
    part = tl.zeros(words.shape, dtype=tl.float32)
    for c in tl.static_range(4):
        lo, hi = _e2m1_pair(words, c, DECODE)
        part = part + lo * xs[c][None, :]  # two chained FMAs (one add of two products would not fuse)
        part = part + hi * xs[c + 4][None, :]
    if GROUP_SCALES:  # one scale byte per 16-code group: sum each word pair first
        pairs = tl.sum(tl.reshape(part, [part.shape[0], BLOCK_W // 2, 2]), axis=2)
        gg = w0 // 2 + tl.arange(0, BLOCK_W // 2)
        s_ptrs = s_ptr + (rows[:, None] * (K // 16) + gg[None, :])
        if MASKED:
            sc = tl.load(s_ptrs, mask=mask_r[:, None] & (gg < K // 16)[None, :], other=0)
        else:
            sc = tl.load(s_ptrs)
        return pairs * _e4m3(sc, DECODE)
    else:  # each word's group scale (the pair's two loads hit the same byte)
        s_ptrs = s_ptr + (rows[:, None] * (K // 16) + (w // 2)[None, :])
        if MASKED:
            sc = tl.load(s_ptrs, mask=mask_r[:, None] & mask_w[None, :], other=0)
        else:
            sc = tl.load(s_ptrs)
        return part * _e4m3(sc, DECODE)


@triton.jit
def _rows_part(w_ptr, s_ptr, w2_ptr, s2_ptr, rows, mask_r, K, v_ptr, TWO: tl.constexpr, BLOCK_G: tl.constexpr,
               MASKED: tl.constexpr, DECODE: tl.constexpr, X_SPLIT: tl.constexpr, GROUP_SCALES: tl.constexpr):
    """(W @ v, W2 @ v) * 2^-14 before the sum over K's columns (tl.sum(axis=1) finishes them) for the rows of
    one or (TWO) two NVFP4 matrices [*, K] (_tile_part) sharing the activations v (K values); BLOCK_G
    16-code groups per K step (one step when it covers K), accumulated column by column."""
    if GROUP_SCALES:
        acc = tl.zeros([rows.shape[0], BLOCK_G], dtype=tl.float32)
    else:
        acc = tl.zeros([rows.shape[0], 2 * BLOCK_G], dtype=tl.float32)
    acc2 = acc
    for w0 in range(0, K // 8, 2 * BLOCK_G):
        w = w0 + tl.arange(0, 2 * BLOCK_G)
        mask_w = w < K // 8
        xs = _x_tiles(v_ptr, w, mask_w, 2 * BLOCK_G, MASKED, X_SPLIT)
        acc += _tile_part(w_ptr, s_ptr, rows, mask_r, w0, w, mask_w, K, xs, 2 * BLOCK_G, MASKED, DECODE,
                          GROUP_SCALES)
        if TWO:
            acc2 += _tile_part(w2_ptr, s2_ptr, rows, mask_r, w0, w, mask_w, K, xs, 2 * BLOCK_G, MASKED, DECODE,
                               GROUP_SCALES)
    return acc, acc2


@triton.jit(do_not_specialize=["words_ptr", "bytes_ptr", "row_words"])
def expert_gate_up_kernel(x_ptr, ids_ptr, words_ptr, bytes_ptr, act_ptr, H, I, row_words, gu_scale_at, glob_at,
                          xg_w, xg_s, xg_g, xu_w, xu_s, xu_g,
                          K_ROUTED: tl.constexpr, HAS_EXTRA: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_G: tl.constexpr, MASKED: tl.constexpr, DECODE: tl.constexpr,
                          X_SPLIT: tl.constexpr, GROUP_SCALES: tl.constexpr, USE_GDC: tl.constexpr = False):
    gdc_prologue(USE_GDC)  # PDL: nothing is read before the previous kernel ends
    j = tl.program_id(0)  # expert: 0..k-1 routed, k the extra (shared) one
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = n < I
    if K_ROUTED > 0:
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
    # int64 rows here, int32 in the down kernel: fewer SASS instructions for each at the real shape (sm_90).
    gate, up = _rows_part(gate_w, gate_s, up_w, up_s, n.to(tl.int64), mask_n, H, x_ptr, True, BLOCK_G, MASKED,
                          DECODE, X_SPLIT, GROUP_SCALES)
    gate = tl.sum(gate, axis=1) * (g_gate * 16384.0)  # 2^14: the codes' scaling, exact
    up = tl.sum(up, axis=1) * (g_up * 16384.0)
    tl.store(act_ptr + j * I + n, gate / (1.0 + tl.exp(-gate)) * up, mask=mask_n)


@triton.jit
def _routed_down(act_ptr, wts_ptr, ids_ptr, words_ptr, bytes_ptr, j, m, mask_m, I, row_words, dn_at, dn_scale_at,
                 glob_at, BLOCK_G: tl.constexpr, MASKED: tl.constexpr, DECODE: tl.constexpr, X_SPLIT: tl.constexpr,
                 GROUP_SCALES: tl.constexpr):
    """Routed expert j's down rows m against act[j]: (column partials, their scale weights[j] * global * 2^14)."""
    e = tl.load(ids_ptr + j).to(tl.int64)
    base = words_ptr + e * row_words
    scales = bytes_ptr + e * row_words * 4 + dn_scale_at
    y, _ = _rows_part(base + dn_at, scales, base, scales, m, mask_m, I, act_ptr + j * I, False, BLOCK_G, MASKED,
                      DECODE, X_SPLIT, GROUP_SCALES)
    g_down = tl.load(base + glob_at + 2).to(tl.float32, bitcast=True) * 16384.0  # 2^14: the codes' scaling
    return y, tl.load(wts_ptr + j).to(tl.float32) * g_down


@triton.jit
def _extra_down(act_ptr, xd_w, xd_s, xd_g, extra_scale_ptr, m, mask_m, I, K_ROUTED: tl.constexpr,
                HAS_EXTRA_SCALE: tl.constexpr, BLOCK_G: tl.constexpr, MASKED: tl.constexpr, DECODE: tl.constexpr,
                X_SPLIT: tl.constexpr, GROUP_SCALES: tl.constexpr):
    """The extra (shared) expert's down rows m against act[k]: (column partials, their scale)."""
    y, _ = _rows_part(xd_w, xd_s, xd_w, xd_s, m, mask_m, I, act_ptr + K_ROUTED * I, False, BLOCK_G, MASKED,
                      DECODE, X_SPLIT, GROUP_SCALES)
    y_scale = tl.load(xd_g) * 16384.0
    if HAS_EXTRA_SCALE:
        y_scale = tl.load(extra_scale_ptr).to(tl.float32) * y_scale
    return y, y_scale


@triton.jit(do_not_specialize=["words_ptr", "bytes_ptr", "row_words"])
def expert_down_kernel(act_ptr, wts_ptr, ids_ptr, words_ptr, bytes_ptr, out_ptr, H, I, row_words,
                       dn_at, dn_scale_at, glob_at, xd_w, xd_s, xd_g, extra_scale_ptr, addend_ptr,
                       K_ROUTED: tl.constexpr, HAS_EXTRA: tl.constexpr, HAS_EXTRA_SCALE: tl.constexpr,
                       HAS_ADDEND: tl.constexpr, OUT_BF16: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_G: tl.constexpr, MASKED: tl.constexpr, DECODE: tl.constexpr,
                       X_SPLIT: tl.constexpr, GROUP_SCALES: tl.constexpr, USE_GDC: tl.constexpr = False):
    gdc_prologue(USE_GDC)  # PDL: nothing is read before the previous kernel ends
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = m < H
    # The experts' column partials add up element by element in order j = 0..k-1, then the extra; one sum over
    # the columns at the end (not one cross-thread reduction per expert).
    acc = tl.zeros([BLOCK_M, BLOCK_G if GROUP_SCALES else 2 * BLOCK_G], dtype=tl.float32)
    for j in tl.static_range(K_ROUTED):  # unrolled: all k experts' loads can be in flight together
        y, y_scale = _routed_down(act_ptr, wts_ptr, ids_ptr, words_ptr, bytes_ptr, j, m, mask_m, I, row_words, dn_at,
                                  dn_scale_at, glob_at, BLOCK_G, MASKED, DECODE, X_SPLIT, GROUP_SCALES)
        acc += y * y_scale
    if HAS_EXTRA:
        y, y_scale = _extra_down(act_ptr, xd_w, xd_s, xd_g, extra_scale_ptr, m, mask_m, I, K_ROUTED,
                                 HAS_EXTRA_SCALE, BLOCK_G, MASKED, DECODE, X_SPLIT, GROUP_SCALES)
        acc += y * y_scale
    out = tl.sum(acc, axis=1)
    if HAS_ADDEND:
        out += tl.load(addend_ptr + m, mask=mask_m, other=0.0).to(tl.float32)
    _store_exact(out_ptr + m, out, mask_m, OUT_BF16)


def _row_offsets(hidden: int, inter: int) -> dict[str, int]:
    """Where the parts of a row start (quant/nvfp4_rows.py, as nvfp4_triton.nvfp4_row_parts): gate_up scales
    and down scales in bytes, down packed and the fp32 globals in int32 words."""
    gu_scales = inter * hidden
    down = gu_scales + inter * hidden // 8
    down_scales = down + hidden * inter // 2
    return dict(gu_scale_at=gu_scales, dn_at=down // 4, dn_scale_at=down_scales,
                glob_at=(down_scales + hidden * inter // 16) // 4)


def _check(rows: torch.Tensor, hidden: int, inter: int) -> torch.Tensor:
    """rows as int32 words (the kernels read codes and globals as 4-byte words; the real row, 1,769,484 B, is a
    multiple of 4)."""
    if hidden % 16 or inter % 16:
        raise ValueError(f"NVFP4 needs hidden and inter to be multiples of 16, got {hidden}, {inter}")
    need = nvfp4_expert_row_bytes(hidden, inter)
    if rows.dtype != torch.uint8 or rows.dim() != 2 or rows.stride(1) != 1 or rows.shape[1] < need:
        raise ValueError(f"rows must be uint8 [E, >= {need}] with unit inner stride")
    if rows.stride(0) % 4 or rows.data_ptr() % 4:
        raise ValueError(f"rows must start and stride on 4-byte words, got stride {rows.stride(0)}")
    return rows.view(torch.int32)


def _matrix(packed: torch.Tensor, scale: torch.Tensor, scale2: torch.Tensor):
    """A QuantLinear's NVFP4 triple as the kernels read it: packed as int32 words, scale bytes, fp32 global."""
    return (packed.contiguous().view(torch.int32), scale.contiguous().view(torch.uint8),
            scale2.reshape(1).to(torch.float32))


DECODES = ("asm", "fp16", "exact")


def _decode(decode: str | None, rows: torch.Tensor) -> str:
    """The E2M1/E4M3 decode: "asm" (fp16 halves via PTX; CUDA only), "fp16" (the same in plain Triton, with a
    repacking of 16-bit registers on the GPU), "exact" (integer decodes, no fp16 subnormals or FP8 conversion:
    sm_80, or a GPU that flushes fp16 subnormals). None: "asm" on CUDA, "fp16" in the interpreter."""
    decode = decode or ("asm" if rows.is_cuda else "fp16")
    if decode not in DECODES:
        raise ValueError(f"decode must be one of {DECODES}, got {decode!r}")
    return decode


def _block_g(k_in: int, block_g: int | None) -> int:
    groups = triton.next_power_of_2(k_in // 16)
    return groups if block_g is None else min(block_g, groups)


def expert_gate_up(x: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor, hidden: int, inter: int,
                   extra: tuple | None = None, out: torch.Tensor | None = None, *, block_n: int = 2,
                   block_g: int | None = None, num_warps: int = 4, decode: str | None = None,
                   x_split: bool = True, group_scales: bool = False) -> torch.Tensor:
    """act fp32 [n, I] (n = k, + 1 with extra): act[j] = SiLU(gate_j x) * (up_j x) for the row rows[ids[0, j]]
    and, with extra = (gate_packed, gate_scale, gate_scale2, up_packed, up_scale, up_scale2) (QuantLinear NVFP4
    tensors [I, H/2], [I, H/16] e4m3, fp32 []), act[k] for that expert. x [1, H] (or [H]) bf16/fp16/fp32,
    ids [1, k] int on the device, rows uint8 [E or S, >= row bytes]. One launch, grid (n, I / block_n).
    block_g: 16-code groups per K step (None: the whole row at once). block_n 2: the H200 sweep's best (9.35 us
    vs 10.47 at 8 for the real geometry, scripts/bench_nvfp4_experts_decode.py)."""
    words = _check(rows, hidden, inter)
    k = ids.shape[-1]
    n = k + (extra is not None)
    if out is None:
        out = torch.empty(n, inter, device=x.device, dtype=torch.float32)
    gate = up = (words, rows, out)  # unused stand-ins of the right pointer types
    if extra is not None:
        gate, up = _matrix(*extra[:3]), _matrix(*extra[3:])
    bg = _block_g(hidden, block_g)
    masked = inter % block_n != 0 or (hidden // 16) % bg != 0
    off = _row_offsets(hidden, inter)
    expert_gate_up_kernel[(n, triton.cdiv(inter, block_n))](
        x.reshape(-1).contiguous(), ids.reshape(-1).contiguous(), words, rows, out, hidden, inter, words.stride(0),
        off["gu_scale_at"], off["glob_at"], *gate, *up, K_ROUTED=k, HAS_EXTRA=extra is not None, BLOCK_N=block_n,
        BLOCK_G=bg, MASKED=masked, DECODE=_decode(decode, rows), X_SPLIT=x_split, GROUP_SCALES=group_scales,
        num_warps=num_warps, **pdl_launch(x.device))
    return out


def expert_down(act: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor, hidden: int,
                inter: int, extra: tuple | None = None, extra_scale: torch.Tensor | None = None,
                addend: torch.Tensor | None = None, out_dtype: torch.dtype | None = None,
                out: torch.Tensor | None = None, *, block_m: int = 8, block_g: int | None = None,
                num_warps: int = 2, decode: str | None = None, x_split: bool = False,
                group_scales: bool = True) -> torch.Tensor:
    """[1, H] in out_dtype (default weights.dtype) = sum_j weights[0, j] * (down_j @ act[j]), j = 0..k-1 in order,
    + extra_scale * (down_extra @ act[k]) with extra = (down_packed, down_scale, down_scale2) (extra_scale: a
    one-element device tensor, e.g. the shared expert's sigmoid gate; None: 1), + addend [1, H] (any float
    dtype), summed in fp32 in that order and stored once. act fp32 [k (+1), I] (expert_gate_up's). One launch,
    grid H / block_m; each program loops over the experts."""
    words = _check(rows, hidden, inter)
    k = ids.shape[-1]
    out_dtype = out_dtype or weights.dtype
    if out is None:
        out = torch.empty(1, hidden, device=act.device, dtype=out_dtype)
    down = _matrix(*extra) if extra is not None else (words, rows, act)
    scale = extra_scale.reshape(-1) if extra_scale is not None else act
    bg = _block_g(inter, block_g)
    masked = hidden % block_m != 0 or (inter // 16) % bg != 0
    off = _row_offsets(hidden, inter)
    expert_down_kernel[(triton.cdiv(hidden, block_m),)](
        act.contiguous(), weights.reshape(-1).contiguous(), ids.reshape(-1).contiguous(), words, rows,
        exact_out(out), hidden, inter, words.stride(0), off["dn_at"], off["dn_scale_at"], off["glob_at"], *down,
        scale, addend.reshape(-1).contiguous() if addend is not None else act,
        K_ROUTED=k, HAS_EXTRA=extra is not None, HAS_EXTRA_SCALE=extra_scale is not None,
        HAS_ADDEND=addend is not None, OUT_BF16=out.dtype == torch.bfloat16, BLOCK_M=block_m, BLOCK_G=bg,
        MASKED=masked, DECODE=_decode(decode, rows), X_SPLIT=x_split, GROUP_SCALES=group_scales,
        num_warps=num_warps, **pdl_launch(act.device))
    return out


def nvfp4_triples(*linears) -> tuple:
    """QuantLinear NVFP4 layers -> their (weight, weight_scale, weight_scale_2) triples (for `shared`)."""
    return tuple((q.tensors["weight"], q.tensors["weight_scale"], q.tensors["weight_scale_2"]) for q in linears)


def nvfp4_moe_decode_fused(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor,
                           hidden: int, inter: int, shared: tuple | None = None,
                           shared_scale: torch.Tensor | None = None, gate_up_config: dict | None = None,
                           down_config: dict | None = None) -> torch.Tensor:
    """Routed experts (+ the shared expert) in two launches -> [1, H] in x.dtype. shared: the shared expert's
    ((gate packed, scale, scale2), (up ...), (down ...)), e.g. nvfp4_triples(gate_proj, up_proj, down_proj);
    shared_scale: its sigmoid gate (one-element device tensor). *_config: launch keywords of the two kernels."""
    gate_up_extra = shared[0] + shared[1] if shared is not None else None
    act = expert_gate_up(x, ids, rows, hidden, inter, gate_up_extra, **(gate_up_config or {}))
    return expert_down(act, weights, ids, rows, hidden, inter, shared[2] if shared is not None else None,
                       shared_scale, out_dtype=x.dtype, **(down_config or {}))


# ---- torch references (dequantize, then the plain fp32 math in the kernels' order) ----

def _swiglu_fp32(gate: torch.Tensor, up: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return F.silu(gate @ x) * (up @ x)


def expert_gate_up_reference(x: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor, hidden: int, inter: int,
                             extra: tuple | None = None) -> torch.Tensor:
    gate_up, _ = dequant_expert_rows(rows[ids.reshape(-1)], hidden, inter, torch.float32)
    xf = x.reshape(-1).float()
    act = [_swiglu_fp32(gu[:inter], gu[inter:], xf) for gu in gate_up]
    if extra is not None:
        act.append(_swiglu_fp32(dequant_nvfp4(*extra[:3]), dequant_nvfp4(*extra[3:]), xf))
    return torch.stack(act)


def expert_down_reference(act: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor,
                          hidden: int, inter: int, extra: tuple | None = None,
                          extra_scale: torch.Tensor | None = None, addend: torch.Tensor | None = None,
                          out_dtype: torch.dtype | None = None) -> torch.Tensor:
    _, down = dequant_expert_rows(rows[ids.reshape(-1)], hidden, inter, torch.float32)
    wts = weights.reshape(-1).float()
    out = torch.zeros(hidden, dtype=torch.float32, device=act.device)
    for j in range(ids.shape[-1]):
        out = out + wts[j] * (down[j] @ act[j])
    if extra is not None:
        y = dequant_nvfp4(*extra) @ act[ids.shape[-1]]
        out = out + (extra_scale.reshape(()).float() * y if extra_scale is not None else y)
    if addend is not None:
        out = out + addend.reshape(-1).float()
    return out.to(out_dtype or weights.dtype)[None]


def nvfp4_moe_decode_fused_reference(x, weights, ids, rows, hidden, inter, shared=None, shared_scale=None):
    act = expert_gate_up_reference(x, ids, rows, hidden, inter, shared[0] + shared[1] if shared else None)
    return expert_down_reference(act, weights, ids, rows, hidden, inter, shared[2] if shared else None,
                                 shared_scale, out_dtype=x.dtype)
