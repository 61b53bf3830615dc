"""Prefill's residual add + RMSNorms in one Triton launch each (options.prefill_norms=fused, the GPU default), in
Triton's interpreter on the CPU: the kernel runs for every norm of every (layer, chunk) step, the logits stay
at the torch norms' fp32 level, and layer-major prefill stays byte-equal to chunked prefill with it."""
import dataclasses

import pytest
import torch

pytest.importorskip("triton")

from qwenlocal.engine import Engine  # noqa: E402
from qwenlocal.engine.kernels import decode_norm  # noqa: E402

CHUNK = 16


def _engine(ckpt, fused: bool, **opts):
    eng = Engine.from_pretrained(ckpt, device="cpu", options={"prefill_chunk": CHUNK, **opts})
    if fused:  # the CPU resolves prefill_norms to torch (no GPU); the test drives the Triton kernel anyway
        kernels = dataclasses.replace(eng.model.kernels, fused_norms=True)
        eng.model.kernels = kernels
        for layer in eng.model.layers:
            layer.kernels = kernels
    return eng


def _prefill(eng, ids):
    state = eng.runner.new_state()
    logits = eng.runner.prefill(state, ids)
    return logits, state


def test_fused_norms_run_every_norm_and_stay_at_the_torch_level(tiny_ckpt, monkeypatch):
    calls = []
    real = decode_norm.add_rms_norm

    def counted(*args, **kwargs):
        calls.append(args[1] is not None)
        return real(*args, **kwargs)

    monkeypatch.setattr(decode_norm, "add_rms_norm", counted)
    ids = torch.randint(0, 500, (40,), generator=torch.Generator().manual_seed(8))  # 3 chunks, the last partial
    ref, _ = _prefill(_engine(tiny_ckpt, False), ids)
    assert not calls
    eng = _engine(tiny_ckpt, True)
    got, _ = _prefill(eng, ids)
    layers = len(eng.model.layers)
    assert calls.count(False) == calls.count(True) == 3 * layers  # the input norm, then add + post norm
    assert torch.isfinite(got).all()
    assert ((got - ref).abs().max() / ref.abs().max()).item() < 1e-5  # fp32: an ulp of rsqrt apart at most


def test_layer_major_is_byte_equal_to_chunked_with_fused_norms(tiny_ckpt):
    ids = torch.randint(0, 500, (40,), generator=torch.Generator().manual_seed(9))
    base = {"expert_slots": 20}
    a, sa = _prefill(_engine(tiny_ckpt, True, prefill_mode="chunked", **base), ids)
    b, sb = _prefill(_engine(tiny_ckpt, True, prefill_mode="layer-major", **base), ids)
    assert torch.equal(a, b)
    assert all(torch.equal(sa.recurrent[i], sb.recurrent[i]) for i in sa.recurrent)
    assert all(torch.equal(sa.kv[i].k[:40], sb.kv[i].k[:40]) for i in sa.kv)
