"""Roofline arithmetic against the byte counts of shared/reference/model-formats.md section 2."""
from qwenlocal.engine.roofline import decode_step_cost, dense_params_per_layer, expert_params
from qwenlocal.engine.synthetic import synthetic_config

CFG = synthetic_config("synthetic:qwen3.6-35b-a3b", 0)


def test_per_layer_bytes_match_the_reference():
    attn, gdn, _ = dense_params_per_layer(CFG)
    assert attn * 2 == 54_525_952  # attention projections per layer, BF16
    assert gdn * 2 == 67_436_544  # GDN params per layer, BF16 (A_log, dt_bias, norm are a rounding error)
    assert expert_params(CFG) * 2 == 6_291_456  # one routed expert


def test_decode_step_bytes():
    cost = decode_step_cost(CFG, context=16384)
    assert cost.expert_bytes == 40 * 8 * 6_291_456
    assert cost.kv_bytes == 16384 * 20_480  # 10 layers x K,V x 2 heads x 256 x 2 B per token
    assert cost.state_bytes == 30 * 2 * (32 * 128 * 128 * 4 + 8192 * 3 * 2)


def test_model_step_bytes_counts_the_built_model_in_its_stored_bytes(tiny_ckpt):
    """Every dense weight once (the embedding: one row), top_k experts per layer, KV and states: against the
    loader's own placement count, independent of the walk over the model's objects."""
    from qwenlocal.engine import Engine
    from qwenlocal.engine.roofline import model_step_bytes

    eng = Engine.from_pretrained(tiny_ckpt, device="cpu")
    m, cfg = eng.model, eng.config
    got = model_step_bytes(m, context=100)
    embed = m.embed.numel() * m.embed.element_size()
    tied = m.lm_head_w.data_ptr() == m.embed.data_ptr()
    assert got["dense"] == eng._placed["dense_weights"] - (0 if tied else embed) + m.embed.shape[1] * m.embed.element_size()
    per_expert = eng._placed["experts_resident"] // (cfg.num_layers * cfg.moe.num_experts)
    assert got["experts"] == cfg.num_layers * cfg.moe.top_k * per_expert
    a = cfg.attention
    assert got["kv"] == len(cfg.full_attention_layers) * 100 * 2 * a.num_kv_heads * a.head_dim * 4
    assert got["total"] == got["dense"] + got["experts"] + got["kv"] + got["state"]
