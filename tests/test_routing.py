"""Synthetic routing (engine/offload/routing.py): the trace generator, its device-side replayer, and the LRU
simulator that calibrates it, checked against the real ExpertSlotCache. CPU, a few seconds in all."""
import pytest
import torch

from qwenlocal.engine.config import parse_model_config
from qwenlocal.engine.errors import OptionError
from qwenlocal.engine.offload.bank import HostExpertBank
from qwenlocal.engine.offload.cache import ExpertSlotCache
from qwenlocal.engine.offload.routing import (
    PRESETS, RoutingSpec, RoutingTrace, generate_trace, lru_miss_counts, lru_misses_per_token)
from qwenlocal.engine.tiny import GEOMETRIES, config_dict

SMALL = dict(num_layers=6, num_experts=48, top_k=4)  # 288 experts; fast enough to run several traces


def hit_rate(slots=72, tokens=400, **spec):
    trace = generate_trace(RoutingSpec(**spec), tokens=tokens, **SMALL)
    return lru_misses_per_token(trace, slots, warmup_tokens=100).hit_rate


def test_trace_is_deterministic_by_seed():
    a = generate_trace(RoutingSpec(seed=5), tokens=50, **SMALL)
    assert a.dtype == torch.long and a.shape == (50, 6, 4)
    assert torch.equal(a, generate_trace(RoutingSpec(seed=5), tokens=50, **SMALL))
    assert not torch.equal(a, generate_trace(RoutingSpec(seed=6), tokens=50, **SMALL))
    # A shorter trace is a prefix of a longer one: the length does not change what is drawn.
    assert torch.equal(a[:20], generate_trace(RoutingSpec(seed=5), tokens=20, **SMALL))


@pytest.mark.parametrize("spec", [RoutingSpec(), RoutingSpec(skew=3.0, reuse=0.95, window=1),
                                  RoutingSpec(skew=0.0, reuse=0.0)])
def test_ids_are_distinct_and_in_range_per_token_and_layer(spec):
    trace = generate_trace(spec, tokens=300, num_layers=4, num_experts=10, top_k=8)  # k close to E: collisions likely
    assert int(trace.min()) >= 0 and int(trace.max()) < 10
    s = trace.sort(dim=-1).values
    assert bool((s[..., 1:] != s[..., :-1]).all())
    assert torch.equal(generate_trace(spec, tokens=1, num_layers=1, num_experts=8, top_k=8).sort(-1).values[0, 0],
                       torch.arange(8))  # k == E: every expert once


def test_skew_and_reuse_raise_the_hit_rate():
    uniform = hit_rate(skew=0.0, reuse=0.0)
    # Uniform independent routing: LRU holds a random 25% of the experts, so ~25% hits.
    assert 0.2 < uniform < 0.3
    skewed = hit_rate(skew=1.2, reuse=0.0)
    assert skewed > uniform + 0.1
    assert hit_rate(skew=1.2, reuse=0.6) > skewed + 0.1
    # A shorter window concentrates the re-draws on fewer recent ids: more hits at equal reuse.
    assert hit_rate(skew=0.0, reuse=0.6, window=2) > hit_rate(skew=0.0, reuse=0.6, window=32)


def small_cfg(experts, top_k, layers):
    raw = config_dict(GEOMETRIES["tiny"], 640, 1)
    raw["text_config"].update(num_experts=experts, num_experts_per_tok=top_k, num_hidden_layers=layers,
                              layer_types=["linear_attention"] * layers)
    return parse_model_config(raw)


@pytest.mark.parametrize("slots", [3, 10, 20])
def test_simulator_matches_the_slot_cache_step_by_step(slots):
    cfg = small_cfg(experts=12, top_k=3, layers=3)
    trace = generate_trace(RoutingSpec(seed=slots, skew=0.8, reuse=0.5, window=3), cfg.num_layers,
                           cfg.moe.num_experts, cfg.moe.top_k, tokens=100)
    cache = ExpertSlotCache(cfg, HostExpertBank(cfg, torch.float32, pin=False), slots, torch.device("cpu"))
    real = torch.empty(100, cfg.num_layers, dtype=torch.long)
    for t in range(100):  # 300 ensure steps, layers in order within a token, as the decode step does
        for layer in range(cfg.num_layers):
            _, plan = cache.ensure(layer, trace[t, layer][None])
            real[t, layer] = plan.count
    assert torch.equal(lru_miss_counts(trace, slots), real)
    assert int(real.sum()) > 0
    if slots > 3 * cfg.num_layers:  # room for more than one token's experts: reuse must give hits
        assert int(real.sum()) < real.numel() * 3
    res = lru_misses_per_token(trace, slots, warmup_tokens=0)
    assert res.misses_per_token == pytest.approx(int(cache.misses) / 100)
    assert res.hit_rate == pytest.approx(cache.counters()["hit_rate"])


def test_calibrated_preset_gives_about_28_misses_per_token_at_3164_slots():
    spec = RoutingSpec.from_value("calibrated-28")
    trace = generate_trace(spec, num_layers=40, num_experts=256, top_k=8, tokens=600)
    res = lru_misses_per_token(trace, 3164, warmup_tokens=200)  # the cache is warm after ~100 tokens
    assert 25 <= res.misses_per_token <= 31, res
    assert res.hit_rate == pytest.approx(1 - res.misses_per_token / 320)


def test_replayer_ids_advance_and_wrap_around_like_host_slicing():
    trace = generate_trace(RoutingSpec(seed=1), tokens=10, **SMALL)
    rt = RoutingTrace(trace, "cpu")
    expect = 0
    for n in (1, 3, 4, 5, 10, 23, 1, 7):  # crosses the end several times, once by more than the whole trace
        rows = [(expect + i) % 10 for i in range(n)]
        for layer in range(6):
            got = rt.ids(layer, n)
            assert got.shape == (n, 4) and got.dtype == torch.long
            assert torch.equal(got, trace[rows, layer])
        one = rt.one_token_ids()  # the fused decode step's gather: every layer's next row at once
        assert one.shape == (6, 1, 4) and all(torch.equal(one[layer], rt.ids(layer, 1)) for layer in range(6))
        rt.advance(n)
        expect = (expect + n) % 10
        assert int(rt.position) == expect
    big = rt.ids(2, 5000)  # beyond the precomputed offsets
    assert torch.equal(big, trace[[(expect + i) % 10 for i in range(5000)], 2])
    rt.reset()
    assert int(rt.position) == 0 and torch.equal(rt.ids(0, 2), trace[:2, 0])
    assert rt.nbytes >= trace.numel() * 8
    with pytest.raises(ValueError):
        rt.ids(0, 0)


def test_from_spec_generates_the_spec_length():
    rt = RoutingTrace.from_spec(RoutingSpec(seed=2, length=16), 3, 20, 2)
    assert (rt.length, rt.num_layers, rt.top_k) == (16, 3, 2)
    assert torch.equal(rt.ids(1, 16), generate_trace(RoutingSpec(seed=2), 3, 20, 2, tokens=16)[:, 1])


def test_spec_from_value_presets_dicts_and_errors():
    assert RoutingSpec.from_value(None) is None
    cal = RoutingSpec.from_value("calibrated-28")
    assert {k: getattr(cal, k) for k in PRESETS["calibrated-28"]} == PRESETS["calibrated-28"]
    assert cal == RoutingSpec() and "calibrated-28" in cal.describe() and "reuse=" in cal.describe()
    assert RoutingSpec.from_value(cal) is cal
    mixed = RoutingSpec.from_value({"preset": "calibrated-28", "seed": 4, "length": 100})
    assert (mixed.seed, mixed.length, mixed.reuse) == (4, 100, cal.reuse)
    custom = RoutingSpec.from_value({"seed": 1, "skew": 2, "reuse": 0.5, "window": 8})
    assert custom.skew == 2.0 and isinstance(custom.skew, float) and "custom" in custom.describe()
    assert RoutingSpec.from_value(custom.as_dict()) == custom
    for bad in ({"hit_rate": 0.85}, "calibrated-99", {"preset": "nope"}, 3, {"reuse": 1.0}, {"reuse": -0.1},
                {"skew": float("nan")}, {"skew": -1}, {"window": 0}, {"window": 2.5}, {"seed": -1},
                {"seed": True}, {"length": 0}, {"length": 1 << 20}, {"reuse": "0.5"}):
        with pytest.raises(OptionError, match="routing"):
            RoutingSpec.from_value(bad)


@pytest.mark.gpu
def test_replayer_is_sync_free_and_replays_in_a_cuda_graph():
    trace = generate_trace(RoutingSpec(seed=3), tokens=7, **SMALL)
    rt = RoutingTrace(trace, "cuda")
    out = torch.empty(6, 1, 4, dtype=torch.long, device="cuda")

    def step():
        for layer in range(6):
            out[layer].copy_(rt.ids(layer, 1))
        rt.advance(1)

    torch.cuda.set_sync_debug_mode("error")  # any host sync in ids/advance raises
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(out[:, 0].cpu(), trace[0])
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # warm-up on the side stream, as capture requires
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    rt.reset()
    for t in range(16):  # wraps around twice
        graph.replay()
        assert torch.equal(out[:, 0].cpu(), trace[t % 7])
