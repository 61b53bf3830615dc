"""The split-KV decode attention's merge in the output gate's launch: out = sigmoid(gate) * (the splits' partials
merged), one program a (query head, run of head_dim columns), no counter, no fence.

Why: attention_decode's launch merges its partials itself, by the last programs to arrive at two levels (the last
of each group of 8 splits, then the last group), each a fence, an atomic and a serial loop of loads over 8
partials from L2, on the step's critical path after the KV reads. At 16K the launch takes 18.5 us for 33.6 MB
(45 % of the H200's read rate) while at 120K it reads at 89 % (docs/RESULTS.md session 15): the fixed part is
the ramp and the merge. The output gate (decode_norm.sigmoid_gate_mul) is a launch of its own right after it
anyway. Here the attention launch only stores its partials (decode_attention_parts), and the gate's launch
merges them: each program loads one query head's running maxima and sums of all splits and a [splits, columns]
tile of their accumulators at once (every split's partial in one load, not a loop), weighs them by exp(m - max),
divides by the weighted sum of l, rounds to the output dtype (as the attention's store did) and multiplies by
sigmoid(gate) rounded to the gate's dtype (as sigmoid_gate_mul does).

Not the in-launch merge's bytes: the splits' weighted sum is one tl.sum over the splits axis, not two levels in
order; deterministic (a fixed reduction for a fixed launch). Off until its GPU A/B (the switch
attention_decode.MERGE_APART, profile_decode arm "attnmerge").
Reference: merge_gate_reference (torch, from the same partials); the fused step's gate is the bf16 level of the
unfused step and graph == eager (tests/test_gpu_decode_fused.py).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .decode_norm import _round_as, round_code
from .launch import gdc_prologue, pdl_launch
from .nvfp4_triton import _store_exact, exact_out

BLOCK_D = 32  # head_dim columns a program: 16 heads x 8 = 128 programs at head_dim 256, a [64, 32] tile each


@triton.jit
def merge_gate_kernel(acc_ptr, ml_ptr, gate_ptr, out_ptr, G, gate_stride, SPLITS: tl.constexpr, D: tl.constexpr,
                      BLOCK_D: tl.constexpr, ROUND_OUT: tl.constexpr, ROUND_GATE: tl.constexpr,
                      OUT_BF16: tl.constexpr, USE_GDC: tl.constexpr = False):
    """Program (i, c): query head i (on KV head i // G, row i % G of its partials), columns c * BLOCK_D ...;
    acc [KV heads, SPLITS, G, D], ml [KV heads, SPLITS, G, 2] (decode_attention_parts)."""
    gdc_prologue(USE_GDC)  # PDL: the partials are the attention launch's output
    i = tl.program_id(0)
    h, g = i // G, i % G
    s = tl.arange(0, SPLITS)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    part = (h * SPLITS + s) * G + g  # [SPLITS]
    m = tl.load(ml_ptr + part * 2)
    l = tl.load(ml_ptr + part * 2 + 1)
    acc = tl.load(acc_ptr + part[:, None] * D + d[None, :])  # every split's columns in one load
    top = tl.max(m, axis=0)
    w = tl.exp(m - tl.where(top == float("-inf"), 0.0, top))  # an empty split (m = -inf): weight 0
    total = tl.sum(w * l, axis=0)
    o = tl.sum(w[:, None] * acc, axis=0) / tl.where(total == 0.0, 1.0, total)
    o = _round_as(o, ROUND_OUT)  # the attention's output in its dtype, as its own store left it
    gate = tl.load(gate_ptr + i * gate_stride + d).to(tl.float32)
    sig = _round_as(1.0 / (1.0 + tl.exp(-gate)), ROUND_GATE)  # torch.sigmoid(gate) in the gate's dtype
    _store_exact(out_ptr + i * D + d, o * sig, None, OUT_BF16)  # whole columns: merge_gate checks D % BLOCK_D


def merge_gate(acc: torch.Tensor, ml: torch.Tensor, gate: torch.Tensor, out_dtype: torch.dtype, *,
               block_d: int = BLOCK_D, num_warps: int = 2) -> torch.Tensor:
    """decode_attention_parts' (acc, ml) merged and gated: out [1, heads * D] in out_dtype = sigmoid(gate) *
    softmax-weighted V, gate [heads, D] with stride-1 rows (attention_prologue's view). One launch."""
    kvh, splits, g, d = acc.shape
    heads = kvh * g
    if ml.shape != (kvh, splits, g, 2) or acc.dtype != torch.float32 or ml.dtype != torch.float32:
        raise ValueError(f"acc / ml must be decode_attention_parts' fp32 [kv heads, splits, G, D] / [.., 2], got "
                         f"{tuple(acc.shape)} and {tuple(ml.shape)}")
    if gate.shape != (heads, d) or gate.stride(1) != 1:
        raise ValueError(f"gate must be [{heads}, {d}] with stride-1 rows, got {tuple(gate.shape)}")
    block_d = min(block_d, d)
    if splits & (splits - 1) or d % block_d or block_d & (block_d - 1):
        raise ValueError(f"splits {splits} and block_d {block_d} must be powers of 2, head_dim {d} a multiple")
    out = torch.empty(1, heads * d, device=acc.device, dtype=out_dtype)
    merge_gate_kernel[(heads, d // block_d)](
        acc, ml, gate, exact_out(out), g, gate.stride(0), SPLITS=splits, D=d, BLOCK_D=block_d,
        ROUND_OUT=round_code(out_dtype), ROUND_GATE=round_code(gate.dtype), OUT_BF16=out_dtype == torch.bfloat16,
        num_warps=num_warps, **pdl_launch(acc.device))
    return out


def merge_gate_reference(acc: torch.Tensor, ml: torch.Tensor, gate: torch.Tensor,
                         out_dtype: torch.dtype) -> torch.Tensor:
    """merge_gate in torch (fp32): the splits weighed by exp(m - max m), rounded to out_dtype, times sigmoid(gate)
    in the gate's dtype."""
    kvh, splits, g, d = acc.shape
    m, l = ml[..., 0], ml[..., 1]  # [kvh, splits, g]
    top = m.amax(dim=1, keepdim=True)
    w = torch.exp(m - torch.where(top == float("-inf"), torch.zeros_like(top), top))
    o = (w[..., None] * acc).sum(dim=1) / (w * l).sum(dim=1)[..., None].clamp_min(torch.finfo(torch.float32).tiny)
    o = o.reshape(kvh * g, d).to(out_dtype).float()
    return (o * torch.sigmoid(gate).float()).to(out_dtype).reshape(1, -1)
