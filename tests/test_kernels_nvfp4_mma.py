"""kernels/nvfp4_mma.py: x to int8 high / low bytes that add up to its int16 blocks, the tile's sums at the fp32
rounding of its torch twin and within the x quantization of the dequantized product on awkward sizes (Triton's
interpreter on the CPU, compiled on the GPU tier), the PTX path's bytes equal to the plain path's (GPU), and its
sm_90 code compiled here: the MMAs, one PTX block a lane, no spill."""
import pytest
import torch

pytest.importorskip("triton")

from qwenlocal.engine.kernels import nvfp4_mma  # noqa: E402
from qwenlocal.engine.kernels.nvfp4_hilo import QMAX, quantize_hilo, quantize_hilo_reference  # noqa: E402
from qwenlocal.engine.kernels.nvfp4_mma import gemv_mma, gemv_mma_reference  # noqa: E402
from qwenlocal.engine.quant.formats import dequant_nvfp4  # noqa: E402
from sass_support import sm90_json  # noqa: E402
from test_kernels_nvfp4_int_dot import DEVICE, activations, nvfp4  # noqa: E402

GPU = pytest.mark.skipif(DEVICE != "cuda", reason="the PTX path runs on a GPU (the GPU tier's)")


def _q(hl: torch.Tensor, k: int) -> torch.Tensor:
    return hl[:k].long().cpu() * 256 + hl[k:].long().cpu()


@pytest.mark.parametrize("k", [16, 48, 2048])
def test_x_splits_into_bytes_that_add_up_to_the_references_blocks(k):
    x = activations(k, k)
    hl, scales = quantize_hilo(x)
    q, ref_scales = quantize_hilo_reference(x.cpu())
    assert torch.equal(scales.cpu(), ref_scales)
    got = _q(hl, k)
    if DEVICE == "cuda":  # ptxas may fuse x * inv + 0.5 into one FFMA (one rounding): a unit where it crosses .5
        assert int((got - q).abs().max()) <= 1
    else:
        assert torch.equal(got, q)
    assert int(got.abs().max()) <= QMAX  # so that the high byte (q + 128) >> 8 is an int8
    assert bool((hl[k:].long() >= -128).all()) and bool((hl[:k].long() <= 127).all())


@pytest.mark.parametrize("n,k", [(37, 256), (16, 64), (40, 128), (33, 192), (1, 320)])
def test_the_tile_is_its_twin_and_the_dequantized_product(n, k):
    packed, scales, g = nvfp4(n, k, n + k)
    x = activations(k, n)
    out = gemv_mma(packed, scales, g, x)
    ref = gemv_mma_reference(packed.cpu(), scales.cpu(), g.cpu(), x.cpu())
    assert out.shape == (n,) and out.dtype == torch.float32
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max()))
    exact = dequant_nvfp4(packed.cpu(), scales.cpu().view(torch.float8_e4m3fn), g.cpu()).float() @ x.cpu().float()
    assert float((out.cpu() - exact).abs().max()) < 2e-4 * float(exact.abs().max())  # x's int16 blocks


@pytest.mark.parametrize("n,k", [(37, 256), (16, 1024)])
def test_the_quads_contiguous_layout_is_the_same_sums_in_another_order(n, k):
    """nvfp4_mma.PAIRS: lane t's groups 2t, 2t + 1, 8 + 2t, 9 + 2t, ... instead of its quarter: the same integer
    group dots, the fp32 sums in another order."""
    packed, scales, g = nvfp4(n, k, 3)
    x = activations(k, 3)
    quarters = gemv_mma(packed, scales, g, x, pairs=False)
    pairs = gemv_mma(packed, scales, g, x, pairs=True)
    ref = gemv_mma_reference(packed.cpu(), scales.cpu(), g.cpu(), x.cpu())
    assert float((pairs - quarters).abs().max()) <= 1e-6 * float(ref.abs().max())
    torch.testing.assert_close(pairs.cpu(), ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max()))
    assert nvfp4_mma.pairs_fit(k) and not nvfp4_mma.pairs_fit(192)


@pytest.mark.parametrize("n,k,warps", [(37, 256, 2), (40, 512, 4)])
@pytest.mark.parametrize("pairs", [False, True])
def test_warps_each_a_part_of_k_are_the_same_sums(n, k, warps, pairs):
    packed, scales, g = nvfp4(n, k, 4)
    x = activations(k, 4)
    ref = gemv_mma_reference(packed.cpu(), scales.cpu(), g.cpu(), x.cpu())
    out = gemv_mma(packed, scales, g, x, warps=warps, pairs=pairs)
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max()))
    with pytest.raises(ValueError, match="multiple of 64"):
        gemv_mma(packed, scales, g, x, warps=8 * warps)  # parts of K too small for whole 64-code blocks


def test_bf16_out_rounds_the_fp32_sums_to_nearest():
    packed, scales, g = nvfp4(24, 128, 5)
    x = activations(128, 5)
    assert torch.equal(gemv_mma(packed, scales, g, x, torch.bfloat16),
                       gemv_mma(packed, scales, g, x).to(torch.bfloat16))


def test_bad_shapes_are_refused_before_any_launch():
    packed, scales, g = nvfp4(16, 96, 1)  # K 96: not whole 64-code blocks of a lane's quarter
    with pytest.raises(ValueError, match="multiple of 64"):
        gemv_mma(packed, scales, g, activations(96, 1))
    packed, scales, g = nvfp4(16, 128, 1)
    with pytest.raises(ValueError, match="scales"):
        gemv_mma(packed, scales[:, :4], g, activations(128, 1))
    with pytest.raises(ValueError, match="quantize_hilo"):
        gemv_mma(packed, scales, g, activations(128, 1), xq=quantize_hilo(activations(64, 1)))


@GPU
@pytest.mark.parametrize("n,k,pairs,warps", [(4096 + 13, 2048, False, 1), (2048, 512, False, 1), (64, 64, False, 1),
                                             (4096 + 13, 2048, True, 1), (2048, 512, True, 1),
                                             (4096 + 13, 2048, False, 4), (4096 + 13, 2048, True, 2)])
def test_the_ptx_path_gives_the_plain_paths_bytes(n, k, pairs, warps):
    """The MMA tile against the same sums through tl.load and integer arithmetic: the same integers and the same
    fp32 order, so the same bytes (a wrong fragment layout, table or sign gives other integers)."""
    packed, scales, g = nvfp4(n, k, 7)
    x = activations(k, 7)
    xq = quantize_hilo(x)
    asm = gemv_mma(packed, scales, g, x, xq=xq, decode="asm", pairs=pairs, warps=warps)
    plain = gemv_mma(packed, scales, g, x, xq=xq, decode="plain", pairs=pairs, warps=warps)
    assert torch.equal(asm, plain)
    ref = gemv_mma_reference(packed.cpu(), scales.cpu(), g.cpu(), x.cpu())
    torch.testing.assert_close(asm.cpu(), ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max()))


_COMPILE = r"""
import json, sys
from sass_nvfp4_mma import count
print(json.dumps([count(k, None, pairs) for k in (2048, 512) for pairs in (False, True)]))
"""


def test_sm90_code_is_two_mmas_a_block_one_ptx_block_a_lane_and_no_spill(tmp_path):
    for c in sm90_json(_COMPILE, tmp_path):
        assert c["mma"] == 2 * (c["K"] // 32)  # A+ and A- a 32-code block of the lane's quarter
        assert c["stack"] == "0"
        # a [32] tensor of one warp at one element a thread: each PTX block runs once a lane
        assert c["layouts"] and all("sizePerThread = [1]" in lay and "threadsPerWarp = [32]" in lay
                                    for lay in c["layouts"]), c["layouts"]
        assert c["per_code"] < 2.2, c  # gemv_multi's NVFP4 LM head: 5.8, the integer dots 3.0-3.8


def test_the_zero_operand_is_made_outside_a_capture():
    assert nvfp4_mma.zeros(torch.device(DEVICE)).abs().sum() == 0


def test_every_steps_x_loads_stay_inside_the_zero_operand():
    """The lanes without x's bytes load their B operand from nvfp4_mma.zeros: every x load of every step's PTX
    ($6, 16 bytes a v4 load) must end inside ZERO_BYTES. (PAIRS reads two runs 128 bytes apart: at 64 zero bytes
    it read past them, and its GPU results were wrong.)"""
    import re

    for name in ("STEP_PTX_1", "STEP_PTX_2", "STEP_PTX_4", "STEP_PTX_PAIRS"):
        ptx = getattr(nvfp4_mma, name).value
        ends = [int(off or 0) + 4 * len(regs.split(","))
                for regs, off in re.findall(r"ld\.global[.\w]*\s+\{([^}]*)\},\s*\[\$6(?:\+(\d+))?\]", ptx)]
        assert ends, name
        assert max(ends) <= nvfp4_mma.ZERO_BYTES, (name, max(ends))
    assert max(ends) == 160  # PAIRS' furthest load: the check reads what it should
