"""Parse a qwen3_5_moe `config.json` into a frozen ModelConfig.

Accepts the real composite file (`model_type: qwen3_5_moe`, text model under `text_config`) and the flat
CausalLM form (`model_type: qwen3_5_moe_text`, or `qwen3_5_moe` with the text fields at the top level).
Every malformed or unsupported field raises ConfigError naming the field. No torch here.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ConfigError, UnsupportedModelError

FULL_ATTENTION = "full_attention"
LINEAR_ATTENTION = "linear_attention"
_TOP_TYPES = {"qwen3_5_moe", "qwen3_5_moe_text"}


@dataclass(frozen=True)
class AttentionConfig:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rotary_dim: int  # partial rotary: only the first rotary_dim dims of each head rotate
    rope_theta: float
    output_gate: bool  # q_proj also emits a per-head sigmoid gate on the attention output


@dataclass(frozen=True)
class LinearAttentionConfig:
    """GatedDeltaNet geometry."""

    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int

    @property
    def key_dim(self) -> int:
        return self.num_key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_value_heads * self.value_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim


@dataclass(frozen=True)
class MoEConfig:
    num_experts: int
    top_k: int
    intermediate_size: int
    shared_intermediate_size: int


@dataclass(frozen=True)
class ModelConfig:
    hidden_size: int
    num_layers: int
    layer_types: tuple[str, ...]
    vocab_size: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    max_position_embeddings: int
    attention: AttentionConfig
    linear: LinearAttentionConfig
    moe: MoEConfig
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    torch_dtype: str  # the checkpoint's stored dtype name ("bfloat16", "float32", ...)
    quantization: dict | None  # the raw quantization_config block, interpreted by the quant module

    @property
    def full_attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == FULL_ATTENTION)

    @property
    def linear_attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == LINEAR_ATTENTION)


def _get(d: dict, key: str, kind: type | tuple[type, ...], where: str, default: Any = ...) -> Any:
    if key not in d or d[key] is None:
        if default is ...:
            raise ConfigError(f"config.json: field '{where}{key}' is missing")
        return default
    value = d[key]
    # bool is an int subclass; never accept it where a number is wanted.
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise ConfigError(f"config.json: field '{where}{key}' must be {_kind_name(kind)}, got {value!r}")
    if not isinstance(value, kind):
        raise ConfigError(f"config.json: field '{where}{key}' must be {_kind_name(kind)}, got {value!r}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


def _positive(d: dict, key: str, where: str, default: Any = ...) -> int:
    value = _get(d, key, int, where, default)
    if value <= 0:
        raise ConfigError(f"config.json: field '{where}{key}' must be > 0, got {value}")
    return value


def _layer_types(text: dict, num_layers: int, where: str) -> tuple[str, ...]:
    if text.get("layer_types") is not None:
        types = _get(text, "layer_types", list, where)
        if len(types) != num_layers:
            raise ConfigError(
                f"config.json: field '{where}layer_types' has {len(types)} entries, "
                f"but num_hidden_layers is {num_layers}"
            )
        for i, t in enumerate(types):
            if t not in (FULL_ATTENTION, LINEAR_ATTENTION):
                raise ConfigError(
                    f"config.json: field '{where}layer_types[{i}]' is {t!r}; "
                    f"expected '{FULL_ATTENTION}' or '{LINEAR_ATTENTION}'"
                )
        return tuple(types)
    interval = _positive(text, "full_attention_interval", where, 4)
    return tuple(LINEAR_ATTENTION if (i + 1) % interval else FULL_ATTENTION for i in range(num_layers))


def _rope(text: dict, head_dim: int, where: str) -> tuple[int, float]:
    params = text.get("rope_parameters") or text.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise ConfigError(f"config.json: field '{where}rope_parameters' must be an object")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        raise UnsupportedModelError(
            f"config.json: '{where}rope_parameters.rope_type' is {rope_type!r}; only 'default' RoPE is supported"
        )
    factor = params.get("partial_rotary_factor", text.get("partial_rotary_factor", 0.25))
    theta = params.get("rope_theta", text.get("rope_theta", 10000.0))
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or not 0 < factor <= 1:
        raise ConfigError(f"config.json: field '{where}partial_rotary_factor' must be in (0, 1], got {factor!r}")
    if not isinstance(theta, (int, float)) or isinstance(theta, bool) or theta <= 0:
        raise ConfigError(f"config.json: field '{where}rope_theta' must be a positive number, got {theta!r}")
    rotary_dim = int(head_dim * factor)
    if rotary_dim % 2:
        raise ConfigError(f"config.json: head_dim * partial_rotary_factor = {rotary_dim} must be even")
    return rotary_dim, float(theta)


def _eos_ids(text: dict, top: dict, where: str) -> tuple[int, ...]:
    raw = text.get("eos_token_id", top.get("eos_token_id"))
    if raw is None:
        return ()
    ids = raw if isinstance(raw, list) else [raw]
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ConfigError(f"config.json: field '{where}eos_token_id' must be an int or a list of ints, got {raw!r}")
    return tuple(ids)


def parse_model_config(raw: dict) -> ModelConfig:
    """Pure function: the parsed JSON of config.json -> ModelConfig."""
    if not isinstance(raw, dict):
        raise ConfigError("config.json: the top level must be a JSON object")
    model_type = raw.get("model_type")
    if model_type not in _TOP_TYPES:
        raise UnsupportedModelError(
            f"config.json: model_type is {model_type!r}; qwenlocal runs qwen3_5_moe checkpoints "
            "(Qwen3.5/3.6 MoE, e.g. Qwen/Qwen3.6-35B-A3B or nvidia/Qwen3.6-35B-A3B-NVFP4)"
        )
    if "text_config" in raw and raw["text_config"] is not None:
        text = raw["text_config"]
        where = "text_config."
        if not isinstance(text, dict):
            raise ConfigError("config.json: field 'text_config' must be an object")
        inner_type = text.get("model_type", "qwen3_5_moe_text")
        if inner_type not in _TOP_TYPES:
            raise UnsupportedModelError(f"config.json: 'text_config.model_type' is {inner_type!r}, not qwen3_5_moe_text")
    else:
        text, where = raw, ""

    hidden = _positive(text, "hidden_size", where)
    num_layers = _positive(text, "num_hidden_layers", where)
    act = text.get("hidden_act", "silu")
    if act != "silu":
        raise UnsupportedModelError(f"config.json: '{where}hidden_act' is {act!r}; only 'silu' is supported")
    if text.get("attention_bias", False):
        raise UnsupportedModelError(f"config.json: '{where}attention_bias' is true; not supported")
    if text.get("mlp_only_layers"):
        raise UnsupportedModelError(f"config.json: '{where}mlp_only_layers' is set; every layer must be MoE")

    heads = _positive(text, "num_attention_heads", where)
    kv_heads = _positive(text, "num_key_value_heads", where)
    if heads % kv_heads:
        raise ConfigError(f"config.json: num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv_heads})")
    head_dim = _positive(text, "head_dim", where, hidden // heads)
    rotary_dim, theta = _rope(text, head_dim, where)
    attention = AttentionConfig(
        num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, rotary_dim=rotary_dim, rope_theta=theta,
        output_gate=_get(text, "attn_output_gate", bool, where, True),
    )
    if not attention.output_gate:
        raise UnsupportedModelError(f"config.json: '{where}attn_output_gate' is false; qwen3_5_moe always gates")

    linear = LinearAttentionConfig(
        num_key_heads=_positive(text, "linear_num_key_heads", where),
        num_value_heads=_positive(text, "linear_num_value_heads", where),
        key_head_dim=_positive(text, "linear_key_head_dim", where),
        value_head_dim=_positive(text, "linear_value_head_dim", where),
        conv_kernel=_positive(text, "linear_conv_kernel_dim", where),
    )
    if linear.num_value_heads % linear.num_key_heads:
        raise ConfigError(
            f"config.json: linear_num_value_heads ({linear.num_value_heads}) must be a multiple of "
            f"linear_num_key_heads ({linear.num_key_heads})"
        )
    num_experts = _positive(text, "num_experts", where)
    top_k = _positive(text, "num_experts_per_tok", where)
    if top_k > num_experts:
        raise ConfigError(f"config.json: num_experts_per_tok ({top_k}) exceeds num_experts ({num_experts})")
    moe = MoEConfig(
        num_experts=num_experts, top_k=top_k,
        intermediate_size=_positive(text, "moe_intermediate_size", where),
        shared_intermediate_size=_positive(text, "shared_expert_intermediate_size", where),
    )
    eps = _get(text, "rms_norm_eps", (float, int), where, 1e-6)
    if eps <= 0:
        raise ConfigError(f"config.json: field '{where}rms_norm_eps' must be > 0, got {eps}")
    tie = _get(text, "tie_word_embeddings", bool, where, _get(raw, "tie_word_embeddings", bool, "", False))
    bos = text.get("bos_token_id", raw.get("bos_token_id"))
    if bos is not None and (not isinstance(bos, int) or isinstance(bos, bool)):
        raise ConfigError(f"config.json: field '{where}bos_token_id' must be an int, got {bos!r}")
    dtype = text.get("dtype") or text.get("torch_dtype") or raw.get("torch_dtype") or raw.get("dtype") or "bfloat16"
    quant = raw.get("quantization_config", text.get("quantization_config"))
    if quant is not None and not isinstance(quant, dict):
        raise ConfigError("config.json: field 'quantization_config' must be an object")
    return ModelConfig(
        hidden_size=hidden, num_layers=num_layers, layer_types=_layer_types(text, num_layers, where),
        vocab_size=_positive(text, "vocab_size", where), rms_norm_eps=float(eps), tie_word_embeddings=tie,
        max_position_embeddings=_positive(text, "max_position_embeddings", where, 262144),
        attention=attention, linear=linear, moe=moe, eos_token_ids=_eos_ids(text, raw, where),
        bos_token_id=bos, torch_dtype=str(dtype), quantization=quant,
    )


def load_model_config(model_dir: str | Path) -> ModelConfig:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ConfigError(f"{path} not found: point --model at a folder holding a qwen3_5_moe checkpoint")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path} is not UTF-8 text") from exc
    return parse_model_config(raw)
