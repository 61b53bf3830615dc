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
int32 words, 8 E2M1 codes each (contiguous along the row: 128 B a warp per load; the checkpoint's rows are
1,769,484 B apart, 4-byte aligned), decoded in registers (nvfp4_expert_rows.py says how). Over the engine's
16-byte row stride, neither 16-byte loads of the same gate/up tile nor int64 words a scale group with ~40 %
fewer instructions a code was faster on the H200 (1.23x and 1.64x the time: docs/RESULTS.md session 14).
Gate and up share one pass over x; the activations a word needs, v[8w .. 8w+7], come as eight stride-8 loads or
(x_split) two contiguous ones split in registers. sm_90 SASS (compiled here with Triton's ptxas, no GPU) is
~9 instructions per code for gate_up at block_n 2, ~4.4 of them the decode and FMAs; persistent programs
(PERSISTENT, programs=) load x once per program instead of once per tile (~7.8 a code in the loop at block_n
2, 6.5 at 4). Tried, and removed after their A/B (docs/RESULTS.md session 18): gate/up in K steps whose loads
Triton's pipeliner streamed through shared memory, 4 rows and one warp a program (1.038x the step); gate/up at
one warp a program, one K step (0.995x and 0.998x: neutral); persistent gate/up programs that load a tile ahead
(nvfp4_gate_up_stream, 1.003x: neutral).

References: expert_gate_up_reference / expert_down_reference below (dequant_expert_rows and dequant_nvfp4, then
the plain fp32 math in the same summation order).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .launch import gdc_prologue, pdl_launch, resident_programs
from ..quant.formats import dequant_nvfp4
from ..quant.nvfp4_rows import dequant_expert_rows, nvfp4_expert_row_bytes
from .nvfp4_expert_rows import extra_down, gate_up_pointers, routed_down, rows_part, rows_step, x_tiles
from .nvfp4_triton import _store_exact, exact_out


@triton.jit
def _gate_up_rows(x_ptr, xs, w, mask_w, ids_ptr, words_ptr, bytes_ptr, act_ptr, H, I, row_words, gu_scale_at,
                  glob_at, xg_w, xg_s, xg_g, xu_w, xu_s, xu_g, j, n, K_ROUTED: tl.constexpr, HAS_EXTRA: tl.constexpr,
                  BLOCK_G: tl.constexpr, MASKED: tl.constexpr, DECODE: tl.constexpr, X_SPLIT: tl.constexpr,
                  GROUP_SCALES: tl.constexpr, ONE_STEP: tl.constexpr):
    """act[j, n] for expert j (0..k-1 routed, k the extra one) and rows n. ONE_STEP: the whole row in one K
    step, its activations xs (x_tiles of words w) already loaded; else rows_part's K loop."""
    mask_n = n < I
    gate_w, up_w, gate_s, up_s, g_gate, g_up = gate_up_pointers(
        ids_ptr, words_ptr, bytes_ptr, H, I, row_words, gu_scale_at, glob_at, xg_w, xg_s, xg_g, xu_w, xu_s, xu_g, j,
        K_ROUTED, HAS_EXTRA)
    # int64 rows here, int32 in the down kernel: fewer SASS instructions for each at the real shape (sm_90).
    rows = n.to(tl.int64)
    if ONE_STEP:
        gate, up = rows_step(gate_w, gate_s, up_w, up_s, rows, mask_n, H, xs, w, mask_w, True, BLOCK_G, MASKED,
                              DECODE, GROUP_SCALES)
    else:
        gate, up = rows_part(gate_w, gate_s, up_w, up_s, rows, mask_n, H, x_ptr, True, BLOCK_G, MASKED, DECODE,
                              X_SPLIT, GROUP_SCALES)
    gate = tl.sum(gate, axis=1) * (g_gate * 16384.0)  # 2^14: the codes' scaling, exact
    up = tl.sum(up, axis=1) * (g_up * 16384.0)
    tl.store(act_ptr + j * I + n, gate / (1.0 + tl.exp(-gate)) * up, mask=mask_n)


@triton.jit(do_not_specialize=["words_ptr", "bytes_ptr", "row_words"])
def expert_gate_up_kernel(x_ptr, ids_ptr, words_ptr, bytes_ptr, act_ptr, H, I, row_words, gu_scale_at, glob_at,
                          xg_w, xg_s, xg_g, xu_w, xu_s, xu_g, tiles,
                          K_ROUTED: tl.constexpr, HAS_EXTRA: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_G: tl.constexpr, MASKED: tl.constexpr, DECODE: tl.constexpr,
                          X_SPLIT: tl.constexpr, GROUP_SCALES: tl.constexpr, USE_GDC: tl.constexpr = False,
                          PERSISTENT: tl.constexpr = False):
    """One program a (expert, row block): grid (k (+1), I / BLOCK_N). PERSISTENT (the whole row in one K step):
    a 1-D grid of programs taking the `tiles` (expert, row block) pairs pid, pid + grid, ... in turn, expert
    major, with x's activations loaded once per program instead of once per tile: the same bytes."""
    gdc_prologue(USE_GDC)  # PDL: nothing is read before the previous kernel ends
    if PERSISTENT:
        w = tl.arange(0, 2 * BLOCK_G)
        mask_w = w < H // 8
        xs = x_tiles(x_ptr, w, mask_w, 2 * BLOCK_G, MASKED, X_SPLIT)
        blocks = tl.cdiv(I, BLOCK_N)
        for t in range(tl.program_id(0), tiles, tl.num_programs(0)):
            j = t // blocks
            n = (t - j * blocks) * BLOCK_N + tl.arange(0, BLOCK_N)
            _gate_up_rows(x_ptr, xs, w, mask_w, ids_ptr, words_ptr, bytes_ptr, act_ptr, H, I, row_words,
                          gu_scale_at, glob_at, xg_w, xg_s, xg_g, xu_w, xu_s, xu_g, j, n, K_ROUTED, HAS_EXTRA,
                          BLOCK_G, MASKED, DECODE, X_SPLIT, GROUP_SCALES, True)
    else:
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        _gate_up_rows(x_ptr, x_ptr, x_ptr, x_ptr, ids_ptr, words_ptr, bytes_ptr, act_ptr, H, I, row_words,
                      gu_scale_at, glob_at, xg_w, xg_s, xg_g, xu_w, xu_s, xu_g, tl.program_id(0), n, K_ROUTED,
                      HAS_EXTRA, BLOCK_G, MASKED, DECODE, X_SPLIT, GROUP_SCALES, False)


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
        y, y_scale = routed_down(act_ptr, wts_ptr, ids_ptr, words_ptr, bytes_ptr, j, m, mask_m, I, row_words, dn_at,
                                  dn_scale_at, glob_at, BLOCK_G, MASKED, DECODE, X_SPLIT, GROUP_SCALES)
        acc += y * y_scale
    if HAS_EXTRA:
        y, y_scale = extra_down(act_ptr, xd_w, xd_s, xd_g, extra_scale_ptr, m, mask_m, I, K_ROUTED,
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
# Persistent expert programs (one wave, x loaded once per program): off; the A/B on the H200 (profile_decode arm
# "fused-pdl/experts", session 9) was 1.07x the step: fewer instructions, but one wave of programs over 8
# experts' rows streams worse than a program a tile. The same bytes (tests/test_kernels_nvfp4_experts_decode.py).
PERSISTENT = False
REGS_PER_THREAD = 128  # the budget one wave is sized for (the kernels' sm_90 code uses 54-64)


def persistent_programs(device: torch.device, num_warps: int) -> int:
    """One wave of programs of num_warps warps on this device (the interpreter: 3 programs)."""
    return resident_programs(device, 32 * num_warps, REGS_PER_THREAD)


def requested_programs(programs: int | None, device: torch.device, num_warps: int, one_step: bool) -> int | None:
    """The persistent programs a launch asked for (programs=, else one wave where the PERSISTENT switch is on);
    None: one program a tile. Persistent programs need the whole row in one K step."""
    if programs is None and PERSISTENT and one_step:
        programs = persistent_programs(device, num_warps)
    if programs is not None and not one_step:
        raise ValueError("persistent expert programs need the whole row in one K step (block_g None)")
    return programs


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
                   extra: tuple | None = None, out: torch.Tensor | None = None, *, block_n: int | None = None,
                   block_g: int | None = None, num_warps: int = 4, decode: str | None = None,
                   x_split: bool = True, group_scales: bool = False, programs: int | None = None) -> torch.Tensor:
    """act fp32 [n, I] (n = k, + 1 with extra): act[j] = SiLU(gate_j x) * (up_j x) for the row rows[ids[0, j]]
    and, with extra = (gate_packed, gate_scale, gate_scale2, up_packed, up_scale, up_scale2) (QuantLinear NVFP4
    tensors [I, H/2], [I, H/16] e4m3, fp32 []), act[k] for that expert. x [1, H] (or [H]) bf16/fp16/fp32,
    ids [1, k] int on the device, rows uint8 [E or S, >= row bytes]. One launch, grid (n, I / block_n).
    block_g: 16-code groups per K step (None: the whole row at once). block_n (None: 2 on a GPU, the H200
    sweep's best: 9.35 us vs 10.47 at 8 for the real geometry, scripts/bench_nvfp4_experts_decode.py).
    programs: at most this many persistent programs taking the (expert, row block) tiles in turn, x loaded once
    each (the whole row in one K step only; None: the module switch PERSISTENT, one wave of them, else one
    program a tile)."""
    words = _check(rows, hidden, inter)
    k = ids.shape[-1]
    n = k + (extra is not None)
    if block_n is None:  # 2 on a GPU; in Triton's interpreter (tests) whole experts, its time going by programs
        block_n = 2 if rows.is_cuda else min(64, triton.next_power_of_2(inter))
    if out is None:
        out = torch.empty(n, inter, device=x.device, dtype=torch.float32)
    gate = up = (words, rows, out)  # unused stand-ins of the right pointer types
    if extra is not None:
        gate, up = _matrix(*extra[:3]), _matrix(*extra[3:])
    bg = _block_g(hidden, block_g)
    masked = inter % block_n != 0 or (hidden // 16) % bg != 0
    off = _row_offsets(hidden, inter)
    tiles = n * triton.cdiv(inter, block_n)
    programs = requested_programs(programs, x.device, num_warps, bg * 16 >= hidden)
    persistent = programs is not None and 0 < programs < tiles
    expert_gate_up_kernel[(programs,) if persistent else (n, triton.cdiv(inter, block_n))](
        x.reshape(-1).contiguous(), ids.reshape(-1).contiguous(), words, rows, out, hidden, inter, words.stride(0),
        off["gu_scale_at"], off["glob_at"], *gate, *up, tiles, K_ROUTED=k, HAS_EXTRA=extra is not None,
        BLOCK_N=block_n, BLOCK_G=bg, MASKED=masked, DECODE=_decode(decode, rows), X_SPLIT=x_split,
        GROUP_SCALES=group_scales, PERSISTENT=persistent, num_warps=num_warps, **pdl_launch(x.device))
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
