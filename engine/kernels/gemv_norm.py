"""A decode projection and the residual add + RMSNorm after it in one launch: the mixer's out_proj / o_proj
GEMV, then, in the program that finishes last, add_rms_norm of the residual and the projection's output.

Why: the post-mixer add_rms_norm was a launch of its own, one program: 2.55 us a call on the H200, 40 calls a
step (docs/RESULTS.md, session 9's profile), each waiting for the GEMV's 512 programs to end first. Here every
program computes its tile with gemv_multi's tile code and config (the projection's bytes are gemv's), counts its
arrival (launch.last_to_arrive), and the last one runs add_rms_norm's row code (decode_norm._add_rms_norm_row)
over the rounded projection. Which program is last changes nothing.

Bytes: the projection is gemv's byte for byte. The norm is add_rms_norm's code, but in a launch of the GEMV's
warps: on a GPU, Triton lays a reduction out by the launch's warps, so rstd's fp32 sum may be added in another
order than the 8-warp norm kernel's (an ulp of the bf16 output at most where it does). Triton's interpreter
sums in one order: there the bytes are equal. Reference: gemv then add_rms_norm (and their references).
Off until its GPU A/B (the module switch FUSED, profile_decode arm "gemvnorm").
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import gemv_multi as gm
from .decode_norm import _add_rms_norm_row, round_code
from .fp8_scaled_mm import fp8_tensor_cores
from .launch import gdc_prologue, last_to_arrive, pdl_launch
from .nvfp4_triton import exact_out

FUSED = False


@triton.jit
def gemv_norm_kernel(a_ptr, proj_out_ptr, proj_ptr, w0, s0, g0, n0, tiles, counter_ptr, x_ptr, norm_w_ptr,
                     new_x_ptr, norm_ptr, eps, K: tl.constexpr, FMT: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, CHUNK: tl.constexpr, FP8_CVT: tl.constexpr, ROUND: tl.constexpr,
                     BLOCK_H: tl.constexpr, FENCE: tl.constexpr, USE_GDC: tl.constexpr = False,
                     MMA: tl.constexpr = False):
    """Tile pid of the projection (gemv_multi_kernel's tile, one part), then add_rms_norm's row in the last
    program to arrive. proj_out_ptr: the projection as _store_exact writes it (bf16 as int16 bits); proj_ptr:
    the same bytes in their own dtype, as the norm reads them."""
    pid = tl.program_id(0)
    w, s, g, rows64, mask_n, out_rows = gm._tile_rows(pid, w0, w0, w0, w0, s0, s0, s0, s0, g0, g0, g0, g0,
                                                      n0, 0, 0, 0, tiles, tiles, tiles, 1, BLOCK_N)
    gdc_prologue(USE_GDC)  # PDL: the activation and the residual are read only after this
    gm._tile_product(a_ptr, proj_out_ptr, w, s, g, rows64, mask_n, out_rows, K, FMT, BLOCK_N, BLOCK_K, CHUNK,
                     ROUND == 1, FP8_CVT, MMA=MMA)
    if last_to_arrive(counter_ptr, tiles, FENCE):
        _add_rms_norm_row(x_ptr, proj_ptr, norm_w_ptr, new_x_ptr, norm_ptr, 0, n0, 0, 0, 0, 0, eps, 0, True,
                          ROUND, BLOCK_H, 0)


def gemv_add_rms_norm(a: torch.Tensor, weight, x: torch.Tensor, norm_w: torch.Tensor, eps: float,
                      counter: torch.Tensor, *, fp8_cvt: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """a [1, K] through one linear (a plain [N, K] tensor, a QuantLinear or its tensors dict) -> y [1, N] in
    x's dtype, then (new_x, normed) = add_rms_norm(x, y, norm_w, eps) with x [1, N]: the bytes of
    gemv(a, weight) then add_rms_norm (the norm's rstd within its order of sums: the module docstring).
    counter: launch.new_counter's int32 at 0, one per call site. One launch, no host sync."""
    fmt, tensors, k = gm._check(a, [weight])
    if a.dtype != x.dtype or x.dim() != 2 or x.shape[0] != 1 or not x.is_contiguous():
        raise ValueError(f"x must be a contiguous [1, N] residual in a's dtype {a.dtype}, got {x.dtype} "
                         f"{tuple(x.shape)}")
    n, elem = gm.part_shape(fmt, tensors[0])
    if x.shape[1] != n or norm_w.shape != (n,):
        raise ValueError(f"the projection gives {n} features: x must be [1, {n}] and norm_w [{n}], got "
                         f"{tuple(x.shape)} and {tuple(norm_w.shape)}")
    if n > 8192:
        raise ValueError(f"the norm keeps a row in registers: N {n} > 8192")
    if counter.dtype != torch.int32 or counter.numel() != 1 or counter.device != a.device:
        raise ValueError("counter must be launch.new_counter(a.device): one int32 on a's device")
    cfg = gm.launch_config(fmt, n, k, elem, a.device)
    # sm_89+ (else the bit path); the tensor cores take the codes as float8e4nv elements too
    fp8_cvt = ((fp8_cvt if fp8_cvt is not None else gm.FP8_CVT) and fp8_tensor_cores(a.device)) or bool(cfg.mma)
    w, s, g = gm._kernel_args(fmt, tensors[0], fp8_cvt)
    proj = torch.empty(1, n, device=a.device, dtype=x.dtype)
    new_x, normed = torch.empty_like(x), torch.empty_like(x)
    tiles = triton.cdiv(n, cfg.block_n)
    gemv_norm_kernel[(tiles,)](
        a.reshape(-1).contiguous(), exact_out(proj), proj, w, s, g, n, tiles, counter, x, norm_w,
        exact_out(new_x), exact_out(normed), eps, K=k, FMT=gm._FMT_ID[fmt], BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k, CHUNK=gm.chunk_words(fmt, cfg, elem, fp8_cvt), FP8_CVT=fp8_cvt and fmt == gm.FP8,
        ROUND=round_code(x.dtype), BLOCK_H=triton.next_power_of_2(n), FENCE=a.device.type == "cuda", MMA=cfg.mma,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **pdl_launch(a.device))
    return new_x, normed
