"""Batch-1 (decode) NVFP4 experts in two launches: routed experts and the shared expert together.

expert_gate_up: one launch writes act[j] = SiLU(gate_j x) * (up_j x) in fp32 for the k routed experts (rows of
the bank or slot cache, layout in quant/nvfp4_rows.py) and, with `extra`, the shared expert's three separate
NVFP4 linears as act[k]. expert_down: one launch; each program owns a tile of H outputs and sums
weights[j] * (down_j act[j]) for j = 0..k-1, then extra_scale * (down_extra act[k]), then `addend`, in that
fixed order in fp32, and stores once. No partial buffer, no torch sum, no atomics: deterministic, and the bytes
do not depend on where a row lives (bank or slot; the row stride is not specialized on, so the compiled code
is the same for both). No host reads of ids (CUDA-graph capturable).

Speed (memory-bound; the lead sweeps the launch keywords on the GPU): each program holds the whole K row
(H = 2048 for gate_up, I = 512 for down) as int32 words, 8 E2M1 codes each, read [rows, K/16, 2] so that one
E4M3 scale byte serves the two words of its 16-code group. Two codes decode together with four integer ops:
nibbles c and c+4 of a word land in the two fp16 halves of one int32 as s.ee.m -> fp16 bits 15, 11..9, which
is the E2M1 value * 2^-14 (subnormals included), and _e4m3_x2p14 gives the scale * 2^14, so their product is
the weight exactly (before the fp32 global). EXACT_DECODE swaps in nvfp4_triton's bit-built fp32 decodes
(no fp16 subnormals) should a GPU flush them.

References: expert_gate_up_reference / expert_down_reference below (dequant_expert_rows and dequant_nvfp4, then
the plain fp32 math in the same summation order).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ..quant.formats import dequant_nvfp4
from ..quant.nvfp4_rows import dequant_expert_rows, nvfp4_expert_row_bytes
from .nvfp4_grouped import _e4m3_x2p14
from .nvfp4_triton import _e2m1_exact, _e4m3_exact, _store_exact, exact_out


@triton.jit
def _e2m1_pair(words, C: tl.constexpr, EXACT: tl.constexpr):
    """Codes C and C+4 of each int32 word (elements 8w+C and 8w+C+4) as fp32 values * 2^-14."""
    if EXACT:
        lo = _e2m1_exact((words >> (4 * C)) & 15) * 0.00006103515625
        hi = _e2m1_exact((words >> (4 * C + 16)) & 15) * 0.00006103515625
        return lo, hi
    # Sign bits 4C+3 and 4C+19 -> 15 and 31; magnitude bits -> 9..11 and 25..27. -2147450880 is 0x80008000.
    if C < 3:
        h2 = ((words << (12 - 4 * C)) & -2147450880) | ((words << (9 - 4 * C)) & 0x0E000E00)
    else:
        h2 = (words & -2147450880) | ((words >> 3) & 0x0E000E00)
    lo = h2.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
    hi = (h2 >> 16).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
    return lo, hi


@triton.jit
def _rows_dot(w_ptr, s_ptr, rows, mask_r, K, v_ptr,
              BLOCK_G: tl.constexpr, MASKED: tl.constexpr, EXACT: tl.constexpr):
    """dequant(W[rows, :]) @ v without the global scale, fp32 [len(rows)], for an NVFP4 matrix [*, K] whose
    packed bytes start at w_ptr (int32 words: K/8 a row) and E4M3 scale bytes at s_ptr (K/16 a row); v: K
    activations. BLOCK_G 16-code groups per step (one step when it covers K)."""
    acc = tl.zeros(rows.shape, dtype=tl.float32)
    t = tl.arange(0, 2)
    for g0 in range(0, K // 16, BLOCK_G):
        g = g0 + tl.arange(0, BLOCK_G)
        word = 2 * g[:, None] + t[None, :]  # [G, 2]: word of the row; its code c is element 8 * word + c
        w_ptrs = w_ptr + rows[:, None, None] * (K // 8) + word[None, :, :]
        s_ptrs = s_ptr + rows[:, None] * (K // 16) + g[None, :]
        if MASKED:
            mask_g = g < K // 16
            words = tl.load(w_ptrs, mask=mask_r[:, None, None] & mask_g[None, :, None], other=0)
            sc_bits = tl.load(s_ptrs, mask=mask_r[:, None] & mask_g[None, :], other=0)
        else:
            words = tl.load(w_ptrs)
            sc_bits = tl.load(s_ptrs)
        part = tl.zeros(words.shape, dtype=tl.float32)
        for c in tl.static_range(4):
            lo, hi = _e2m1_pair(words, c, EXACT)
            if MASKED:
                v_lo = tl.load(v_ptr + 8 * word + c, mask=mask_g[:, None], other=0.0).to(tl.float32)
                v_hi = tl.load(v_ptr + 8 * word + (c + 4), mask=mask_g[:, None], other=0.0).to(tl.float32)
            else:
                v_lo = tl.load(v_ptr + 8 * word + c).to(tl.float32)
                v_hi = tl.load(v_ptr + 8 * word + (c + 4)).to(tl.float32)
            part += lo * v_lo[None, :, :] + hi * v_hi[None, :, :]
        if EXACT:
            sc = _e4m3_exact(sc_bits.to(tl.int32)) * 16384.0
        else:
            sc = _e4m3_x2p14(sc_bits.to(tl.int32))  # scale * 2^14: cancels the codes' 2^-14 exactly
        acc += tl.sum(tl.sum(part, axis=2) * sc, axis=1)
    return acc


@triton.jit(do_not_specialize=["row_words"])
def expert_gate_up_kernel(x_ptr, ids_ptr, words_ptr, bytes_ptr, act_ptr, H, I, row_words, gu_scale_at, glob_at,
                          xg_w, xg_s, xg_g, xu_w, xu_s, xu_g,
                          K_ROUTED: tl.constexpr, HAS_EXTRA: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_G: tl.constexpr, MASKED: tl.constexpr, EXACT: tl.constexpr):
    j = tl.program_id(0)  # expert: 0..k-1 routed, k the extra (shared) one
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = n < I
    rows = n.to(tl.int64)
    e = tl.load(ids_ptr + tl.minimum(j, K_ROUTED - 1)).to(tl.int64)
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
    gate = _rows_dot(gate_w, gate_s, rows, mask_n, H, x_ptr, BLOCK_G, MASKED, EXACT) * g_gate
    up = _rows_dot(up_w, up_s, rows, mask_n, H, x_ptr, BLOCK_G, MASKED, EXACT) * g_up
    tl.store(act_ptr + j * I + n, gate / (1.0 + tl.exp(-gate)) * up, mask=mask_n)


@triton.jit(do_not_specialize=["row_words"])
def expert_down_kernel(act_ptr, wts_ptr, ids_ptr, words_ptr, bytes_ptr, out_ptr, H, I, row_words,
                       dn_at, dn_scale_at, glob_at, xd_w, xd_s, xd_g, extra_scale_ptr, addend_ptr,
                       K_ROUTED: tl.constexpr, HAS_EXTRA: tl.constexpr, HAS_EXTRA_SCALE: tl.constexpr,
                       HAS_ADDEND: tl.constexpr, OUT_BF16: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_G: tl.constexpr, MASKED: tl.constexpr, EXACT: tl.constexpr):
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = m < H
    rows = m.to(tl.int64)
    acc = tl.zeros([BLOCK_M], dtype=tl.float32)
    for j in tl.static_range(K_ROUTED):  # unrolled: all k experts' loads can be in flight together
        e = tl.load(ids_ptr + j).to(tl.int64)
        base = words_ptr + e * row_words
        y = _rows_dot(base + dn_at, bytes_ptr + e * row_words * 4 + dn_scale_at, rows, mask_m, I, act_ptr + j * I,
                      BLOCK_G, MASKED, EXACT)
        g_down = tl.load(base + glob_at + 2).to(tl.float32, bitcast=True)
        acc += tl.load(wts_ptr + j).to(tl.float32) * (y * g_down)
    if HAS_EXTRA:
        y = _rows_dot(xd_w, xd_s, rows, mask_m, I, act_ptr + K_ROUTED * I, BLOCK_G, MASKED, EXACT) * tl.load(xd_g)
        if HAS_EXTRA_SCALE:
            y = tl.load(extra_scale_ptr).to(tl.float32) * y
        acc += y
    if HAS_ADDEND:
        acc += tl.load(addend_ptr + m, mask=mask_m, other=0.0).to(tl.float32)
    _store_exact(out_ptr + m, acc, mask_m, OUT_BF16)


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


def _block_g(k_in: int, block_g: int | None) -> int:
    groups = triton.next_power_of_2(k_in // 16)
    return groups if block_g is None else min(block_g, groups)


def expert_gate_up(x: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor, hidden: int, inter: int,
                   extra: tuple | None = None, out: torch.Tensor | None = None, *, block_n: int = 4,
                   block_g: int | None = None, num_warps: int = 4, exact_decode: bool = False) -> torch.Tensor:
    """act fp32 [n, I] (n = k, + 1 with extra): act[j] = SiLU(gate_j x) * (up_j x) for the row rows[ids[0, j]]
    and, with extra = (gate_packed, gate_scale, gate_scale2, up_packed, up_scale, up_scale2) (QuantLinear NVFP4
    tensors [I, H/2], [I, H/16] e4m3, fp32 []), act[k] for that expert. x [1, H] (or [H]) bf16/fp16/fp32,
    ids [1, k] int on the device, rows uint8 [E or S, >= row bytes]. One launch, grid (n, I / block_n).
    block_g: 16-code groups per K step (None: the whole row at once)."""
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
        BLOCK_G=bg, MASKED=masked, EXACT=exact_decode, num_warps=num_warps)
    return out


def expert_down(act: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor, hidden: int,
                inter: int, extra: tuple | None = None, extra_scale: torch.Tensor | None = None,
                addend: torch.Tensor | None = None, out_dtype: torch.dtype | None = None,
                out: torch.Tensor | None = None, *, block_m: int = 8, block_g: int | None = None,
                num_warps: int = 4, exact_decode: bool = False) -> torch.Tensor:
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
        MASKED=masked, EXACT=exact_decode, num_warps=num_warps)
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
