"""Gated full attention of qwen3_5_moe (reference path: contiguous KV + torch SDPA).

q_proj emits [heads, 2 * head_dim] per token: the first head_dim are the query, the last the output gate.
q/k get a zero-centred RMSNorm per head, then partial NeoX RoPE; GQA; output * sigmoid(gate) -> o_proj.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..config import ModelConfig
from .cache import SequenceState
from .ops import apply_partial_rope, rms_norm_zero_centered, rope_cos_sin


def sdpa_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_start: int, scale: float) -> torch.Tensor:
    """q [T, Hq, D] at absolute positions q_start.., k/v [L, Hkv, D] for positions 0..L-1 -> [T, Hq, D]."""
    t, hq, _ = q.shape
    group = hq // k.shape[1]
    k = k.repeat_interleave(group, dim=1).transpose(0, 1)
    v = v.repeat_interleave(group, dim=1).transpose(0, 1)
    qh = q.transpose(0, 1)
    if q_start == 0 and t == k.shape[1]:
        out = F.scaled_dot_product_attention(qh, k, v, is_causal=True, scale=scale)
    else:
        q_pos = torch.arange(q_start, q_start + t, device=q.device)
        mask = torch.arange(k.shape[1], device=q.device)[None, :] <= q_pos[:, None]
        out = F.scaled_dot_product_attention(qh, k, v, attn_mask=mask, scale=scale)
    return out.transpose(0, 1)


class GatedAttention:
    def __init__(self, cfg: ModelConfig, layer: int, w: dict[str, torch.Tensor]):
        p = f"layers.{layer}.self_attn."
        self.layer, self.cfg, self.eps = layer, cfg.attention, cfg.rms_norm_eps
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (w[p + n + ".weight"] for n in ("q_proj", "k_proj", "v_proj", "o_proj"))
        self.q_norm, self.k_norm = w[p + "q_norm.weight"], w[p + "k_norm.weight"]

    def forward(self, x: torch.Tensor, positions: torch.Tensor, state: SequenceState) -> torch.Tensor:
        a, t = self.cfg, x.shape[0]
        qg = F.linear(x, self.q_proj).view(t, a.num_heads, 2 * a.head_dim)
        q, gate = qg[..., : a.head_dim], qg[..., a.head_dim:].reshape(t, -1)
        q = rms_norm_zero_centered(q, self.q_norm, self.eps)
        k = rms_norm_zero_centered(F.linear(x, self.k_proj).view(t, a.num_kv_heads, a.head_dim), self.k_norm, self.eps)
        v = F.linear(x, self.v_proj).view(t, a.num_kv_heads, a.head_dim)
        cos, sin = rope_cos_sin(positions, a.rotary_dim, a.rope_theta, x.dtype)
        q, k = apply_partial_rope(q, cos, sin), apply_partial_rope(k, cos, sin)
        start = state.seq_len
        cache = state.kv[self.layer]
        cache.write(start, k, v)
        k_all, v_all = cache.read(start + t)
        out = sdpa_causal(q, k_all, v_all, start, a.head_dim ** -0.5).reshape(t, -1)
        return F.linear(out * torch.sigmoid(gate), self.o_proj)
