"""W4A16 NVFP4 GEMV against "dequantize, then the plain matmul", on awkward sizes, outputs NaN-poisoned."""
import pytest
import torch

pytest.importorskip("triton")

from qwenlocal.engine.kernels.nvfp4_triton import nvfp4_gemv  # noqa: E402
from qwenlocal.engine.quant.formats import dequant_nvfp4, quantize_nvfp4  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("n, k", [(37, 48), (64, 512), (100, 2048 + 16), (1, 16)])
def test_nvfp4_gemv_matches_dequantized_matmul(n, k, monkeypatch):
    gen = torch.Generator().manual_seed(n * 1000 + k)
    w = torch.randn(n, k, generator=gen)
    # Subnormal E4M3 scales too (tiny blocks), and negative codes everywhere.
    w[0, :16] *= 1e-5
    packed, scale, scale2 = quantize_nvfp4(w)
    bits = scale.view(torch.uint8)
    assert (packed >> 4 >= 8).any()  # negative codes present
    if n * k > 16:  # the tiny block's scale is an E4M3 subnormal (exponent bits 0)
        assert ((bits & 0x78) == 0).any()
    x = torch.randn(k, generator=gen)
    ref = dequant_nvfp4(packed, scale, scale2) @ x
    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: real_empty(*a, **kw).fill_(float("nan")))
    out = nvfp4_gemv(x.to(DEVICE), packed.to(DEVICE), scale.to(DEVICE), scale2.to(DEVICE)).cpu()
    assert torch.isfinite(out).all()
    assert torch.allclose(out, ref, rtol=1e-4, atol=1e-4 * ref.abs().max().item())
