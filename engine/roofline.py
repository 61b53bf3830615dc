"""Bytes and FLOPs a step must move or compute, from the model config: the roofline each benchmark
figure is compared with (time >= bytes / measured bandwidth, and >= FLOPs / measured matmul rate)."""
from __future__ import annotations

from dataclasses import dataclass

from .config import ModelConfig


@dataclass(frozen=True)
class StepCost:
    weight_bytes: int  # dense weights read once per step (embedding: one row per token)
    expert_bytes: int  # routed experts read (distinct experts of the step)
    kv_bytes: int  # KV read by the full-attention layers
    state_bytes: int  # GatedDeltaNet recurrent + conv state, read and written
    flops: int

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.expert_bytes + self.kv_bytes + self.state_bytes


def dense_params_per_layer(cfg: ModelConfig) -> tuple[int, int, int]:
    """(full-attention layer, GDN layer, MoE non-expert) parameter counts, norms excluded."""
    h, a, lin, moe = cfg.hidden_size, cfg.attention, cfg.linear, cfg.moe
    attn = h * a.num_heads * a.head_dim * 2 + 2 * h * a.num_kv_heads * a.head_dim + a.num_heads * a.head_dim * h
    gdn = (h * lin.conv_dim + h * lin.value_dim + 2 * h * lin.num_value_heads + lin.conv_dim * lin.conv_kernel
           + lin.value_dim * h)
    moe_dense = moe.num_experts * h + 3 * h * moe.shared_intermediate_size + h
    return attn, gdn, moe_dense


def expert_params(cfg: ModelConfig) -> int:
    return 3 * cfg.hidden_size * cfg.moe.intermediate_size


def decode_step_cost(cfg: ModelConfig, context: int, dtype_bytes: int = 2,
                     distinct_experts_per_layer: int | None = None) -> StepCost:
    """One decode token at `context` tokens of history, batch 1, all experts resident."""
    attn, gdn, moe_dense = dense_params_per_layer(cfg)
    n_attn, n_gdn = len(cfg.full_attention_layers), len(cfg.linear_attention_layers)
    dense = n_attn * attn + n_gdn * gdn + cfg.num_layers * moe_dense + cfg.vocab_size * cfg.hidden_size
    experts = cfg.num_layers * (distinct_experts_per_layer or cfg.moe.top_k) * expert_params(cfg)
    a, lin = cfg.attention, cfg.linear
    kv = n_attn * context * 2 * a.num_kv_heads * a.head_dim * dtype_bytes
    state = n_gdn * 2 * (lin.num_value_heads * lin.key_head_dim * lin.value_head_dim * 4
                         + lin.conv_dim * (lin.conv_kernel - 1) * dtype_bytes)
    active = dense + cfg.num_layers * cfg.moe.top_k * expert_params(cfg)
    flops = 2 * active + n_attn * 4 * context * a.num_heads * a.head_dim
    return StepCost((dense + cfg.hidden_size) * dtype_bytes, experts * dtype_bytes, kv, state, flops)


def prefill_flops(cfg: ModelConfig, tokens: int) -> int:
    """Matmul FLOPs of a fresh prompt: 2 x active params per token + causal attention (QK and PV)."""
    attn, gdn, moe_dense = dense_params_per_layer(cfg)
    n_attn, n_gdn = len(cfg.full_attention_layers), len(cfg.linear_attention_layers)
    active = (n_attn * attn + n_gdn * gdn + cfg.num_layers * (moe_dense + cfg.moe.top_k * expert_params(cfg))
              + cfg.vocab_size * cfg.hidden_size)
    a = cfg.attention
    attention = n_attn * 2 * 2 * a.num_heads * a.head_dim * tokens * tokens // 2
    return 2 * active * tokens + attention


def _nbytes(weight) -> int:
    """A plain tensor's bytes, or a QuantLinear's stored bytes (FP8/NVFP4 codes + scales)."""
    return weight.nbytes if not hasattr(weight, "element_size") else weight.numel() * weight.element_size()


def model_step_bytes(model, context: int) -> dict[str, int]:
    """Bytes one batch-1 decode step of this built model must read (or write) at `context` tokens, from the
    weights as they are stored (a mixed FP8/NVFP4/BF16 checkpoint is counted in its own bytes): every dense
    weight once, one embedding row, top_k routed experts per layer, the KV of the attention layers, and the
    GDN states read and written. The HBM roofline of the step is their sum / the device's bandwidth."""
    dense = _nbytes(model.norm) + _nbytes(model.lm_head_w)
    dense += model.embed.shape[1] * model.embed.element_size()
    experts = kv = state = 0
    cfg = model.cfg
    for layer in model.layers:
        dense += _nbytes(layer.input_norm) + _nbytes(layer.post_norm)
        dense += sum(_nbytes(w) for w in vars(layer.mixer).values() if _is_weight(w))
        moe = layer.moe
        dense += _nbytes(moe.router_w) + _nbytes(moe.shared_gate) + sum(_nbytes(w) for w in moe.shared)
        weights = getattr(moe.experts, "weights", None) or moe.experts.cache.decode_weights
        per_expert = sum(w[0].numel() * w.element_size() for w in weights)
        experts += cfg.moe.top_k * per_expert
        if layer.is_attention:
            a = cfg.attention
            kv += context * 2 * a.num_kv_heads * a.head_dim * model.embed.element_size()
        else:
            lin = cfg.linear
            state += 2 * (lin.num_value_heads * lin.key_head_dim * lin.value_head_dim * 4
                          + lin.conv_dim * (lin.conv_kernel - 1) * model.embed.element_size())
    return {"dense": dense, "experts": experts, "kv": kv, "state": state,
            "total": dense + experts + kv + state}


def _is_weight(value) -> bool:
    return hasattr(value, "nbytes") and (not hasattr(value, "dim") or value.dim() >= 1) and \
        not isinstance(value, (int, float, str))
