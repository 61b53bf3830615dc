"""GatedDeltaNet's causal depthwise conv1d + SiLU over a prefill chunk in one launch, written straight into
contiguous q, k and v (options.prefill_kernels=fused).

Why: the reference (gdn_torch.causal_conv1d on in_proj_qkv's output) transposes the chunk to [C, T], concatenates
the conv state in front (a copy of the whole chunk: 132 us per (layer, 2,048-token chunk) in the H200's 64K
profile), runs torch's depthwise conv (176 us there) and a SiLU, and transposes back; the q / k / v views it
leaves are then copied again by fla for contiguity. Here one program reads a [tokens, channels] tile of the
projection (and of the state for the first W - 1 tokens), and stores SiLU(conv) into q, k or v by channel.

Arithmetic: for each output the W taps are summed in fp32 in order (oldest input first), rounded to the
projection's dtype (the conv's output dtype), then SiLU in fp32 and rounded again, as F.silu(conv1d(...)) does;
only the conv's summation order may differ from torch's (cuDNN's is unspecified). The new conv state (the last
W - 1 inputs) is a small torch slice. Reference: gdn_torch.causal_conv1d.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .gdn_decode import _DT, _round


@triton.jit
def conv_silu_split_kernel(x_ptr, state_ptr, w_ptr, q_ptr, k_ptr, v_ptr, T, C, KD, state_stride,
                           W: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, DT: tl.constexpr):
    t = tl.program_id(0) * BT + tl.arange(0, BT)[:, None]
    c = tl.program_id(1) * BC + tl.arange(0, BC)[None, :]
    cmask = c < C
    t64, c64 = t.to(tl.int64), c.to(tl.int64)
    acc = tl.zeros([BT, BC], dtype=tl.float32)
    for i in tl.static_range(W):  # tap i reads input t - (W - 1) + i: the state's slot for negative indices
        j = t - (W - 1) + i
        from_x = tl.load(x_ptr + j.to(tl.int64) * C + c64, mask=(j >= 0) & (t < T) & cmask, other=0.0)
        from_state = tl.load(state_ptr + c64 * state_stride + (W - 1 + j), mask=(j < 0) & (t < T) & cmask,
                             other=0.0)
        xin = _round(tl.where(j >= 0, from_x.to(tl.float32), from_state.to(tl.float32)), DT)
        acc += tl.load(w_ptr + c64 * W + i, mask=cmask, other=0.0).to(tl.float32) * xin
    y = _round(acc, DT)
    y = _round(y / (1.0 + tl.exp(-y)), DT)
    # q: channels [0, KD), k: [KD, 2 KD), v: [2 KD, C); each [T, width] contiguous
    in_q, in_k = c < KD, c < 2 * KD
    dest = tl.where(in_q, q_ptr + t64 * KD + c64,
                    tl.where(in_k, k_ptr + t64 * KD + (c64 - KD), v_ptr + t64 * (C - 2 * KD) + (c64 - 2 * KD)))
    tl.store(dest, y.to(q_ptr.dtype.element_ty), mask=(t < T) & cmask)


def conv_silu_split(x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor, key_dim: int
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [T, C] (in_proj_qkv's output, C = 2 key_dim + value_dim), weight [C, W], state [C, W - 1] (the last
    W - 1 inputs before x, any float dtype) -> (q [T, key_dim], k [T, key_dim], v [T, value_dim], the new state
    [C, W - 1] in x.dtype): silu(causal depthwise conv1d) in one launch, as gdn_torch.causal_conv1d gives it
    (transposed back and split)."""
    t, c = x.shape
    w = weight.shape[1]
    if weight.shape[0] != c or state.shape != (c, w - 1) or not 0 < 2 * key_dim < c:
        raise ValueError(f"x [T, C], weight [C, W], state [C, W - 1] and 2 key_dim < C, got {tuple(x.shape)}, "
                         f"{tuple(weight.shape)}, {tuple(state.shape)}, key_dim {key_dim}")
    if x.dtype not in _DT:
        raise TypeError(f"conv_silu_split runs in float32 / bfloat16 / float16, not {x.dtype}")
    x, weight = x.contiguous(), weight.contiguous()
    q = torch.empty(t, key_dim, device=x.device, dtype=x.dtype)
    k = torch.empty(t, key_dim, device=x.device, dtype=x.dtype)
    v = torch.empty(t, c - 2 * key_dim, device=x.device, dtype=x.dtype)
    if t:
        bt, bc = 32, min(128, triton.next_power_of_2(c))
        conv_silu_split_kernel[(triton.cdiv(t, bt), triton.cdiv(c, bc))](
            x, state, weight, q, k, v, t, c, key_dim, state.stride(0), W=w, BT=bt, BC=bc, DT=_DT[x.dtype],
            num_warps=4)
    # The inputs the next chunk's first outputs need: the last W - 1 of (state, x)
    if t >= w - 1:
        new_state = x[t - (w - 1):].t()
    else:
        new_state = torch.cat([state.to(x.dtype), x.t()], dim=1)[:, t:]
    return q, k, v, new_state
