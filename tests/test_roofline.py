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
