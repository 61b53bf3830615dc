"""The fused step's NVFP4 experts' gate/up as integer dot products (nvfp4_int_experts.ON, the default; x in int16
blocks quantized by the router's launch), on the CPU in Triton's interpreter: counted where it runs, the logits
at x's quantization level of the float gate/up's, the same argmax, the prompt's logits untouched; the shared
expert apart gives the serial launch's bytes."""
import pytest
import torch

pytest.importorskip("triton")

from qwenlocal.engine.kernels import nvfp4_experts_parts, nvfp4_int_experts, router_norm  # noqa: E402
from test_decode_fused import _engine, quantized_ckpt  # noqa: E402,F401 (the fixture, by name)


def test_the_experts_gate_up_as_integer_dots_keeps_the_logits(quantized_ckpt, monkeypatch):  # noqa: F811
    ids = torch.randint(0, 600, (24 + 2,), generator=torch.Generator().manual_seed(16))
    monkeypatch.setattr(nvfp4_int_experts, "ON", False)  # the float gate/up ("no-guint")
    off = _engine(quantized_ckpt, True).score(ids, prefill=24)
    monkeypatch.setattr(nvfp4_int_experts, "ON", True)
    calls, quantized = [], []
    real, real_router = nvfp4_int_experts.expert_gate_up_int, router_norm.router_norm
    monkeypatch.setattr(nvfp4_int_experts, "expert_gate_up_int", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(router_norm, "router_norm",
                        lambda *a, **k: quantized.append(k.get("quantize", False)) or real_router(*a, **k))
    eng = _engine(quantized_ckpt, True)
    on = eng.score(ids, prefill=24)
    layers = len(eng.model.layers)
    assert len(calls) == 2 * layers  # every layer of both decode steps
    assert len(quantized) == 2 * layers and all(quantized)  # x quantized in the router's launch, no launch of its own
    assert torch.equal(on[:24], off[:24])
    assert ((on[24:] - off[24:]).abs().max() / off[24:].abs().max()) < 1e-3
    assert (on[24:].argmax(-1) == off[24:].argmax(-1)).all()
    apart = _engine(quantized_ckpt, True, "copy-side").score(ids, prefill=24)
    assert torch.equal(apart, on)


@pytest.mark.parametrize("opts", [{}, {"routing": {"seed": 5, "length": 7}}])
def test_the_gate_up_launch_routing_itself_gives_the_default_bytes_without_route_topk(quantized_ckpt, monkeypatch,
                                                                                    opts):  # noqa: F811
    """nvfp4_int_experts.ROUTE (resident experts): the integer gate/up's programs find their experts from the
    router's logits and fill route_topk's outputs for the down launch: the step's logits byte for byte, under a
    benchmark's routing trace too, and route_topk never runs in a decode step; offloaded experts (slots to
    ensure) keep route_topk. bf16, as on a GPU (16-bit logits). The group path (GROUPS) too, routing itself."""
    from qwenlocal.engine.model import moe_fused

    ids = torch.randint(0, 600, (24 + 2,), generator=torch.Generator().manual_seed(8))
    monkeypatch.setattr(nvfp4_int_experts, "ROUTE", False)  # route_topk's launch ("no-routeint")
    default = _engine(quantized_ckpt, True, dtype=torch.bfloat16, **opts).score(ids, prefill=24)
    monkeypatch.setattr(nvfp4_int_experts, "ROUTE", True)
    # the down launch's programs route themselves too, before their PDL wait (nvfp4_experts_parts.ROUTE)
    monkeypatch.setattr(nvfp4_experts_parts, "ROUTE", True)
    down_launches, down_kernel = [], nvfp4_experts_parts.expert_down_parts_kernel

    class DownSpy:  # the launch's EARLY_ROUTE, then the real launch
        def __getitem__(self, grid):
            return lambda *a, **k: down_launches.append(k.get("EARLY_ROUTE", 0)) or down_kernel[grid](*a, **k)

    monkeypatch.setattr(nvfp4_experts_parts, "expert_down_parts_kernel", DownSpy())
    eng = _engine(quantized_ckpt, True, dtype=torch.bfloat16, **opts)
    assert moe_fused.routes_itself(eng.model.layers[0].moe, torch.empty(1, dtype=torch.bfloat16))
    routed, real = [], moe_fused.route_topk
    monkeypatch.setattr(moe_fused, "route_topk", lambda *a, **k: routed.append(1) or real(*a, **k))
    assert torch.equal(eng.score(ids, prefill=24), default)
    assert not routed
    assert down_launches == [2 if opts else 1] * (2 * len(eng.model.layers))  # the trace's rows: 2
    if not opts:  # nvfp4_int_experts.GROUPS (a thread's 16-code groups its own): every launch of both steps takes
        # it, routing itself; the same integers and, in the interpreter, the same order of the fp32 sums, so the
        # default's bytes (on a GPU the tile's sums may go in another order: the GPU tier's bf16-level gate)
        monkeypatch.setattr(nvfp4_int_experts, "GROUPS", True)
        launches, kernel = [], nvfp4_int_experts.expert_gate_up_int_kernel

        class Spy:  # the launch's GROUPS and ROUTE, then the real launch
            def __getitem__(self, grid):
                return lambda *a, **k: launches.append((k["GROUPS"], k.get("ROUTE", 0))) or kernel[grid](*a, **k)

        monkeypatch.setattr(nvfp4_int_experts, "expert_gate_up_int_kernel", Spy())
        grouped = _engine(quantized_ckpt, True, dtype=torch.bfloat16)
        assert torch.equal(grouped.score(ids, prefill=24), default)
        assert launches == [(True, 1)] * (2 * len(grouped.model.layers))
        monkeypatch.setattr(nvfp4_int_experts, "GROUPS", False)
        monkeypatch.setattr(nvfp4_int_experts, "expert_gate_up_int_kernel", kernel)
    if not opts:  # offloaded: the slots are ensured from route_topk's ids, the same bytes
        slotted = _engine(quantized_ckpt, True, dtype=torch.bfloat16, expert_slots=12)
        assert not moe_fused.routes_itself(slotted.model.layers[0].moe, torch.empty(1, dtype=torch.bfloat16))
        down_launches.clear()
        assert torch.equal(slotted.score(ids, prefill=24), default)
        assert routed and down_launches and not any(down_launches)  # slots: the down launch reads the ids


@pytest.mark.parametrize("split", ["off", "copy-side"])
def test_the_ensure_routing_first_gives_the_default_bytes_without_route_topk(quantized_ckpt, monkeypatch,
                                                                             split):  # noqa: F811
    """slot_ensure.ROUTE (experts offloaded to slots, the one-launch ensure, which a CPU engine does not pick by
    itself and is given here): the ensure's launch does route_topk's work first, and the step's logits are the
    default's byte for byte, serial and with the shared expert apart; route_topk never runs in a decode step. bf16
    (16-bit logits)."""
    from qwenlocal.engine.kernels import slot_ensure
    from qwenlocal.engine.model import moe_fused

    def engine():
        eng = _engine(quantized_ckpt, True, split, dtype=torch.bfloat16, expert_slots=12)
        cache = eng.model.cache
        cache._fused = slot_ensure.FusedEnsure(len(eng.model.layers), cache.top_k, cache.num_slots, cache.device)
        return eng

    ids = torch.randint(0, 600, (24 + 2,), generator=torch.Generator().manual_seed(24))
    default = engine().score(ids, prefill=24)
    monkeypatch.setattr(slot_ensure, "ROUTE", True)
    eng = engine()
    assert moe_fused.routes_in_ensure(eng.model.layers[0].moe, torch.empty(1, dtype=torch.bfloat16))
    routed, real = [], moe_fused.route_topk
    monkeypatch.setattr(moe_fused, "route_topk", lambda *a, **k: routed.append(1) or real(*a, **k))
    assert torch.equal(eng.score(ids, prefill=24), default)
    assert not routed and int(eng.model.cache.misses) > 0



def test_the_lm_head_on_the_integer_tensor_cores_keeps_the_logits(quantized_ckpt, monkeypatch):  # noqa: F811
    """nvfp4_mma.LM_HEAD: the NVFP4 head through gemv_mma in every decode step (x quantized by its own launch),
    the logits at x's quantization level of gemv_multi's, the same argmax, the prompt's logits untouched."""
    from qwenlocal.engine.kernels import nvfp4_mma

    ids = torch.randint(0, 600, (24 + 2,), generator=torch.Generator().manual_seed(21))
    off = _engine(quantized_ckpt, True).score(ids, prefill=24)
    monkeypatch.setattr(nvfp4_mma, "LM_HEAD", True)
    calls, real = [], nvfp4_mma.gemv_mma
    monkeypatch.setattr(nvfp4_mma, "gemv_mma", lambda *a, **k: calls.append(a[0].shape) or real(*a, **k))
    eng = _engine(quantized_ckpt, True)
    head = getattr(eng.model.lm_head_w, "tensors", eng.model.lm_head_w)
    assert isinstance(head, dict) and "weight_scale_2" in head  # the checkpoint's NVFP4 head
    on = eng.score(ids, prefill=24)
    assert calls == [head["weight"].shape] * 2  # both decode steps, nothing else
    assert torch.equal(on[:24], off[:24])
    assert ((on[24:] - off[24:]).abs().max() / off[24:].abs().max()) < 1e-3
    assert (on[24:].argmax(-1) == off[24:].argmax(-1)).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_experts_gate_up_on_the_integer_tensor_cores_keeps_the_logits(quantized_ckpt, monkeypatch, dtype):
    """nvfp4_mma_experts.ON: every layer's gate/up of both decode steps through expert_gate_up_mma, x as its high /
    low bytes from the router's launch (routing itself where the experts are resident, bf16), the logits at x's
    quantization level of the integer kernel's, the same argmax, the prompt's logits untouched; the shared expert
    apart gives the serial launch's bytes."""
    from qwenlocal.engine.kernels import nvfp4_mma_experts

    ids = torch.randint(0, 600, (24 + 2,), generator=torch.Generator().manual_seed(22))
    off = _engine(quantized_ckpt, True, dtype=dtype).score(ids, prefill=24)
    monkeypatch.setattr(nvfp4_mma_experts, "ON", True)
    calls, quantized = [], []
    real, real_router = nvfp4_mma_experts.expert_gate_up_mma, router_norm.router_norm
    monkeypatch.setattr(nvfp4_mma_experts, "expert_gate_up_mma",
                        lambda *a, **k: calls.append(k.get("route") is not None) or real(*a, **k))
    monkeypatch.setattr(router_norm, "router_norm",
                        lambda *a, **k: quantized.append(k.get("quantize", False)) or real_router(*a, **k))
    eng = _engine(quantized_ckpt, True, dtype=dtype)
    on = eng.score(ids, prefill=24)
    layers = len(eng.model.layers)
    assert calls == [dtype == torch.bfloat16] * (2 * layers)  # 16-bit logits: the programs route themselves
    assert quantized == ["hilo"] * (2 * layers)
    assert torch.equal(on[:24], off[:24])
    assert ((on[24:] - off[24:]).abs().max() / off[24:].abs().max()) < 1e-3
    assert (on[24:].argmax(-1) == off[24:].argmax(-1)).all()
    if dtype == torch.float32:
        apart = _engine(quantized_ckpt, True, "copy-side", dtype=dtype).score(ids, prefill=24)
        assert torch.equal(apart, on)
