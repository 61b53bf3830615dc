"""Gated full attention of qwen3_5_moe; the KV store and the attention kernel come from the backend.

q_proj emits [heads, 2 * head_dim] per token: the first head_dim are the query, the last the output gate.
q/k get a zero-centred RMSNorm per head, then partial NeoX RoPE; GQA; output * sigmoid(gate) -> o_proj.
"""
from __future__ import annotations

import torch

from ..config import ModelConfig
from .cache import SequenceState
from .ops import apply_partial_rope, rms_norm_zero_centered, rope_cos_sin
from ..quant.linear import linear


class GatedAttention:
    def __init__(self, cfg: ModelConfig, layer: int, w: dict[str, torch.Tensor], kernels):
        p = f"layers.{layer}.self_attn."
        self.layer, self.cfg, self.eps, self.backend = layer, cfg.attention, cfg.rms_norm_eps, kernels.attention
        self.kernels = kernels
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (w[p + n + ".weight"] for n in ("q_proj", "k_proj", "v_proj", "o_proj"))
        self.q_norm, self.k_norm = w[p + "q_norm.weight"], w[p + "k_norm.weight"]

    def forward(self, x: torch.Tensor, positions: torch.Tensor, state: SequenceState, start: int,
                decode: bool) -> torch.Tensor:
        q, gate = self.begin(x, positions, state, start, decode)
        return self.end(self.backend.attend_rows(state.kv[self.layer], q, start, decode), gate, decode)

    def begin(self, x: torch.Tensor, positions: torch.Tensor, state: SequenceState, start: int,
              decode: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Up to the attention kernel: q [T, heads, head_dim] and what `end` gates with; k and v written to the
        KV store. Split from `end` so that layer-major prefill can attend two chunks' q in one call."""
        a, t = self.cfg, x.shape[0]
        if self.kernels.fused_prefill and not decode:  # prefill on a GPU: the glue in two Triton launches
            return self._begin_fused(x, positions, state, start)
        qg = linear(x, self.q_proj).view(t, a.num_heads, 2 * a.head_dim)
        q, gate = qg[..., : a.head_dim], qg[..., a.head_dim:].reshape(t, -1)
        q = rms_norm_zero_centered(q, self.q_norm, self.eps)
        k = rms_norm_zero_centered(linear(x, self.k_proj).view(t, a.num_kv_heads, a.head_dim), self.k_norm, self.eps)
        v = linear(x, self.v_proj).view(t, a.num_kv_heads, a.head_dim)
        cos, sin = rope_cos_sin(positions, a.rotary_dim, a.rope_theta, x.dtype)
        q, k = apply_partial_rope(q, cos, sin), apply_partial_rope(k, cos, sin)
        self.backend.write(state.kv[self.layer], k, v, positions, start)
        return q, gate

    def end(self, out: torch.Tensor, gate: torch.Tensor, decode: bool = False) -> torch.Tensor:
        """The attention output [T, heads, head_dim] gated by what `begin` returned, then projected."""
        a, t = self.cfg, out.shape[0]
        out = out.reshape(t, -1)
        if self.kernels.fused_prefill and not decode:  # gate: q_proj's whole output (_begin_fused)
            from ..kernels.decode_norm import sigmoid_gate_mul

            gate = gate.view(t * a.num_heads, 2 * a.head_dim)[:, a.head_dim:]
            return linear(sigmoid_gate_mul(out, gate, dest=out), self.o_proj)
        return linear(out * torch.sigmoid(gate), self.o_proj)

    def _begin_fused(self, x: torch.Tensor, positions: torch.Tensor, state: SequenceState, start: int):
        """begin's prefill with the q/k norms and RoPE in one launch (attention_prologue_rows); `end` then gates
        in one (sigmoid_gate_mul) from q_proj's whole output: ~45 torch ops a chunk fewer, the precision of the
        decode prologue."""
        from ..kernels.attention_prologue import attention_prologue_rows  # Triton: Linux only, imported on use

        a, t = self.cfg, x.shape[0]
        qg = linear(x, self.q_proj)
        q, k = attention_prologue_rows(qg, linear(x, self.k_proj), self.q_norm, self.k_norm, positions, self.eps,
                                       a.num_heads, a.num_kv_heads, a.head_dim, a.rotary_dim, a.rope_theta)
        v = linear(x, self.v_proj).view(t, a.num_kv_heads, a.head_dim)
        self.backend.write(state.kv[self.layer], k, v, positions, start)
        return q, qg
