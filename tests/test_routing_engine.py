"""Synthetic routing wired into the engine: ids come from the trace (weights from the router), advanced once
per forward, with the same rows for chunked and layer-major prefill and for resident and offloaded experts."""
import pytest
import torch

from qwenlocal.engine import Engine
from qwenlocal.engine.errors import OptionError

ROUTING = {"preset": "calibrated-28", "seed": 3}


@pytest.fixture(scope="module")
def engines(tiny_ckpt):
    def make(**extra):
        return Engine.from_pretrained(tiny_ckpt, device="cpu", options={"prefill_chunk": 64, "routing": ROUTING,
                                                                        **extra})
    return {"resident": make(), "chunked": make(expert_slots=20, prefill_mode="chunked"),
            "layer-major": make(expert_slots=20, prefill_mode="layer-major"), "plain": Engine.from_pretrained(
                tiny_ckpt, device="cpu", options={"prefill_chunk": 64})}


def test_trace_routing_is_the_same_on_every_path(engines):
    ids = torch.randint(0, 600, (64 * 3 + 9 + 180,), generator=torch.Generator().manual_seed(5))
    ref = engines["resident"].score(ids, prefill=64 * 3 + 9)
    for name in ("chunked", "layer-major"):
        assert torch.equal(engines[name].score(ids, prefill=64 * 3 + 9), ref), name
    # The trace really replaced the router's choices.
    assert not torch.equal(engines["plain"].score(ids, prefill=64 * 3 + 9), ref)
    assert engines["chunked"].stats()["expert_hits"] > 0
    assert "calibrated-28" in engines["resident"].plan["routing"]["value"]


def test_bad_routing_spec_fails_before_loading(tiny_ckpt):
    with pytest.raises(OptionError):
        Engine.from_pretrained(tiny_ckpt, device="cpu", options={"routing": {"hit_rate": 0.85}})
