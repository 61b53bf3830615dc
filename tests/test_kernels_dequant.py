"""One-pass dequantization kernels against quant.formats' torch references, byte for byte: FP8 (W8A16
prefill) for every E4M3 code (NaN patterns excepted), NVFP4 (W4A16 prefill of the dense linears) for every E2M1
code and E4M3 block scale; odd sizes, fp32 and bf16 (fp16 too on a GPU). Interpreter on the CPU, natively on a
GPU."""
import pytest
import torch

pytest.importorskip("triton")

from qwenlocal.engine.kernels.fp8_triton import fp8_dequant  # noqa: E402
from qwenlocal.engine.kernels.nvfp4_triton import nvfp4_dequant  # noqa: E402
from qwenlocal.engine.quant.formats import dequant_fp8, dequant_nvfp4  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.bfloat16] + ([torch.float16] if DEVICE == "cuda" else [])


def every_code(rows: int, cols: int) -> torch.Tensor:
    codes = torch.arange(256, dtype=torch.uint8)
    codes = codes[(codes & 127) != 127]  # E4M3's NaN patterns never appear in a quantized weight
    return codes.repeat(rows * cols // codes.numel() + 1)[: rows * cols].reshape(rows, cols).view(torch.float8_e4m3fn)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, cols, scale", [(6, 127, 0.0123), (37, 4100, 3.7e-3), (1, 254, 1.0), (9, 16, 2.5e-5)])
def test_fp8_dequant_is_byte_equal_to_the_reference(rows, cols, scale, dtype):
    w = every_code(rows, cols).to(DEVICE)
    s = torch.tensor(scale, device=DEVICE)
    out = fp8_dequant(w, s, dtype)
    assert out.dtype == dtype and out.shape == (rows, cols)
    assert torch.equal(out, dequant_fp8(w, s, dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, cols", [(5, 48), (37, 2064), (1, 16)])
def test_nvfp4_dequant_is_byte_equal_to_the_reference(rows, cols, dtype):
    """Every E2M1 code in both nibbles, every non-NaN E4M3 block scale (subnormals included)."""
    gen = torch.Generator().manual_seed(rows * cols)
    packed = torch.randint(0, 256, (rows, cols // 2), generator=gen, dtype=torch.int32).to(torch.uint8)
    packed.view(-1)[: min(256, packed.numel())] = torch.arange(min(256, packed.numel()), dtype=torch.uint8)
    scale = every_code(rows, cols // 16)
    scale2 = torch.tensor(3.1e-4)
    packed, scale, scale2 = packed.to(DEVICE), scale.to(DEVICE), scale2.to(DEVICE)
    out = nvfp4_dequant(packed, scale, scale2, dtype)
    assert out.dtype == dtype and out.shape == (rows, cols)
    assert torch.equal(out, dequant_nvfp4(packed, scale, scale2, dtype))
