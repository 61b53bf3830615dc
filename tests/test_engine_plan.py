"""The GPU engine follows the machine plan: offload with the plan's slot count when the experts do not fit
the VRAM budget, the plan's context when none was asked; user values stay."""
import pytest
import torch

from qwenlocal.engine.api import apply_plan
from qwenlocal.engine.errors import ResourceError
from qwenlocal.engine.options import EngineOptions
from qwenlocal.engine.plan import ModelFacts, resolve_plan
from qwenlocal.engine.probe import fake
from qwenlocal.engine.synthetic import synthetic_config

CFG = synthetic_config("synthetic:qwen3.6-35b-a3b", 0)
FACTS = ModelFacts.from_config(CFG, expert_dtype_bytes=torch.finfo(torch.bfloat16).bits / 8)


def test_sixteen_gib_card_offloads_with_the_plans_slots():
    opts = EngineOptions(vram_budget="16GiB")
    plan = resolve_plan(fake.wsl2_rtx5070ti(), FACTS, opts, device="cuda")
    assert not plan.all_resident and 0 < plan.slots < 10240
    applied = apply_plan(opts, plan)
    assert applied.expert_slots == plan.slots and applied.max_context == plan.context_tokens


def test_everything_resident_on_a_big_gpu_keeps_experts_on_the_device():
    plan = resolve_plan(fake.h200(), FACTS, EngineOptions(), device="cuda")
    applied = apply_plan(EngineOptions(), plan)
    assert plan.all_resident and applied.expert_slots is None


def test_user_values_win():
    opts = EngineOptions(vram_budget="16GiB", expert_slots=900, max_context=8192)
    plan = resolve_plan(fake.wsl2_rtx5070ti(), FACTS, opts, device="cuda")
    applied = apply_plan(opts, plan)
    assert (applied.expert_slots, applied.max_context) == (900, 8192)


def test_tiny_test_models_stay_resident_under_the_plan(tiny_ckpt, odd_ckpt, small_ckpt):
    from qwenlocal.engine.config import load_model_config

    for ckpt in (tiny_ckpt, odd_ckpt, small_ckpt):
        cfg = load_model_config(ckpt)
        facts = ModelFacts.from_config(cfg, expert_dtype_bytes=2.0)
        plan = resolve_plan(fake.h200(), facts, EngineOptions(), device="cuda")
        applied = apply_plan(EngineOptions(), plan)
        assert plan.all_resident and applied.expert_slots is None
        assert applied.max_context == plan.context_tokens <= cfg.max_position_embeddings


def test_machine_plan_reads_the_cached_probe(monkeypatch, tmp_path):
    """The engine's own path: get_profile() gives a ProbeResult; the plan needs its profile (a GPU engine
    failed at load with AttributeError when the result itself was passed)."""
    from qwenlocal.engine import api
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
    plan = api.machine_plan(CFG, EngineOptions(vram_budget="16GiB"), torch.bfloat16)
    assert calls == ["quick"] and not plan.all_resident and plan.slots > 0
    assert plan.vram.fixed + plan.vram.slots <= plan.vram.budget
    # 16 GiB leaves more than 3 layers of BF16 slots: prefill's stream buffers borrow slots, no VRAM of their own.
    assert plan.slots >= 3 * 256 and plan.vram.stream == 0
    tight = api.machine_plan(CFG, EngineOptions(vram_budget="12GiB"), torch.bfloat16)
    assert 3 * 256 <= tight.slots < plan.slots and tight.vram.stream == 0
    # Below three layers of slots the stream buffers would need VRAM of their own, and that does not fit.
    with pytest.raises(ResourceError, match="two prefill stream buffers"):
        api.machine_plan(CFG, EngineOptions(vram_budget="11GiB"), torch.bfloat16)
