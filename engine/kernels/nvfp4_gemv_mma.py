"""A batch-1 NVFP4 GEMV on the tensor cores, for the LM head: logits = x @ W^T, W [N, K] NVFP4.

Why: the LM head (248,320 x 2,048 NVFP4, 273 MB) is the step's largest launch. gemv_multi runs it at ~132 us on
the H200, 2.1 TB/s, about half of HBM speed. Its sm_90 code under the H200's Triton (3.6.0) spends 5.8
instructions a weight code (the E2M1 decode, an fp16 -> fp32 conversion and one FMA a code, then the
reductions): 545 M codes are ~95 us of issue on 132 SMs against 66 us of HBM time, so this launch, unlike the
small expert launches (nvfp4_experts_mma.py: slower there), is bound by issue. Here a code costs its decode into
fp16 tensor-core operands (two codes a register, the block scale multiplied in fp16x2), and the tensor cores do
the multiply-adds (tl.dot, fp32 accumulate), with x broadcast to the operand's 16 columns: 5.05 instructions a
code under 3.6.0 at 64 rows and 4 warps (3.8 under 3.9.0, where gemv_multi's is 6.9: the first estimates of
both were 3.9.0's; docs/RESULTS.md session 17).

The arithmetic is nvfp4_experts_mma's scaled form (its _step_dot and _code_index, and the same precision). x goes to
fp16: exact for |x| in [2^-14, 65504]. Below 2^-14 it is within 2^-25 absolute. The step checks once that the
final norm's outputs fit (nvfp4_experts_mma.fp16_safe_norm). Scaled weights are exact where |e2m1 * scale| >= 2^-7
and otherwise round to fp16 subnormals; the products are summed in fp32. So it reaches the bf16 level of gemv_multi
but not its bytes. Deterministic, with the launch fixed by the shapes: graph replay equals eager.
Reference: gemv_multi.gemv_multi_reference (dequantize, fp32 F.linear).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import gdc_prologue, pdl_launch
from .nvfp4_experts_mma import GROUPS, STEP, _code_index, _step_dot
from .nvfp4_triton import _store_exact, exact_out

# The fused step's LM head on the tensor cores (profile_decode arm "lmmma"): off until its GPU A/B.
LM_HEAD = False
BLOCK_N = 64  # rows a program: 64 x 1 KB of codes + 128 B of scales a row in flight


@triton.jit
def nvfp4_gemv_mma_kernel(x_ptr, w_ptr, s_ptr, g_ptr, out_ptr, N, K: tl.constexpr, BLOCK_N: tl.constexpr,
                          STEP_K: tl.constexpr, DECODE: tl.constexpr, MASKED: tl.constexpr,
                          OUT_BF16: tl.constexpr, USE_GDC: tl.constexpr = False):
    """Program p: rows [p * BLOCK_N, p * BLOCK_N + BLOCK_N) over all of K, STEP_K codes a step (a static loop:
    every step's loads can be in flight at once)."""
    gdc_prologue(USE_GDC)  # PDL: x is read only after the previous kernel ends
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = n < N
    idx = _code_index(STEP_K // 8)  # the activation each column position of the decoded tile multiplies
    col = tl.arange(0, GROUPS)
    acc = tl.zeros([BLOCK_N, GROUPS], dtype=tl.float32)
    for t in tl.static_range(K // STEP_K):
        xv = tl.load(x_ptr + t * STEP_K + idx).to(tl.float16)
        b = tl.broadcast_to(xv[:, None], [STEP_K, GROUPS])
        acc += _step_dot(w_ptr, s_ptr, n, mask_n, t * STEP_K, K, b, STEP_K, DECODE, MASKED, True)
    acc = tl.where(col[None, :] == 0, acc, 0.0)  # every column holds the row's dot: take column 0 (exact)
    y = tl.sum(acc, axis=1) * (tl.load(g_ptr) * 128.0)  # 2^7: the decoded weights' scaling
    _store_exact(out_ptr + n, y, mask_n, OUT_BF16)


def fits(k: int) -> bool:
    """Whether K takes whole steps of this kernel (STEP codes, or one power-of-2 step >= 16 when smaller)."""
    step = min(STEP, k)
    return k % step == 0 and step % 16 == 0 and step & (step - 1) == 0


def nvfp4_gemv_mma(x: torch.Tensor, tensors: dict, out_dtype: torch.dtype = torch.float32, *,
                   block_n: int = BLOCK_N, num_warps: int = 4, decode: str | None = None) -> torch.Tensor:
    """x [1, K] or [K] (bf16 / fp16 / fp32; its values must fit fp16) and an NVFP4 linear's tensors (weight uint8
    [N, K/2], weight_scale e4m3 [N, K/16], weight_scale_2 fp32 []) -> [1, N] in out_dtype (fp32 or bf16).
    One launch of N / block_n programs; no host reads (CUDA-graph capturable)."""
    w, s, g = tensors["weight"], tensors["weight_scale"], tensors["weight_scale_2"]
    n, half = w.shape
    k = 2 * half
    if x.numel() != k:
        raise ValueError(f"x has {x.numel()} values, the weight's rows {k}")
    if not fits(k):
        raise ValueError(f"K = {k} must be a multiple of {STEP} (or one power-of-2 step >= 16)")
    if s.shape != (n, k // 16) or w.dtype != torch.uint8:
        raise ValueError(f"expected NVFP4 tensors weight uint8 [{n}, {k // 2}] and weight_scale [{n}, {k // 16}]")
    if out_dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"out_dtype must be float32 or bfloat16, got {out_dtype}")
    if decode is None:
        decode = "asm" if x.is_cuda else "fp16"
    out = torch.empty(1, n, device=x.device, dtype=out_dtype)
    nvfp4_gemv_mma_kernel[(triton.cdiv(n, block_n),)](
        x.reshape(-1).contiguous(), w.contiguous().view(torch.int32), s.contiguous().view(torch.uint8),
        g.reshape(1).to(torch.float32), exact_out(out), n, K=k, BLOCK_N=block_n, STEP_K=min(STEP, k),
        DECODE=decode, MASKED=n % block_n != 0, OUT_BF16=out_dtype == torch.bfloat16, num_warps=num_warps,
        **pdl_launch(x.device))
    return out
