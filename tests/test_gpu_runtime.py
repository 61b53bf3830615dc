"""GPU tier of the runtime: fla GDN and FlashInfer attention against their torch references, and the
CUDA-graph decode byte-equal to eager decode over >= 180 steps."""
import pytest
import torch

from qwenlocal.engine.kernels.gdn_torch import gdn_core_torch

pytestmark = pytest.mark.gpu


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


# Each (head size, dtype) is a fresh fla autotune of ~40 s on a new machine: the two sizes the models use.
@pytest.mark.parametrize("t", [1, 63, 300])
@pytest.mark.parametrize("hk, hv, d, dtype", [(2, 4, 64, torch.bfloat16), (3, 6, 128, torch.bfloat16)])
def test_fla_gdn_matches_torch_reference(t, hk, hv, d, dtype):
    from qwenlocal.engine.kernels.gdn_fla import gdn_core_fla

    gen = torch.Generator(device="cuda").manual_seed(t)
    q = torch.randn(t, hk, d, device="cuda", generator=gen).to(dtype)
    k = torch.randn(t, hk, d, device="cuda", generator=gen).to(dtype)
    v = torch.randn(t, hv, d, device="cuda", generator=gen).to(dtype)
    g = -torch.rand(t, hv, device="cuda", generator=gen) * 2
    beta = torch.rand(t, hv, device="cuda", generator=gen).to(dtype).float()
    state = torch.randn(hv, d, d, device="cuda", generator=gen) * 0.1
    for decode in ([False, True] if t <= 63 else [False]):
        ref_o, ref_s = gdn_core_torch(q, k, v, g, beta, state.clone(), decode)
        out, new_state = gdn_core_fla(q, k, v, g, beta, state.clone(), decode)
        tol = 1e-2 if dtype == torch.float32 else 3e-2
        assert rel(out.float(), ref_o) <= tol and rel(new_state, ref_s) <= tol


@pytest.mark.parametrize("head_dim", [64, 256])
@pytest.mark.parametrize("prefix, t", [(0, 37), (50, 29), (1000, 1), (77, 1)])
def test_flashinfer_matches_sdpa(head_dim, prefix, t):
    from qwenlocal.engine.model.attention_backends import FlashInferAttention, SdpaAttention

    hq, hkv, dtype = 16, 2, torch.bfloat16
    gen = torch.Generator(device="cuda").manual_seed(prefix + t)
    fi = FlashInferAttention(hq, hkv, head_dim, dtype, torch.device("cuda"), max_len=2048)
    sd = SdpaAttention(hq, hkv, head_dim)
    fkv, skv = fi.new_kv(dtype, torch.device("cuda"), 2048), sd.new_kv(dtype, torch.device("cuda"), 2048)
    decode = t == 1 and prefix > 0
    for start, n in ([(0, prefix)] if prefix else []) + [(prefix, t)]:
        q = torch.randn(n, hq, head_dim, device="cuda", generator=gen).to(dtype)
        k = torch.randn(n, hkv, head_dim, device="cuda", generator=gen).to(dtype)
        v = torch.randn(n, hkv, head_dim, device="cuda", generator=gen).to(dtype)
        pos = torch.arange(start, start + n, device="cuda")
        is_decode = decode and start == prefix
        fi.prepare(start, n, is_decode)
        out = fi.attend(fkv, q, k, v, pos, start, is_decode)
        ref = sd.attend(skv, q, k, v, pos, start, is_decode)
    assert rel(out.float(), ref.float()) <= 2e-2


def test_small_model_takes_the_fast_kernels(small_ckpt):
    from qwenlocal.engine import Engine

    eng = Engine.from_pretrained(small_ckpt, device="cuda", dtype=torch.bfloat16)
    plan = eng.plan
    assert (plan["attention"]["value"], plan["gdn"]["value"], plan["moe"]["value"]) == ("flashinfer", "fla", "triton")
    assert plan["cuda_graphs"]["value"] is True


@pytest.mark.parametrize("prefill", [64, 131])
def test_cuda_graph_decode_is_byte_equal_to_eager(small_ckpt, prefill):
    from qwenlocal.engine import Engine

    graphs = Engine.from_pretrained(small_ckpt, device="cuda", dtype=torch.bfloat16, options={"prefill_chunk": 50})
    eager = Engine.from_pretrained(small_ckpt, device="cuda", dtype=torch.bfloat16,
                                   options={"prefill_chunk": 50, "cuda_graphs": False})
    assert graphs.runner.use_graph and not eager.runner.use_graph
    ids = torch.randint(0, graphs.tokenizer.vocab_size, (prefill + 190,), generator=torch.Generator().manual_seed(9))
    a, b = graphs.score(ids, prefill=prefill), eager.score(ids, prefill=prefill)
    assert torch.isfinite(a).all()
    # Routes must change along the way, or the test would not exercise different experts per step.
    assert torch.equal(a, b)
    # A second sequence on the same graph (state reset in place) gives the same bytes again.
    assert torch.equal(graphs.score(ids, prefill=prefill), a)
    # The captured graph's memory is measured and reported with the placement; eager decode has none.
    assert graphs.placement()["decode_graph"] > 0 and "decode_graph" not in eager.placement()
