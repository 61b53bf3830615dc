"""GPU tier: the engine on FlashInfer's FA2 prefill, what every consumer card runs (FA3 is sm_90 only, so the H200's
own engine never takes FA2): layer-major prefill == chunked prefill byte for byte, and decode after it; and a short
turn after a long context (FA2 splits the KV there) at the bf16 level of the FA3 engine's logits."""
import pytest
import torch

from qwenlocal.engine import Engine
from qwenlocal.engine.model.attention_backends import FlashInferAttention

pytestmark = pytest.mark.gpu
MODEL = "synthetic:small-nvfp4"


def engine(mode: str, backend: str, chunk: int = 128) -> Engine:
    eng = Engine.from_pretrained(MODEL, device="cuda", dtype=torch.bfloat16, options={
        "prefill_chunk": chunk, "prefill_mode": mode, "expert_slots": 40})
    if backend != "auto":  # the same engine with the prefill backend a consumer card gets
        a = eng.model.cfg.attention
        fi = FlashInferAttention(a.num_heads, a.num_kv_heads, a.head_dim, torch.bfloat16, torch.device("cuda"),
                                 eng.max_context, backend=backend)
        object.__setattr__(eng.model.kernels, "attention", fi)
        for layer in eng.model.layers:
            if layer.is_attention:
                layer.mixer.backend = fi
    return eng


def test_fa2_layer_major_is_byte_equal_to_chunked_and_decodes_alike():
    ids = torch.randint(0, 600, (5 * 128 + 37,), generator=torch.Generator().manual_seed(5)).cuda()
    runs = {}
    for mode in ("chunked", "layer-major"):
        eng = engine(mode, "fa2")
        assert eng.model.kernels.attention.prefill._backend == "fa2"
        state = eng.runner.new_state()
        logits = eng.runner.prefill(state, ids, all_logits=True)
        steps = [eng.runner.decode(state, torch.tensor([t], device="cuda")) for t in (3, 17, 250, 9)]
        torch.cuda.synchronize()
        runs[mode] = (logits, state, steps)
    (a, sa, da), (b, sb, db) = runs["chunked"], runs["layer-major"]
    assert torch.equal(a, b)
    assert all(torch.equal(sa.kv[i].k, sb.kv[i].k) and torch.equal(sa.kv[i].v, sb.kv[i].v) for i in sa.kv)
    assert all(torch.equal(sa.recurrent[i], sb.recurrent[i]) for i in sa.recurrent)
    assert all(torch.equal(x, y) for x, y in zip(da, db))


def test_a_short_turn_after_a_long_context_on_fa2_is_at_the_bf16_level_of_fa3():
    long = torch.randint(0, 600, (3000,), generator=torch.Generator().manual_seed(6)).cuda()
    turn = torch.randint(0, 600, (40,), generator=torch.Generator().manual_seed(7)).cuda()
    out = {}
    for backend in ("auto", "fa2"):
        eng = engine("chunked", backend, chunk=1024)
        state = eng.runner.new_state()
        eng.runner.prefill(state, long)
        out[backend] = eng.runner.prefill(state, turn, all_logits=True)  # 40 rows at a 3K KV: FA2 splits it
    ref, got = out["auto"], out["fa2"]
    assert torch.isfinite(got).all()
    assert ((got - ref).norm() / ref.norm()).item() < 2e-2
