"""Triton MoE kernels against the torch reference, on awkward sizes, outputs NaN-poisoned before the run.

On a CPU machine the kernels run in Triton's interpreter (set in conftest), on a GPU natively."""
import pytest
import torch

triton = pytest.importorskip("triton")

from qwenlocal.engine.kernels.moe_triton import align_pairs, moe_decode, moe_grouped  # noqa: E402
from qwenlocal.engine.model.moe import route, routed_experts_reference  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# (experts, top_k, hidden, intermediate, tokens): odd, non-power-of-two, one expert-heavy, single token.
SHAPES = [(13, 5, 72, 20, 37), (16, 4, 64, 32, 50), (7, 3, 40, 24, 1), (9, 2, 136, 48, 70)]


def make(shape, dtype, seed=0):
    e, k, h, i, t = shape
    gen = torch.Generator().manual_seed(seed)
    gate_up = (torch.randn(e, 2 * i, h, generator=gen) / h ** 0.5).to(DEVICE, dtype)
    down = (torch.randn(e, h, i, generator=gen) / i ** 0.5).to(DEVICE, dtype)
    x = torch.randn(t, h, generator=gen).to(DEVICE, dtype)
    weights, ids = route(x, (torch.randn(e, h, generator=gen) * 2).to(DEVICE, dtype), k)
    return x, weights, ids, gate_up, down


def tolerance(dtype):
    return 1e-5 if dtype == torch.float32 else 2e-2


DTYPES = [torch.float32] + ([torch.bfloat16] if DEVICE == "cuda" else [])


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_grouped_prefill_matches_reference(shape, dtype, nan_empty):
    x, w, ids, gu, dn = make(shape, dtype)
    ref = routed_experts_reference(x.float(), w.float(), ids, gu.float(), dn.float())
    out = moe_grouped(x, w, ids, gu, dn, block_m=16)
    assert torch.isfinite(out).all()
    err = ((out.float() - ref).norm() / ref.norm()).item()
    assert err <= tolerance(dtype), err


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_matches_reference(shape, dtype, nan_empty):
    x, w, ids, gu, dn = make(shape, dtype, seed=1)
    for row in range(min(3, x.shape[0])):
        sl = slice(row, row + 1)
        ref = routed_experts_reference(x[sl].float(), w[sl].float(), ids[sl], gu.float(), dn.float())
        out = moe_decode(x[sl], w[sl], ids[sl], gu, dn)
        assert torch.isfinite(out).all()
        assert ((out.float() - ref).norm() / ref.norm()).item() <= tolerance(dtype)


def test_decode_is_deterministic():
    x, w, ids, gu, dn = make(SHAPES[0], torch.float32, seed=2)
    a = moe_decode(x[:1], w[:1], ids[:1], gu, dn)
    b = moe_decode(x[:1], w[:1], ids[:1], gu, dn)
    assert torch.equal(a, b)


@pytest.mark.parametrize("t, k, e, block", [(37, 5, 13, 16), (1, 3, 7, 16), (100, 8, 256, 32)])
def test_align_pairs_covers_each_pair_once_in_single_expert_blocks(t, k, e, block):
    ids = torch.stack([torch.randperm(e)[:k] for _ in range(t)]).to(DEVICE)
    pair_ids, block_expert = align_pairs(ids, e, block)
    pairs = t * k
    real = pair_ids[pair_ids < pairs]
    assert sorted(real.tolist()) == list(range(pairs))
    flat = ids.reshape(-1)
    for b in range(block_expert.shape[0]):
        members = pair_ids[b * block: (b + 1) * block]
        members = members[members < pairs]
        if len(members):
            assert (flat[members] == block_expert[b]).all()
        else:
            assert block_expert[b] == e or members.numel() == 0


@pytest.mark.parametrize("dtype", DTYPES)
def test_large_blocks_take_64_rows_from_192_pairs_an_expert(dtype, monkeypatch, nan_empty):
    """moe_grouped(large_blocks=True): 64-row blocks where the experts average >= 192 pairs (4 experts, top-2,
    400 tokens: 200), the given block_m below; the result at the reference either way."""
    from qwenlocal.engine.kernels import moe_triton

    seen = []
    real = moe_triton.align_pairs
    monkeypatch.setattr(moe_triton, "align_pairs", lambda ids, e, block_m: seen.append(block_m) or real(ids, e, block_m))
    for tokens, want in ((400, 64), (100, 16)):
        x, w, ids, gu, dn = make((4, 2, 40, 24, tokens), dtype, seed=tokens)
        ref = routed_experts_reference(x.float(), w.float(), ids, gu.float(), dn.float())
        out = moe_grouped(x, w, ids, gu, dn, block_m=16, large_blocks=True)
        assert seen[-1] == want
        assert ((out.float() - ref).norm() / ref.norm()).item() <= tolerance(dtype)
