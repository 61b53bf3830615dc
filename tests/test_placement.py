"""The engine reports what it placed where (bytes), consistent with the geometry."""
from qwenlocal.engine import Engine


def test_resident_and_offloaded_placement(tiny_ckpt):
    resident = Engine.from_pretrained(tiny_ckpt, device="cpu")
    offloaded = Engine.from_pretrained(tiny_ckpt, device="cpu", options={"expert_slots": 20})
    cfg = resident.config
    row = 3 * cfg.moe.intermediate_size * cfg.hidden_size * 4  # fp32 expert: gate_up + down
    r, o = resident.placement(), offloaded.placement()
    assert r["experts_resident"] == cfg.num_layers * cfg.moe.num_experts * row and "host_expert_bank" not in r
    assert o["experts_resident"] == 0 and o["host_expert_bank"] == cfg.num_layers * cfg.moe.num_experts * row
    assert o["expert_slots"] == (20 + 1) * row  # + one scratch slot for masked copies
    assert o["prefill_stream_buffers"] == 2 * cfg.moe.num_experts * row
    assert r["dense_weights"] == o["dense_weights"] > 0
    kv_per_token = len(cfg.full_attention_layers) * 2 * cfg.attention.num_kv_heads * cfg.attention.head_dim * 4
    assert r["kv_cache_at_limit"] == kv_per_token * resident.max_context
    assert o["device_total"] == sum(v for k, v in o.items() if k not in ("device_total", "host_expert_bank"))
    assert resident.stats()["placement"] == r
