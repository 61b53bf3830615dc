"""The qwen3_5_moe text model: embedding -> hybrid decoder layers -> norm -> LM head.

`forward` is pure compute over a SequenceState: it never reads or changes the state's length on the host
(the runner owns that), so the same call can be captured in a CUDA graph with device-side positions.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..config import FULL_ATTENTION, ModelConfig
from .attention import GatedAttention
from .cache import SequenceState
from .gdn import GatedDeltaNet
from ..offload.overlap import DecodeOverlap
from .moe import ResidentExperts, SparseMoE
from .ops import rms_norm_zero_centered
from ..quant.linear import linear


class DecoderLayer:
    def __init__(self, cfg: ModelConfig, layer: int, w: dict[str, torch.Tensor], kernels, experts, overlap):
        p = f"layers.{layer}."
        self.eps, self.kernels = cfg.rms_norm_eps, kernels
        self.input_norm, self.post_norm = w[p + "input_layernorm.weight"], w[p + "post_attention_layernorm.weight"]
        self.is_attention = cfg.layer_types[layer] == FULL_ATTENTION
        self.mixer = GatedAttention(cfg, layer, w, kernels) if self.is_attention else GatedDeltaNet(cfg, layer, w, kernels)
        self.moe = SparseMoE(cfg, layer, w, kernels, experts, overlap)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, state: SequenceState, start: int,
                decode: bool) -> torch.Tensor:
        h = self._input_norm(x, decode)
        if self.is_attention:
            h = self.mixer.forward(h, positions, state, start, decode)
        else:
            h = self.mixer.forward(h, state, decode)
        return self._mlp(x, h, decode)

    def attention_begin(self, x: torch.Tensor, positions: torch.Tensor, state: SequenceState, start: int):
        """A prefill chunk of an attention layer up to its attention kernel (q, gate; KV written): with
        attention_end, forward split so that layer-major prefill can attend two chunks in one call."""
        return self.mixer.begin(self._input_norm(x, False), positions, state, start)

    def attention_end(self, x: torch.Tensor, q_gate, out: torch.Tensor) -> torch.Tensor:
        return self._mlp(x, self.mixer.end(out, q_gate[1]), False)

    def _input_norm(self, x: torch.Tensor, decode: bool) -> torch.Tensor:
        if self.kernels.fused_prefill and not decode:  # prefill on a GPU: one Triton launch a norm
            from ..kernels.decode_norm import add_rms_norm

            return add_rms_norm(x, None, self.input_norm, self.eps)[1]
        return rms_norm_zero_centered(x, self.input_norm, self.eps)

    def _mlp(self, x: torch.Tensor, h: torch.Tensor, decode: bool) -> torch.Tensor:
        """The mixer's output h added to the residual x, its norm, the MoE, added again."""
        if self.kernels.fused_prefill and not decode:  # x + h rounded as torch rounds it, then its norm, in one launch
            from ..kernels.decode_norm import add_rms_norm

            x, h = add_rms_norm(x, h, self.post_norm, self.eps)
        else:
            x = x + h
            h = rms_norm_zero_centered(x, self.post_norm, self.eps)
        return x + self.moe.forward(h, decode)


class Qwen35MoeModel:
    def __init__(self, cfg: ModelConfig, weights: dict[str, torch.Tensor], kernels, cache=None, overlap=None):
        """cache: an ExpertSlotCache when the routed experts are offloaded; else they are in `weights`.
        overlap: the DecodeOverlap the plan chose (serial when None)."""
        self.cfg = cfg
        self.kernels = kernels
        self.cache = cache
        self.overlap = overlap or DecodeOverlap("off")
        self.routing = None
        self.embed = weights["embed_tokens.weight"]
        self.layers = [DecoderLayer(cfg, i, weights, kernels, self._experts(i, weights), self.overlap)
                       for i in range(cfg.num_layers)]
        self.norm = weights["norm.weight"]
        self.lm_head_w = weights["lm_head.weight"]
        self.dtype, self.device = self.embed.dtype, self.embed.device

    def use_routing(self, trace) -> None:
        """Benchmarks: take expert ids from a synthetic trace (the runner advances it once per forward)."""
        self.routing = trace
        for layer in self.layers:
            layer.moe.routing = trace

    def _experts(self, layer: int, weights: dict[str, torch.Tensor]):
        if self.cache is not None:
            from ..offload.experts import OffloadedExperts

            return OffloadedExperts(layer, self.cache)
        p = f"layers.{layer}.mlp.experts."
        if p + "nvfp4_rows" in weights:  # native 4-bit experts, resident, at the bank's 16-byte row stride
            from ..quant.nvfp4_rows import padded_rows

            rows = padded_rows(weights[p + "nvfp4_rows"], self.cfg.hidden_size, self.cfg.moe.intermediate_size)
            weights[p + "nvfp4_rows"] = rows  # the unpadded copy is freed (a shared synthetic model keeps this one)
            return ResidentExperts((rows,), "nvfp4")
        return ResidentExperts((weights[p + "gate_up_proj"], weights[p + "down_proj"]))

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, state: SequenceState, start: int,
                decode: bool = False) -> torch.Tensor:
        """ids [T] at `positions` (device) = start..start+T-1 -> final-normed hidden [T, H]."""
        if decode and self.kernels.fused_decode and ids.shape[0] == 1:
            from . import decode_fused

            return decode_fused.forward(self, ids, positions, state, start)
        x = self.embed_ids(ids)
        for layer in self.layers:
            x = layer.forward(x, positions, state, start, decode)
        return self.final_norm(x)

    def embed_ids(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.embed)

    def final_norm(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm_zero_centered(x, self.norm, self.cfg.rms_norm_eps)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.kernels.fused_decode and hidden.shape[0] == 1:
            from . import decode_fused

            return decode_fused.logits(self, hidden)
        return linear(hidden, self.lm_head_w).float()
