import json

import pytest

from qwenlocal.engine.config import FULL_ATTENTION, LINEAR_ATTENTION, load_model_config, parse_model_config
from qwenlocal.engine.errors import ConfigError, UnsupportedModelError


def real_config() -> dict:
    """Qwen/Qwen3.6-35B-A3B config.json as in shared/reference/model-formats.md section 1."""
    text = {
        "model_type": "qwen3_5_moe_text", "dtype": "bfloat16", "attention_bias": False, "attn_output_gate": True,
        "bos_token_id": 248044, "eos_token_id": 248044, "full_attention_interval": 4, "head_dim": 256,
        "hidden_act": "silu", "hidden_size": 2048,
        "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 10,
        "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 16,
        "linear_num_value_heads": 32, "linear_value_head_dim": 128, "mamba_ssm_dtype": "float32",
        "max_position_embeddings": 262144, "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
        "num_experts": 256, "num_experts_per_tok": 8, "mtp_num_hidden_layers": 1, "num_attention_heads": 16,
        "num_hidden_layers": 40, "num_key_value_heads": 2, "partial_rotary_factor": 0.25, "rms_norm_eps": 1e-06,
        "rope_parameters": {"mrope_interleaved": True, "mrope_section": [11, 11, 10], "partial_rotary_factor": 0.25,
                            "rope_theta": 10000000, "rope_type": "default"},
        "tie_word_embeddings": False, "vocab_size": 248320,
    }
    return {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
            "tie_word_embeddings": False, "text_config": text, "vision_config": {"depth": 27}}


def test_real_config_parses_to_the_documented_geometry():
    cfg = parse_model_config(real_config())
    assert cfg.num_layers == 40 and cfg.hidden_size == 2048 and cfg.vocab_size == 248320
    assert cfg.full_attention_layers == tuple(range(3, 40, 4))
    assert len(cfg.linear_attention_layers) == 30
    assert (cfg.attention.num_heads, cfg.attention.num_kv_heads, cfg.attention.head_dim) == (16, 2, 256)
    assert cfg.attention.rotary_dim == 64 and cfg.attention.rope_theta == 1e7 and cfg.attention.output_gate
    lin = cfg.linear
    assert (lin.num_key_heads, lin.num_value_heads, lin.key_head_dim, lin.value_head_dim, lin.conv_kernel) == (16, 32, 128, 128, 4)
    assert lin.conv_dim == 8192 and lin.value_dim == 4096
    assert (cfg.moe.num_experts, cfg.moe.top_k, cfg.moe.intermediate_size, cfg.moe.shared_intermediate_size) == (256, 8, 512, 512)
    assert cfg.eos_token_ids == (248044,) and not cfg.tie_word_embeddings and cfg.rms_norm_eps == 1e-6


def test_flat_causal_lm_form_and_interval_give_the_same_config():
    raw = real_config()
    flat = dict(raw["text_config"])
    del flat["layer_types"]
    flat["model_type"] = "qwen3_5_moe_text"
    assert parse_model_config(flat) == parse_model_config(raw)


def test_config_is_frozen():
    cfg = parse_model_config(real_config())
    with pytest.raises(Exception):
        cfg.hidden_size = 1


@pytest.mark.parametrize("mutate, field", [
    (lambda r: r["text_config"].pop("hidden_size"), "hidden_size"),
    (lambda r: r["text_config"].__setitem__("num_experts", "256"), "num_experts"),
    (lambda r: r["text_config"].__setitem__("num_key_value_heads", 3), "num_key_value_heads"),
    (lambda r: r["text_config"].__setitem__("layer_types", ["full_attention"] * 3), "layer_types"),
    (lambda r: r["text_config"].__setitem__("layer_types", ["mamba"] * 40), "layer_types[0]"),
    (lambda r: r["text_config"].__setitem__("num_experts_per_tok", True), "num_experts_per_tok"),
    (lambda r: r["text_config"].__setitem__("rms_norm_eps", -1.0), "rms_norm_eps"),
])
def test_malformed_fields_name_the_field(mutate, field):
    raw = real_config()
    mutate(raw)
    with pytest.raises(ConfigError, match=field.replace("[", r"\[").replace("]", r"\]")):
        parse_model_config(raw)


@pytest.mark.parametrize("model_type", ["llama", "qwen3_moe", None])
def test_unsupported_model_type(model_type):
    raw = real_config()
    raw["model_type"] = model_type
    with pytest.raises(UnsupportedModelError, match="model_type"):
        parse_model_config(raw)


def test_unsupported_rope_scaling_is_refused():
    raw = real_config()
    raw["text_config"]["rope_parameters"]["rope_type"] = "yarn"
    with pytest.raises(UnsupportedModelError, match="rope_type"):
        parse_model_config(raw)


def test_malformed_json_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_model_config(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "qwen3_5_moe", ')
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_model_config(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(real_config()))
    assert load_model_config(tmp_path).layer_types[3] == FULL_ATTENTION
    assert load_model_config(tmp_path).layer_types[0] == LINEAR_ATTENTION
