"""The GPU engine follows the machine plan: offload with the plan's slot count when the experts do not fit
the VRAM budget, the plan's context when none was asked; user values stay (all through resolve)."""
import pytest
import torch

from qwenlocal.engine.engine_config import Software
from qwenlocal.engine.errors import ResourceError
from qwenlocal.engine.memory import ModelInfo
from qwenlocal.engine.options import EngineOptions
from qwenlocal.engine.plan import ModelFacts, resolve_plan
from qwenlocal.engine.probe import fake
from qwenlocal.engine.resolve import resolve
from qwenlocal.engine.synthetic import synthetic_config

CFG = synthetic_config("synthetic:qwen3.6-35b-a3b", 0)
FACTS = ModelFacts.from_config(CFG, expert_dtype_bytes=torch.finfo(torch.bfloat16).bits / 8)
INFO = ModelInfo.from_config(CFG, "synthetic")
SW = Software(triton=True, flashinfer=True, fla=True)


def test_model_info_sizes_are_the_plans_facts():
    assert INFO.facts("bfloat16", False, False) == FACTS.__class__(**{**FACTS.__dict__, "name": "synthetic"})


def test_sixteen_gib_card_offloads_with_the_plans_slots():
    opts = EngineOptions(vram_budget="16GiB")
    plan = resolve_plan(fake.wsl2_rtx5070ti(), FACTS, opts, device="cuda")
    assert not plan.all_resident and 0 < plan.slots < 10240
    config = resolve(opts, INFO, fake.wsl2_rtx5070ti(), "cuda", SW)
    assert config.slots == plan.slots and config.max_context == plan.context_tokens


def test_everything_resident_on_a_big_gpu_keeps_experts_on_the_device():
    plan = resolve_plan(fake.h200(), FACTS, EngineOptions(), device="cuda")
    config = resolve(EngineOptions(), INFO, fake.h200(), "cuda", SW)
    assert plan.all_resident and config.slots is None and config.bank == "resident"


def test_user_values_win():
    opts = EngineOptions(vram_budget="16GiB", expert_slots=900, max_context=8192)
    config = resolve(opts, INFO, fake.wsl2_rtx5070ti(), "cuda", SW)
    assert (config.slots, config.max_context) == (900, 8192)
    assert {"slots", "max_context", "vram_budget"} <= config.overridden


def test_tiny_test_models_stay_resident_under_the_plan(tiny_ckpt, odd_ckpt, small_ckpt):
    from qwenlocal.engine.config import load_model_config

    for ckpt in (tiny_ckpt, odd_ckpt, small_ckpt):
        cfg = load_model_config(ckpt)
        facts = ModelFacts.from_config(cfg, expert_dtype_bytes=2.0)
        plan = resolve_plan(fake.h200(), facts, EngineOptions(), device="cuda")
        config = resolve(EngineOptions(), ModelInfo.from_config(cfg), fake.h200(), "cuda", SW)
        assert plan.all_resident and config.slots is None
        assert config.max_context == plan.context_tokens <= cfg.max_position_embeddings


def test_the_gpu_engine_plans_from_the_cached_probe(monkeypatch, tmp_path):
    """The engine's own path: get_profile() gives a ProbeResult; the plan needs its profile (a GPU engine
    failed at load with AttributeError when the result itself was passed)."""
    from qwenlocal.engine import choices
    from qwenlocal.engine.probe import cache
    from qwenlocal.engine.probe.measure import GpuIdentity

    calls, real_get_profile = [], cache.get_profile

    def measure(depth, index):
        calls.append(depth)
        return fake.h200()

    def fake_get_profile(**kw):
        return real_get_profile(measure=measure, identify=lambda index: GpuIdentity("GPU-fake-h200", "580"), version="test",
                                 refresh_volatile=lambda p, index: p, directory=tmp_path)

    monkeypatch.setattr(cache, "get_profile", fake_get_profile)
    profile = choices.hardware_profile(torch.device("cuda"))
    assert choices.hardware_profile(torch.device("cpu")) is None
    plan = resolve(EngineOptions(vram_budget="16GiB"), INFO, profile, "cuda", SW)
    assert calls == ["quick"] and plan.offloaded and plan.slots > 0
    assert plan.vram.fixed + plan.vram.slots <= plan.vram.budget
    # 16 GiB leaves more than 3 layers of BF16 slots: prefill's stream buffers borrow slots, no VRAM of their own.
    assert plan.slots >= 3 * 256 and plan.vram.stream == 0 and plan.stream_buffers == "borrowed"
    tight = resolve(EngineOptions(vram_budget="12GiB"), INFO, profile, "cuda", SW)
    assert 3 * 256 <= tight.slots < plan.slots and tight.vram.stream == 0
    # Below three layers of slots the stream buffers would need VRAM of their own, and that does not fit.
    with pytest.raises(ResourceError, match="two prefill stream buffers"):
        resolve(EngineOptions(vram_budget="11GiB"), INFO, profile, "cuda", SW)
