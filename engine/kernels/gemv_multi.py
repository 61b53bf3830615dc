"""Batch-1 GEMV over up to 4 weight matrices of one input in ONE launch, for the checkpoint's three formats.

Fuses what the decode step does as separate launches (q/k/v; in_proj_qkv/z; router + shared gate; ...): one
fp32 GEMV per weight (kernels/fp8_triton.fp8_gemv, nvfp4_triton.nvfp4_gemv, F.linear) and a `.to(dtype)` cast
each. Here one kernel reads the weights where they are (no concatenation at load) and writes y = concat(W_i @ x),
accumulated in fp32 and stored once in the output dtype. Reference: `gemv_multi_reference` (dequantize each part
with quant.formats, F.linear in fp32, cat).

Formats: "dense" (bf16/fp16/fp32 [N, K]); "fp8" (E4M3 [N, K], fp32 per-tensor scale), read as int32 words of 4
codes; "nvfp4" (packed [N, K/2], E4M3 block scales [N, K/16], fp32 global scale), read as one int64 word per
16-code scale group, so each block scale is loaded once per 16 codes. Codes are decoded by moving their bits into
fp16 bit patterns, two codes (the two halves of an int32) per shift-and-mask: E4M3 -> fp16 is exact with a 2^-8
factor, E2M1 -> fp16 with 2^-14, subnormals included, and the fp16 -> fp32 conversion is one full-rate op; the
power-of-two factors are undone once per row with the scale. The house helpers `_e4m3` / `_e2m1` spend an exp2
(a special-function unit op, 16/clk/SM) per code, which alone would cap an H200 below its HBM rate (4.8e12 FP8
or 9.6e12 NVFP4 codes/s); `_e4m3_exact` costs ~15 integer ops per block scale. The tile is [BLOCK_N, chunks,
CHUNK] so that the compiler puts a row's chunks in one thread and the warps across rows (a row is reduced
within a warp, x stays in registers for all the thread's rows); the dense path is the same without decoding.

Deterministic: each row is reduced by one program in a fixed order set by the launch config (a pure function of
format, total rows and K: `choose_config`), no atomics, no split-K, no host syncs (graph-capturable). Two A/B
switches: PERSISTENT (one wave of programs taking the tiles in turn, a row's sum unchanged; off: slower on the
H200) and FP8_CVT (FP8 codes through the hardware conversion: exact codes, the sums in another order; on).
(Tried: the weights streamed through shared memory in pipelined K steps, gemv_stream; removed after its A/B,
docs/RESULTS.md session 18: 1.042x the step.)
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .decode_norm import round_code
from .gemv_codes import dense_block, fp8_block, nvfp4_block, prefetch_rows, tiles_rstd
from .fp8_mma import fp8_mma_rows
from .fp8_scaled_mm import fp8_tensor_cores
from .launch import gdc_prologue, pdl_launch, resident_programs
from ..quant.formats import dequant_fp8, dequant_nvfp4
from .nvfp4_triton import _store_exact, exact_out

DENSE, FP8, NVFP4 = "dense", "fp8", "nvfp4"
_FMT_ID = {DENSE: 0, FP8: 1, NVFP4: 2}
MAX_PARTS = 4


@triton.jit
def _tile_part(t, w0, w1, w2, w3, s0, s1, s2, s3, g0, g1, g2, g3, n0, n1, n2, n3, p1, p2, p3,
               PARTS: tl.constexpr):
    """Tile t's part: (weight, scales, global scale, the part's rows, the tile's index in the part, the part's
    first output row). Part i owns the tiles p_i .. p_{i+1} - 1 (p_0 = 0)."""
    w, s, g, n, local, row0 = w0, s0, g0, n0, t, 0
    if PARTS > 1:
        take = t >= p1
        w, s, g, n = tl.where(take, w1, w), tl.where(take, s1, s), tl.where(take, g1, g), tl.where(take, n1, n)
        local, row0 = tl.where(take, t - p1, local), tl.where(take, n0, row0)
    if PARTS > 2:
        take = t >= p2
        w, s, g, n = tl.where(take, w2, w), tl.where(take, s2, s), tl.where(take, g2, g), tl.where(take, n2, n)
        local, row0 = tl.where(take, t - p2, local), tl.where(take, n0 + n1, row0)
    if PARTS > 3:
        take = t >= p3
        w, s, g, n = tl.where(take, w3, w), tl.where(take, s3, s), tl.where(take, g3, g), tl.where(take, n3, n)
        local, row0 = tl.where(take, t - p3, local), tl.where(take, n0 + n1 + n2, row0)
    return w, s, g, n, local, row0


@triton.jit
def _tile_rows(t, w0, w1, w2, w3, s0, s1, s2, s3, g0, g1, g2, g3, n0, n1, n2, n3, p1, p2, p3,
               PARTS: tl.constexpr, BLOCK_N: tl.constexpr):
    w, s, g, n, local, row0 = _tile_part(t, w0, w1, w2, w3, s0, s1, s2, s3, g0, g1, g2, g3, n0, n1, n2, n3,
                                         p1, p2, p3, PARTS)
    rows = local * BLOCK_N + tl.arange(0, BLOCK_N)
    return w, s, g, rows.to(tl.int64), rows < n, row0 + rows


@triton.jit
def _prefetch_tile(t, tiles, w0, w1, w2, w3, s0, s1, s2, s3, g0, g1, g2, g3, n0, n1, n2, n3, p1, p2, p3,
                   K: tl.constexpr, FMT: tl.constexpr, PARTS: tl.constexpr, BLOCK_N: tl.constexpr):
    """Tile t's weight rows asked of L2 (a later turn's, in a persistent program); nothing past the last tile."""
    if t < tiles:
        w, s, g, rows64, mask_n, _ = _tile_rows(t, w0, w1, w2, w3, s0, s1, s2, s3, g0, g1, g2, g3, n0, n1, n2, n3,
                                                p1, p2, p3, PARTS, BLOCK_N)
        prefetch_rows(w, s, rows64, mask_n, K, FMT, True)


@triton.jit
def _tile_product(x_ptr, out_ptr, w, s, g, rows64, mask_n, out_rows, K: tl.constexpr, FMT: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, CHUNK: tl.constexpr, OUT_BF16: tl.constexpr,
                  FP8_CVT: tl.constexpr, nw_ptr=None, rstd=None, NORM: tl.constexpr = False,
                  ROUND: tl.constexpr = 0, MMA: tl.constexpr = False):
    """One tile: BLOCK_N rows of one part times x, stored at out_rows. FP8_CVT: the FP8 codes as float8e4nv
    elements, converted by the hardware (sm_89+: two codes an instruction, exact) in the dense path's tile.
    MMA (FP8, the codes as float8e4nv elements): the tile on the tensor cores, fp8_mma.fp8_mma_rows."""
    EVEN_K: tl.constexpr = K % BLOCK_K == 0
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    if FMT == 1 and MMA:
        acc = fp8_mma_rows(x_ptr, w, rows64, mask_n, K, BLOCK_N, BLOCK_K, nw_ptr, rstd, NORM, ROUND, MMA == 2)
    else:
        for k0 in tl.static_range(0, K, BLOCK_K):  # one block where K <= BLOCK_K; unrolled otherwise (few blocks)
            if FMT == 0 or (FMT == 1 and FP8_CVT):
                acc += dense_block(x_ptr, w, rows64, mask_n, k0, K, BLOCK_K, EVEN_K, CHUNK, nw_ptr, rstd, NORM,
                                   ROUND)
            elif FMT == 1:
                acc += fp8_block(x_ptr, w, rows64, mask_n, k0, K, BLOCK_K, EVEN_K, CHUNK, nw_ptr, rstd, NORM,
                                 ROUND)
            else:
                acc += nvfp4_block(x_ptr, w, s, rows64, mask_n, k0, K, BLOCK_K, EVEN_K, CHUNK, nw_ptr, rstd, NORM,
                                   ROUND)
    if FMT == 1 and (FP8_CVT or MMA):
        acc = acc * tl.load(s).to(tl.float32)
    elif FMT == 1:
        acc = acc * (tl.load(s).to(tl.float32) * 256.0)  # undo the decode's 2^-8
    elif FMT == 2:
        acc = acc * (tl.load(g).to(tl.float32) * 4194304.0)  # undo the decodes' 2^-14 and 2^-8
    _store_exact(out_ptr + out_rows, acc, mask_n, OUT_BF16)


@triton.jit
def gemv_multi_kernel(x_ptr, out_ptr, w0, w1, w2, w3, s0, s1, s2, s3, g0, g1, g2, g3, n0, n1, n2, n3, p1, p2, p3,
                      tiles, K: tl.constexpr, FMT: tl.constexpr, PARTS: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, CHUNK: tl.constexpr, OUT_BF16: tl.constexpr,
                      USE_GDC: tl.constexpr = False, PREFETCH: tl.constexpr = False,
                      PERSISTENT: tl.constexpr = False, L2_AHEAD: tl.constexpr = 0, FP8_CVT: tl.constexpr = False,
                      sums_ptr=None, nw_ptr=None, sum_tiles=0, eps=0.0, NORM: tl.constexpr = False,
                      ROUND: tl.constexpr = 0, BLOCK_T: tl.constexpr = 1, MMA: tl.constexpr = False):
    """Tile t (BLOCK_N rows of one part, `_tile_part`) of `tiles`. One program a tile, or PERSISTENT: the grid's
    programs take the tiles pid, pid + grid, ... in turn, and ask L2 for the rows of the tile L2_AHEAD turns
    ahead before each tile's loads, so that an SM's loads stream while it decodes and sums (the programs of one
    SM otherwise start together and load, then compute, together). Parts beyond PARTS are never read (the
    wrapper passes part 0 there). A row's sum is the same either way (one tile, one order). NORM: x is a
    residual, RMS-normed as it is loaded (gemv_codes.x_values) with the rstd of its tiles' sums of squares."""
    pid = tl.program_id(0)
    if PERSISTENT:
        grid = tl.num_programs(0)
        if L2_AHEAD > 0:  # the first turns' rows, before the wait (with PDL: while the previous kernel runs)
            for a in tl.static_range(L2_AHEAD):
                _prefetch_tile(pid + a * grid, tiles, w0, w1, w2, w3, s0, s1, s2, s3, g0, g1, g2, g3, n0, n1, n2,
                               n3, p1, p2, p3, K, FMT, PARTS, BLOCK_N)
        gdc_prologue(USE_GDC)  # PDL: x (the previous kernel's output) is read only after this
        rstd = tiles_rstd(sums_ptr, sum_tiles, K, eps, BLOCK_T) if NORM else 0.0
        for t in range(pid, tiles, grid):
            if L2_AHEAD > 0:
                _prefetch_tile(t + L2_AHEAD * grid, tiles, w0, w1, w2, w3, s0, s1, s2, s3, g0, g1, g2, g3, n0, n1,
                               n2, n3, p1, p2, p3, K, FMT, PARTS, BLOCK_N)
            w, s, g, rows64, mask_n, out_rows = _tile_rows(t, w0, w1, w2, w3, s0, s1, s2, s3, g0, g1, g2, g3,
                                                           n0, n1, n2, n3, p1, p2, p3, PARTS, BLOCK_N)
            _tile_product(x_ptr, out_ptr, w, s, g, rows64, mask_n, out_rows, K, FMT, BLOCK_N, BLOCK_K, CHUNK,
                          OUT_BF16, FP8_CVT, nw_ptr, rstd, NORM, ROUND, MMA)
    else:
        w, s, g, rows64, mask_n, out_rows = _tile_rows(pid, w0, w1, w2, w3, s0, s1, s2, s3, g0, g1, g2, g3,
                                                       n0, n1, n2, n3, p1, p2, p3, PARTS, BLOCK_N)
        # The weights are never written during decode: their lines are asked of L2 before the wait, so that
        # with programmatic launch they stream in while the previous kernel (often a one-program norm) runs.
        prefetch_rows(w, s, rows64, mask_n, K, FMT, USE_GDC and PREFETCH)
        gdc_prologue(USE_GDC)  # PDL: x (the previous kernel's output) is read only after this
        rstd = tiles_rstd(sums_ptr, sum_tiles, K, eps, BLOCK_T) if NORM else 0.0
        _tile_product(x_ptr, out_ptr, w, s, g, rows64, mask_n, out_rows, K, FMT, BLOCK_N, BLOCK_K, CHUNK,
                      OUT_BF16, FP8_CVT, nw_ptr, rstd, NORM, ROUND, MMA)


@dataclasses.dataclass(frozen=True)
class GemvConfig:
    block_n: int  # rows per program (a power of 2)
    block_k: int  # K elements per block (a power of 2, >= 16); the whole row where K <= 4096
    num_warps: int
    warps_k: int = 1  # warps across a row (1: each row is reduced within one warp, no shared memory)
    num_stages: int = 1  # the K blocks are unrolled (K is a compile-time constant): nothing to pipeline
    programs: int = 0  # 0: one program a tile; n: at most n persistent programs, each taking tiles in turn
    l2_ahead: int = 0  # persistent: ask L2 for the tile this many turns ahead (0: no prefetch; CUDA only)
    mma: int = 0  # FP8 on the tensor cores (fp8_mma.py): 64 rows a program, a pipelined K loop; 2: x's split
    # scaled a K step (fp8_mma_rows' STEP_SCALE)


# The L2 prefetch of the weights ahead of the programmatic-launch wait (PDL only): off; in its A/B on the H200
# (profile_decode arm "fused-pdl/prefetch", session 9) the step was no faster (median round ratio 1.008). Not an
# engine option: no byte moves. gemv_mixed (the GDN in_proj) takes it too since session 23, for the tensor-core
# tile, whose scale pass comes before its first weight load (docs/RESULTS.md session 23).
WEIGHT_PREFETCH = False
# (Tried: the first K block's weights loaded into registers before the wait, gemv_mixed too; removed after its
# A/B, docs/RESULTS.md session 19: 1.016x the step, slower in 7 of 7 rounds, in_proj 11.2 -> 12.6 us; e0f55d5.)
# Persistent programs (one wave: the SMs times the programs one SM holds) with the rows L2_AHEAD turns ahead
# asked of L2: off; the A/B on the H200 (profile_decode arm "fused-pdl/persistent", session 9) was 1.03x the
# step. The same bytes as one program a tile (tests/test_kernels_gemv_multi.py).
PERSISTENT = False
L2_AHEAD = 2
# FP8 codes converted by the hardware (cvt.rn.f16x2.e4m3x2, sm_89+) in the dense path's tile: ~2.5 SASS
# instructions a code against ~4.4 for the bit placement (scripts/sass_gemv_multi.py); exact either way, the
# sums in another order. On: the resident 16K step 2.668 -> 2.455 ms, median of 5 interleaved rounds, every
# round faster (docs/RESULTS.md, session 9 call 1). GPUs before sm_89 keep the bit path.
FP8_CVT = True
# FP8 tiles on the tensor cores (fp8_mma.py: the codes into wgmma untouched, x split into three E4M3 terms): the
# GDN in_proj tile with x normed as loaded is 2.4 SASS instructions a code against 5.8 for the FP8_CVT tile
# (Triton 3.6.0, sm_90, scripts/sass_gemv_multi.py --fp8-mma --norm --pdl). For the launches of at least
# MMA_MIN_TILES tiles of 64 rows (GDN in_proj 192 + b/a, attention q+k+v 144; not out_proj / o_proj's 32: too few
# programs to stream 8 MB), on Hopper (fp8_mma_capable) and in Triton's interpreter. Off until its GPU A/B
# (profile_decode arm "fp8mma"); y within a few 2^-14 of sum |w x| of the fp32 W x (fp8_mma.py), not FP8_CVT's
# bytes.
FP8_MMA = False
MMA_BLOCK_N = 64  # wgmma's M: one warpgroup of 4 warps
# A K step (its wgmmas of K 32 added into fp32 after it) and the pipeline's depth: 256 x 4 keeps 3 steps of 16 KB
# in flight a program (~1.5 programs an SM at in_proj's 192 tiles: ~70 KB an SM, ~9 MB over the H200, twice its
# bandwidth-latency product), 80 KB of shared memory; profile_decode's "mmabk=N" / "mmastages=N" vary them.
MMA_BLOCK_K = 256
MMA_STAGES = 4
MMA_MIN_TILES = 128  # profile_decode's "mmamin=32" takes out_proj / o_proj too (with deeper stages, "mmastages=8")
# x's split scaled a K step (fp8_mma_rows' STEP_SCALE) instead of once from a pass over all of x before the K loop:
# in session 24's A/B (H100) fp8mma lost 2.8 % of the step, and that pass delays each program's first weight
# loads by an L2 round trip and a block max (docs/RESULTS.md session 24). Off; profile_decode's arm "mmastep".
MMA_STEP_SCALE = False
REGS_PER_THREAD = 128  # what the configs' sm_90 code uses at most (scripts/sass_gemv_multi.py): 2 x 8 warps an SM
# (Tried: the cap above as ptxas' register limit, maxnreg; removed, not run, docs/RESULTS.md session 18: its
# premise was Triton 3.9's 182-register tiles, the H200's 3.6.0 makes them 80 and the cap 99.)
TARGET_PROGRAMS = 512  # ~4 per SM of an H200, so the last wave is a small part of the launch
MAX_TILE_BYTES = 32 * 1024  # weight bytes per program and K block: <= 128 B (8 x 16 B loads) a thread at 8 warps
BYTES_PER_THREAD = 128
MAX_BLOCK_K = 4096
X_PER_THREAD = 64  # x values a thread keeps in registers (its columns of the K block); more warps across a row past it
# FP8: 32 (two warps across a 2048 row). The H200 sweep (scripts/bench_gemv_multi.py, docs/RESULTS.md session 6):
# in_proj_qkv+z 11.8 -> 10.9 us, attention q+k+v 10.5 -> 9.1 us with warps_k 2.
X_PER_THREAD_FP8 = 32
MAX_WARPS_K = 2
CODES_PER_WORD = {FP8: 4, NVFP4: 16}  # an int32 word of 4 E4M3 codes; an int64 word of 16 E2M1 codes


def row_bytes(fmt: str, k: int, elem_bytes: int = 2) -> int:
    """Weight bytes of one row of K elements (NVFP4 with its block scales)."""
    return {DENSE: k * elem_bytes, FP8: k, NVFP4: k // 2 + k // 16}[fmt]


def choose_config(fmt: str, n_total: int, k: int, elem_bytes: int = 2, fp8_mma: bool = False,
                  step_scale: bool = False) -> GemvConfig:
    """The launch config, a pure function of (format, total rows, K, FP8 on the tensor cores allowed): FP8 with
    fp8_mma and >= MMA_MIN_TILES tiles of MMA_BLOCK_N rows: those tiles, 4 warps, an MMA_STAGES-deep K loop (mma 2
    with step_scale: x's split scaled a K step); else the whole row per program up to K 4096;
    the most rows per program that keeps >= TARGET_PROGRAMS programs (one row each where even that is too
    few: the small latency-bound linears) and a tile of <= MAX_TILE_BYTES; warps for ~BYTES_PER_THREAD each,
    and 2 warps across a row where one would hold more than X_PER_THREAD x values a thread (FP8: 32). A small
    plain linear (fewer rows than TARGET_PROGRAMS: the router, in_proj_b+a) takes 2 rows and 2 warps a program
    (2.6 -> 2.3 and 2.4 -> 2.1 us on the H200: latency-bound, more loads in flight per program)."""
    if fmt not in _FMT_ID:
        raise ValueError(f"no GEMV for format {fmt!r} (known: {', '.join(_FMT_ID)})")
    if fp8_mma and fmt == FP8 and triton.cdiv(n_total, MMA_BLOCK_N) >= MMA_MIN_TILES:
        return GemvConfig(MMA_BLOCK_N, min(MMA_BLOCK_K, max(32, triton.next_power_of_2(k))), 4,
                          num_stages=MMA_STAGES, mma=2 if step_scale else 1)
    block_k = min(max(16, triton.next_power_of_2(k)), MAX_BLOCK_K)
    tile_row = row_bytes(fmt, block_k, elem_bytes)
    block_n = 1
    while (block_n < 32 and triton.cdiv(n_total, 2 * block_n) >= TARGET_PROGRAMS
           and 2 * block_n * tile_row <= MAX_TILE_BYTES):
        block_n *= 2
    if fmt == DENSE and block_n == 1 and n_total >= 2 and triton.cdiv(n_total, 2) < TARGET_PROGRAMS:
        block_n = 2
    warps_k = max(1, min(MAX_WARPS_K, block_k // (32 * (X_PER_THREAD_FP8 if fmt == FP8 else X_PER_THREAD))))
    warps = warps_k
    while warps < min(8, block_n * warps_k) and 2 * warps * 32 * BYTES_PER_THREAD <= block_n * tile_row:
        warps *= 2
    return GemvConfig(block_n, block_k, warps, warps_k)


def persistent_config(cfg: GemvConfig, device: torch.device) -> GemvConfig:
    """cfg with persistent programs: one wave on this device (REGS_PER_THREAD a thread), the rows L2_AHEAD turns
    ahead asked of L2 on CUDA."""
    return dataclasses.replace(cfg, programs=resident_programs(device, 32 * cfg.num_warps, REGS_PER_THREAD),
                               l2_ahead=L2_AHEAD if device.type == "cuda" else 0)


def fp8_mma_capable(device: torch.device) -> bool:
    """FP8 wgmma: Hopper (sm_90; Triton lowers an FP8 dot on older GPUs through fp16, and Blackwell's tensor
    cores, sm_100 / sm_120, are other instructions this tile was not compiled or measured for); Triton's
    interpreter (tests)."""
    return device.type != "cuda" or torch.cuda.get_device_capability(device)[0] == 9


def launch_config(fmt: str, n_total: int, k: int, elem_bytes: int, device: torch.device,
                  persistent: bool = False) -> GemvConfig:
    """choose_config on this device (FP8_MMA where the device has it): Triton's interpreter (its time goes by
    programs) takes wider tiles (tests; a row's sum is the same), and `persistent` makes it one wave of programs."""
    cfg = choose_config(fmt, n_total, k, elem_bytes, FP8_MMA and fp8_mma_capable(device), MMA_STEP_SCALE)
    if device.type != "cuda":
        cfg = dataclasses.replace(cfg, block_n=max(cfg.block_n, min(32, triton.next_power_of_2(n_total))))
    return persistent_config(cfg, device) if persistent else cfg


def chunk_words(fmt: str, cfg: GemvConfig, elem_bytes: int = 2, fp8_cvt: bool = False) -> int:
    """The kernel's CHUNK: the words (int32 / int64 / elements; FP8 codes with fp8_cvt) that warps_k warps load
    across a row in one 16 B load per thread, at most the block's words."""
    word_bytes = 1 if fmt == FP8 and fp8_cvt else {FP8: 4, NVFP4: 8}.get(fmt, elem_bytes)
    words = cfg.block_k // (1 if fmt == FP8 and fp8_cvt else CODES_PER_WORD.get(fmt, 1))
    return min(words, 32 * (16 // word_bytes) * cfg.warps_k)


def _part(p) -> tuple[str, object, int]:
    """(format, plain weight or tensors dict, K) of a plain tensor, a QuantLinear or its `.tensors` dict."""
    t = getattr(p, "tensors", p)
    if isinstance(t, torch.Tensor):
        return DENSE, t, t.shape[1]
    w = t["weight"]
    if "weight_scale_2" in t:
        return NVFP4, t, w.shape[1] * 2
    return FP8, t, w.shape[1]


def part_shape(fmt: str, t) -> tuple[int, int]:
    """(rows, element bytes for choose_config) of a part's tensors (a plain weight or a tensors dict); the
    quantized formats count 2, as their configs are tabled."""
    if fmt == DENSE:
        return t.shape[0], t.element_size()
    return t["weight"].shape[0], 2


def _kernel_args(fmt: str, t, fp8_cvt: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(weight words, scale, global scale) as the kernel reads them; views, no copies for contiguous tensors.
    FP8: int32 words of 4 codes, or (fp8_cvt) the codes as float8_e4m3fn elements."""
    if fmt == DENSE:
        w = t.contiguous()
        return w, w, w  # no scales: part 0's pointers stand in (never read)
    if fmt == FP8:
        s = t["weight_scale"].reshape(1)
        s = s if s.dtype == torch.float32 else s.float()
        codes = t["weight"].contiguous().view(torch.uint8)
        return codes.view(torch.float8_e4m3fn) if fp8_cvt else codes.view(torch.int32), s, s
    g = t["weight_scale_2"].reshape(1)
    g = g if g.dtype == torch.float32 else g.float()
    return t["weight"].contiguous().view(torch.int64), t["weight_scale"].contiguous().view(torch.uint8), g


def _check(x: torch.Tensor, parts) -> tuple[str, list, int]:
    if not 1 <= len(parts) <= MAX_PARTS:
        raise ValueError(f"gemv_multi takes 1 to {MAX_PARTS} weights, got {len(parts)}")
    infos = [_part(p) for p in parts]
    fmts, ks = {i[0] for i in infos}, {i[2] for i in infos}
    if len(fmts) > 1:
        raise ValueError(f"gemv_multi needs one weight format per call, got {sorted(fmts)}")
    fmt = fmts.pop()
    if len(ks) > 1:
        raise ValueError(f"gemv_multi needs the same K for every weight, got {sorted(ks)}")
    k = ks.pop()
    if x.numel() != k:
        raise ValueError(f"x has {x.numel()} elements, the weights take K = {k}")
    if fmt == DENSE and len({i[1].dtype for i in infos}) > 1:
        raise ValueError("gemv_multi needs one dtype for the dense weights of a call")
    if fmt == FP8 and k % 4:
        raise ValueError(f"the FP8 GEMV reads 4 codes per word: K must be a multiple of 4, got {k}")
    if fmt == NVFP4 and k % 16:
        raise ValueError(f"NVFP4 needs K to be a multiple of 16, got {k}")
    return fmt, [i[1] for i in infos], k


def gemv_multi(x: torch.Tensor, parts, out: torch.Tensor | None = None, out_dtype: torch.dtype | None = None, *,
               block_n: int | None = None, block_k: int | None = None, num_warps: int | None = None,
               warps_k: int | None = None, num_stages: int | None = None, programs: int | None = None,
               l2_ahead: int | None = None, fp8_cvt: bool | None = None, norm: tuple | None = None) -> torch.Tensor:
    """x [1, K] or [K] (bf16/fp16/fp32); parts: 1..4 weights of one format sharing K (plain [N_i, K] tensors,
    QuantLinears, or their `.tensors` dicts) -> y [1, sum N_i] = concat(W_i @ x), fp32 accumulation, stored
    once as out_dtype (default x.dtype). out: an optional contiguous [1, sum N_i] (or [sum N_i]) tensor to write.
    One launch; config keywords override choose_config(format, sum N_i, K) one by one; fp8_cvt: FP8 codes through
    the hardware conversion (default: the module switch FP8_CVT). norm = (sums, norm_w, eps): x is a residual
    and the product is with its RMS norm as add_rms_norm stores it, rstd from sums (fp32 [tiles]: the sums of
    squares of x's tiles, parts_norm.py's TILE_SUMS) in this launch's fixed order."""
    fmt, tensors, k = _check(x, parts)
    norm_args = norm_launch(norm, x, k)
    ns = [part_shape(fmt, t)[0] for t in tensors]
    n_total = sum(ns)
    elem = part_shape(fmt, tensors[0])[1]
    overrides = dict(block_n=block_n, block_k=block_k, num_warps=num_warps, warps_k=warps_k, num_stages=num_stages,
                     programs=programs, l2_ahead=l2_ahead)
    cfg = dataclasses.replace(launch_config(fmt, n_total, k, elem, x.device, PERSISTENT),
                              **{name: v for name, v in overrides.items() if v is not None})
    # sm_89+ (else the bit path); the tensor cores take the codes as float8e4nv elements too
    fp8_cvt = ((fp8_cvt if fp8_cvt is not None else FP8_CVT) and fp8_tensor_cores(x.device)) or bool(cfg.mma)
    args = [_kernel_args(fmt, t, fp8_cvt) for t in tensors]
    if cfg.l2_ahead and x.device.type != "cuda":
        raise ValueError("the L2 prefetch (l2_ahead) needs a CUDA device (Triton's interpreter has no PTX)")
    if any(v < 1 or v & (v - 1) for v in (cfg.block_n, cfg.block_k, cfg.warps_k)) or cfg.block_k < 16:
        raise ValueError(f"block_n, block_k and warps_k must be powers of 2, block_k >= 16: {cfg}")
    out_dtype = out_dtype or (out.dtype if out is not None else x.dtype)
    if out is None:
        out = torch.empty(1, n_total, device=x.device, dtype=out_dtype)
    elif out.numel() != n_total or out.dtype != out_dtype or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous {out_dtype} tensor of {n_total} elements")
    tiles = [triton.cdiv(n, cfg.block_n) for n in ns]
    starts = [sum(tiles[:i]) for i in range(1, MAX_PARTS)]
    pad = MAX_PARTS - len(args)
    ws, ss, gs = ([a[j] for a in args] + [args[0][j]] * pad for j in range(3))
    persistent = 0 < cfg.programs < sum(tiles)
    gemv_multi_kernel[(cfg.programs if persistent else sum(tiles),)](
        x.reshape(-1).contiguous(), exact_out(out), *ws, *ss, *gs, *(ns + [0] * pad), *starts, sum(tiles),
        K=k, FMT=_FMT_ID[fmt], PARTS=len(args), BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        CHUNK=chunk_words(fmt, cfg, elem, fp8_cvt), PREFETCH=WEIGHT_PREFETCH, PERSISTENT=persistent,
        FP8_CVT=fp8_cvt and fmt == FP8, MMA=cfg.mma,
        L2_AHEAD=cfg.l2_ahead if persistent else 0,
        OUT_BF16=out_dtype == torch.bfloat16, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **norm_args, **pdl_launch(x.device))
    return out


def norm_launch(norm: tuple | None, x: torch.Tensor, k: int) -> dict:
    """The kernel keywords of a GEMV's norm= (none without one)."""
    if norm is None:
        return {}
    sums, norm_w, eps = norm
    if sums.dtype != torch.float32 or sums.dim() != 1 or norm_w.shape != (k,):
        raise ValueError(f"norm needs fp32 tile sums [tiles] and a weight [{k}]")
    return dict(sums_ptr=sums, nw_ptr=norm_w.contiguous(), sum_tiles=sums.numel(), eps=float(eps), NORM=True,
                ROUND=round_code(x.dtype), BLOCK_T=triton.next_power_of_2(sums.numel()))


def gemv(x: torch.Tensor, weight, out: torch.Tensor | None = None, out_dtype: torch.dtype | None = None,
         **config) -> torch.Tensor:
    """One linear (a plain [N, K] tensor, a QuantLinear or its tensors dict) of x [1, K] / [K] -> [1, N] through
    the same kernel (the lm_head, o_proj / out_proj, the shared expert's down_proj)."""
    return gemv_multi(x, [weight], out, out_dtype, **config)


def dequantize_part(p) -> torch.Tensor:
    """A weight as fp32 [N, K] by quant.formats (the reference's dequantization)."""
    fmt, t, _ = _part(p)
    if fmt == DENSE:
        return t.float()
    if fmt == FP8:
        return dequant_fp8(t["weight"], t["weight_scale"])
    return dequant_nvfp4(t["weight"], t["weight_scale"], t["weight_scale_2"])


def gemv_multi_reference(x: torch.Tensor, parts, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Torch reference: each part dequantized to fp32, F.linear in fp32, concatenated, cast once."""
    xf = x.reshape(1, -1).float()
    y = torch.cat([F.linear(xf, dequantize_part(p)) for p in parts], dim=-1)
    return y.to(out_dtype or x.dtype)
