"""kernels/nvfp4_int_dot.py: x to int16 blocks byte for byte, the integer word dots exactly, and the GEMV at
fp32 rounding of its torch twin and within the x quantization of the dequantized product; awkward sizes."""
import pytest
import torch

pytest.importorskip("triton")

from qwenlocal.engine.kernels.nvfp4_int_dot import (gemv_int, gemv_int_reference,  # noqa: E402
                                                     quantize_x16, quantize_x16_reference)
from qwenlocal.engine.quant.formats import dequant_nvfp4  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def nvfp4(n: int, k: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    packed = torch.randint(0, 256, (n, k // 2), generator=gen, dtype=torch.uint8)
    scales = (torch.rand(n, k // 16, generator=gen) * 7.75 + 0.25).to(torch.float8_e4m3fn).view(torch.uint8)
    return packed.to(DEVICE), scales.to(DEVICE), torch.tensor(3e-3, device=DEVICE)


def activations(k: int, seed: int, dtype=torch.bfloat16):
    gen = torch.Generator().manual_seed(100 + seed)
    x = torch.randn(k, generator=gen) * torch.exp(torch.randn(k, generator=gen))  # blocks of very unequal size
    if k >= 32:
        x[:16] = 0.0  # an all-zero block: scale 0, codes 0
        x[16] = 5e-3  # a block whose largest value is small
    return x.to(dtype).to(DEVICE)


@pytest.mark.parametrize("k", [16, 48, 2048])
def test_x_quantization_is_the_references_bytes(k):
    x = activations(k, k)
    pairs, scales = quantize_x16(x)
    q, ref_scales = quantize_x16_reference(x.cpu())
    got = torch.stack([(pairs.cpu() << 16) >> 16, pairs.cpu() >> 16], dim=1).reshape(-1).long()
    assert torch.equal(scales.cpu(), ref_scales)
    if DEVICE == "cuda":  # ptxas may fuse x * inv + 0.5 into one FFMA (one rounding): a unit where it crosses .5
        assert int((got - q).abs().max()) <= 1
    else:
        assert torch.equal(got, q)
    assert int(q.abs().max()) == 32767  # each non-zero block's largest |x| takes the full range
    assert k < 32 or (torch.all(q[:16] == 0) and scales[0] == 0)
    err = (q.reshape(-1, 16).float() * ref_scales[:, None] - x.cpu().float().reshape(-1, 16)).abs()
    assert torch.all(err <= ref_scales[:, None] * (0.5 + 1e-3))  # half a step (and an ulp of x * inv) at most


@pytest.mark.parametrize("n,k,block_n", [(37, 48, 16), (64, 2048, 16), (5, 208, 4), (130, 512, 32)])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_gemv_int_matches_its_torch_twin_and_the_dequantized_product(n, k, block_n, out_dtype):
    packed, scales, g = nvfp4(n, k, n + k)
    x = activations(k, n)
    out = gemv_int(packed, scales, g, x, out_dtype, block_n=block_n)
    assert out.dtype == out_dtype and not torch.isnan(out.float()).any()
    twin = gemv_int_reference(packed.cpu(), scales.cpu(), g.cpu(), x.cpu())
    exact = dequant_nvfp4(packed.cpu(), scales.cpu().view(torch.float8_e4m3fn), g.cpu(), torch.float32) @ x.cpu().float()
    big = exact.abs().max()
    if out_dtype == torch.float32:  # only the fp32 sum's order differs from the twin
        assert ((out.cpu() - twin).abs().max() / big) < 1e-6
    else:
        assert ((out.cpu().float() - twin).abs().max() / big) < 4e-3  # bf16 rounding of the result
    # x's int16 blocks: each term off by at most half a step of its block
    assert ((twin - exact).abs().max() / big) < 2e-4


def test_bad_calls_are_refused():
    packed, scales, g = nvfp4(8, 32, 0)
    with pytest.raises(ValueError, match="multiple of 16"):
        quantize_x16(torch.zeros(20, device=DEVICE))
    with pytest.raises(ValueError, match="packed uint8"):
        gemv_int(packed, scales, g, torch.zeros(48, device=DEVICE))
    with pytest.raises(ValueError, match="out_dtype"):
        gemv_int(packed, scales, g, torch.zeros(32, device=DEVICE), torch.float16)


@pytest.mark.skipif(DEVICE != "cuda", reason="the PTX path needs a CUDA GPU (run the GPU tier on the lent machine)")
def test_the_ptx_words_give_the_plain_paths_bytes():
    packed, scales, g = nvfp4(300, 2048, 7)
    x = activations(2048, 7)
    assert torch.equal(gemv_int(packed, scales, g, x, decode="asm"), gemv_int(packed, scales, g, x, decode="plain"))


@pytest.mark.parametrize("k,dtype", [(2048, torch.bfloat16), (96, torch.float32), (160, torch.bfloat16)])
def test_the_router_launch_quantizes_its_normed_row_as_quantize_x16(k, dtype):
    """router_norm(quantize=True): its programs store the normed row's int16 blocks too, quantize_x16's bytes of
    the normed row it stores; the rest of its results as without."""
    from qwenlocal.engine.kernels.router_norm import router_norm

    gen = torch.Generator().manual_seed(k)
    x, delta = (torch.randn(1, k, generator=gen).to(dtype).to(DEVICE) for _ in range(2))
    norm_w = (0.1 * torch.randn(k, generator=gen)).to(dtype).to(DEVICE)
    router_w = (torch.randn(37, k, generator=gen) / k ** 0.5).to(dtype).to(DEVICE)
    gate = (torch.randn(1, k, generator=gen) / k ** 0.5).to(dtype).to(DEVICE)
    new_x, normed, logits, (pairs, scales) = router_norm(x, delta, norm_w, 1e-6, router_w, gate, quantize=True)
    plain = router_norm(x, delta, norm_w, 1e-6, router_w, gate)
    assert all(torch.equal(a, b) for a, b in zip((new_x, normed, logits), plain))
    ref_pairs, ref_scales = quantize_x16(normed.reshape(-1))
    assert torch.equal(scales, ref_scales)
    if DEVICE == "cuda":  # two kernels: ptxas may fuse x * inv + 0.5 in one and not the other (a unit at .5)
        ints = [torch.stack([(p << 16) >> 16, p >> 16], dim=1).long() for p in (pairs, ref_pairs)]
        assert int((ints[0] - ints[1]).abs().max()) <= 1
    else:
        assert torch.equal(pairs, ref_pairs)
