"""GatedDeltaNet (linear attention) layer of qwen3_5_moe, reference path.

in_proj_qkv -> causal depthwise conv1d (+ SiLU) over all channels -> split q | k | v; l2-normed q/k in fp32,
q scaled by key_head_dim^-0.5, k-heads repeat_interleaved to the value heads; gated delta rule (chunked in
prefill, recurrent in decode) on an fp32 state; gated RMSNorm with z; out_proj.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..config import ModelConfig
from ..kernels.gdn_torch import causal_conv1d, chunk_gated_delta_rule, recurrent_gated_delta_rule
from .cache import SequenceState
from .ops import l2norm, rms_norm_gated


class GatedDeltaNet:
    def __init__(self, cfg: ModelConfig, layer: int, w: dict[str, torch.Tensor]):
        p = f"layers.{layer}.linear_attn."
        self.layer, self.cfg, self.eps = layer, cfg.linear, cfg.rms_norm_eps
        self.in_proj_qkv, self.in_proj_z = w[p + "in_proj_qkv.weight"], w[p + "in_proj_z.weight"]
        self.in_proj_b, self.in_proj_a = w[p + "in_proj_b.weight"], w[p + "in_proj_a.weight"]
        self.conv_w = w[p + "conv1d.weight"][:, 0, :]
        self.neg_a = -w[p + "A_log"].float().exp()  # fp32: A_log is kept in fp32 by the loader
        self.dt_bias = w[p + "dt_bias"]
        self.norm_w, self.out_proj = w[p + "norm.weight"], w[p + "out_proj.weight"]

    def forward(self, x: torch.Tensor, state: SequenceState, decode: bool) -> torch.Tensor:
        c, t = self.cfg, x.shape[0]
        mixed, state.conv[self.layer] = causal_conv1d(
            F.linear(x, self.in_proj_qkv).transpose(0, 1), self.conv_w, state.conv[self.layer]
        )
        mixed = mixed.transpose(0, 1)
        q, k, v = torch.split(mixed, [c.key_dim, c.key_dim, c.value_dim], dim=-1)
        rep = c.num_value_heads // c.num_key_heads
        q = l2norm(q.reshape(t, c.num_key_heads, c.key_head_dim).float()).repeat_interleave(rep, dim=1)
        k = l2norm(k.reshape(t, c.num_key_heads, c.key_head_dim).float()).repeat_interleave(rep, dim=1)
        v = v.reshape(t, c.num_value_heads, c.value_head_dim).float()
        q = q * c.key_head_dim ** -0.5
        beta = torch.sigmoid(F.linear(x, self.in_proj_b)).float()
        g = self.neg_a * F.softplus(F.linear(x, self.in_proj_a).float() + self.dt_bias)
        rule = recurrent_gated_delta_rule if decode else chunk_gated_delta_rule
        out, state.recurrent[self.layer] = rule(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), g.transpose(0, 1), beta.transpose(0, 1),
            state.recurrent[self.layer],
        )
        out = out.transpose(0, 1).to(x.dtype)
        z = F.linear(x, self.in_proj_z).view(t, c.num_value_heads, c.value_head_dim)
        out = rms_norm_gated(out, z, self.norm_w, self.eps).reshape(t, -1)
        return F.linear(out, self.out_proj)
