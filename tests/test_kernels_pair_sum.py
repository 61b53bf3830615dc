"""pair_sum (the grouped MoE's in-order sum of each token's k expert rows, one launch) against the torch code
it replaced, byte for byte: awkward H (masked tails, several column blocks), k = 1 and 8, every output dtype,
values whose fp32 sum depends on the order (so another order would show), NaN-poisoned outputs."""
import pytest
import torch

pytest.importorskip("triton")

from qwenlocal.engine.kernels.pair_sum import pair_sum, pair_sum_reference  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("tokens, k, h", [(5, 8, 2048 + 37), (3, 1, 100), (1, 3, 17)])
def test_pair_sum_is_the_torch_loop_byte_for_byte(tokens, k, h, dtype, nan_empty):
    gen = torch.Generator().manual_seed(tokens * 100 + k)
    # magnitudes over 2^24: fp32 addition is not associative here, so the order of the adds shows in the bytes
    pairs = (torch.randn(tokens * k, h, generator=gen) * 2.0 ** torch.randint(-20, 20, (tokens * k, h),
                                                                             generator=gen)).to(DEVICE)
    got = pair_sum(pairs, tokens, k, dtype)
    ref = pair_sum_reference(pairs, tokens, k, dtype)
    assert got.dtype == dtype and got.shape == (tokens, h)
    assert torch.equal(got.cpu(), ref.cpu())
    if k == 8:  # the order matters for these values: a reversed sum gives other bytes
        rev = pairs.view(tokens, k, h).flip(1).reshape(tokens * k, h)
        assert not torch.equal(pair_sum_reference(rev, tokens, k, torch.float32).cpu(),
                               pair_sum_reference(pairs, tokens, k, torch.float32).cpu())


def test_pair_sum_refuses_what_it_cannot_sum():
    with pytest.raises(ValueError, match="fp32"):
        pair_sum(torch.zeros(6, 4, dtype=torch.bfloat16, device=DEVICE), 3, 2, torch.bfloat16)
    with pytest.raises(ValueError, match="fp32"):
        pair_sum(torch.zeros(5, 4, device=DEVICE), 3, 2, torch.bfloat16)
    with pytest.raises(TypeError):
        pair_sum(torch.zeros(6, 4, device=DEVICE), 3, 2, torch.int32)
    assert pair_sum(torch.zeros(0, 4, device=DEVICE), 0, 8, torch.bfloat16).shape == (0, 4)
