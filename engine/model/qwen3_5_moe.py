"""The qwen3_5_moe text model: embedding -> 40 hybrid decoder layers -> norm -> LM head."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..config import FULL_ATTENTION, ModelConfig
from .attention import GatedAttention
from .cache import SequenceState
from .gdn import GatedDeltaNet
from .moe import SparseMoE
from .ops import rms_norm_zero_centered


class DecoderLayer:
    def __init__(self, cfg: ModelConfig, layer: int, w: dict[str, torch.Tensor]):
        p = f"layers.{layer}."
        self.eps = cfg.rms_norm_eps
        self.input_norm, self.post_norm = w[p + "input_layernorm.weight"], w[p + "post_attention_layernorm.weight"]
        self.is_attention = cfg.layer_types[layer] == FULL_ATTENTION
        self.mixer = GatedAttention(cfg, layer, w) if self.is_attention else GatedDeltaNet(cfg, layer, w)
        self.moe = SparseMoE(cfg, layer, w)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, state: SequenceState, decode: bool) -> torch.Tensor:
        h = rms_norm_zero_centered(x, self.input_norm, self.eps)
        if self.is_attention:
            h = self.mixer.forward(h, positions, state)
        else:
            h = self.mixer.forward(h, state, decode)
        x = x + h
        return x + self.moe.forward(rms_norm_zero_centered(x, self.post_norm, self.eps))


class Qwen35MoeModel:
    def __init__(self, cfg: ModelConfig, weights: dict[str, torch.Tensor]):
        self.cfg = cfg
        self.embed = weights["embed_tokens.weight"]
        self.layers = [DecoderLayer(cfg, i, weights) for i in range(cfg.num_layers)]
        self.norm = weights["norm.weight"]
        self.lm_head_w = weights["lm_head.weight"]
        self.dtype, self.device = self.embed.dtype, self.embed.device

    def forward(self, ids: torch.Tensor, state: SequenceState, decode: bool = False) -> torch.Tensor:
        """Run `ids` [T] after the state's current length; returns final-normed hidden [T, H]."""
        t = ids.shape[0]
        state.check_room(t)
        positions = torch.arange(state.seq_len, state.seq_len + t, device=self.device)
        x = F.embedding(ids, self.embed)
        for layer in self.layers:
            x = layer.forward(x, positions, state, decode)
        state.seq_len += t
        return rms_norm_zero_centered(x, self.norm, self.cfg.rms_norm_eps)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.lm_head_w).float()
