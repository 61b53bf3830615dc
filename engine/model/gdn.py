"""GatedDeltaNet (linear attention) layer of qwen3_5_moe.

in_proj_qkv -> causal depthwise conv1d (+ SiLU) over all channels -> split q | k | v; the gated delta rule
core (kernels.gdn: torch reference or fla) on an fp32 state; gated RMSNorm with z; out_proj. States are
updated in place, so a captured decode graph keeps reading the same buffers.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..config import ModelConfig
from ..kernels.gdn_torch import causal_conv1d
from .cache import SequenceState
from .ops import rms_norm_gated
from ..quant.linear import linear


class GatedDeltaNet:
    def __init__(self, cfg: ModelConfig, layer: int, w: dict[str, torch.Tensor], kernels):
        p = f"layers.{layer}.linear_attn."
        self.layer, self.cfg, self.eps, self.kernels = layer, cfg.linear, cfg.rms_norm_eps, kernels
        self.in_proj_qkv, self.in_proj_z = w[p + "in_proj_qkv.weight"], w[p + "in_proj_z.weight"]
        self.in_proj_b, self.in_proj_a = w[p + "in_proj_b.weight"], w[p + "in_proj_a.weight"]
        self.conv_w = w[p + "conv1d.weight"][:, 0, :]
        self.neg_a = -w[p + "A_log"].float().exp()  # fp32: A_log is kept in fp32 by the loader
        self.dt_bias = w[p + "dt_bias"]
        self.norm_w, self.out_proj = w[p + "norm.weight"], w[p + "out_proj.weight"]

    def forward(self, x: torch.Tensor, state: SequenceState, decode: bool) -> torch.Tensor:
        c, t = self.cfg, x.shape[0]
        conv_state = state.conv[self.layer]
        fused = self.kernels.fused_prefill and not decode  # prefill on a GPU: Triton kernels for the glue
        if fused:  # conv + SiLU straight into contiguous q, k, v (kernels/gdn_conv.py)
            from ..kernels.gdn_conv import conv_silu_split

            q, k, v, new_conv = conv_silu_split(linear(x, self.in_proj_qkv), self.conv_w, conv_state, c.key_dim)
        else:
            mixed, new_conv = causal_conv1d(linear(x, self.in_proj_qkv).transpose(0, 1), self.conv_w, conv_state)
            q, k, v = torch.split(mixed.transpose(0, 1), [c.key_dim, c.key_dim, c.value_dim], dim=-1)
        conv_state.copy_(new_conv)
        q = q.reshape(t, c.num_key_heads, c.key_head_dim)
        k = k.reshape(t, c.num_key_heads, c.key_head_dim)
        v = v.reshape(t, c.num_value_heads, c.value_head_dim)
        beta = torch.sigmoid(linear(x, self.in_proj_b)).float()
        g = self.neg_a * F.softplus(linear(x, self.in_proj_a).float() + self.dt_bias)
        rec = state.recurrent[self.layer]
        out, new_rec = self.kernels.gdn(q, k, v, g, beta, rec, decode)
        rec.copy_(new_rec)
        z = linear(x, self.in_proj_z).view(t, c.num_value_heads, c.value_head_dim)
        if fused:  # the gated norm in one Triton launch (kernels/gdn_norm.py)
            from ..kernels.gdn_norm import gated_rms_norm

            out = gated_rms_norm(out, z, self.norm_w, self.eps).reshape(t, -1)
        else:
            out = rms_norm_gated(out.to(x.dtype), z, self.norm_w, self.eps).reshape(t, -1)
        return linear(out, self.out_proj)
