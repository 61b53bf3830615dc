"""The tensor-core NVFP4 GEMV (kernels/nvfp4_gemv_mma.py, the LM head's) against gemv_multi's fp32 reference on
awkward sizes (rows not a multiple of the program's 64, K of one short step and of several), the tiny block
scales included: within fp16 rounding of x and of the scaled weights. Deterministic (the same bytes twice).
Interpreter on the CPU, natively on a GPU."""
import pytest
import torch

pytest.importorskip("triton")

from qwenlocal.engine.kernels import gemv_multi as gm  # noqa: E402
from qwenlocal.engine.kernels.nvfp4_gemv_mma import fits, nvfp4_gemv_mma  # noqa: E402
from test_kernels_gemv_multi import DEVICE, abs_bound, make_part  # noqa: E402


@pytest.mark.parametrize("n, k", [(200, 512), (64, 32), (130, 2048)])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_the_tensor_core_gemv_is_at_the_fp16_level_of_the_reference(n, k, out_dtype, nan_empty):
    gen = torch.Generator().manual_seed(n + k)
    part = make_part("nvfp4", n, k, gen)
    x = (torch.randn(1, k, generator=gen) * 3).to(torch.bfloat16).to(DEVICE)
    ref = gm.gemv_multi_reference(x, [part], torch.float32).cpu()
    out = nvfp4_gemv_mma(x, part, out_dtype)
    assert out.shape == (1, n) and out.dtype == out_dtype and torch.isfinite(out).all()
    # x to fp16 (2^-11 relative), the scaled codes to fp16 where small, bf16 output rounding: against |W| |x|
    bound = abs_bound(x, [part]) * 2e-3 + ref.abs() * (4e-3 if out_dtype == torch.bfloat16 else 0)
    assert ((out.float().cpu() - ref).abs() <= bound + 1e-6).all()
    assert torch.equal(nvfp4_gemv_mma(x, part, out_dtype), out)


def test_bad_calls_are_refused():
    part = make_part("nvfp4", 16, 96, torch.Generator().manual_seed(1))
    x = torch.randn(1, 96).to(DEVICE)
    assert not fits(96) and not fits(48) and fits(2048) and fits(32)
    with pytest.raises(ValueError, match="multiple of"):
        nvfp4_gemv_mma(x, part)
    good = make_part("nvfp4", 16, 256, torch.Generator().manual_seed(2))
    with pytest.raises(ValueError, match="values"):
        nvfp4_gemv_mma(x, good)
    with pytest.raises(ValueError, match="out_dtype"):
        nvfp4_gemv_mma(torch.randn(1, 256).to(DEVICE), good, torch.float16)
