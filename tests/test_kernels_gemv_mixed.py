"""Linears of two storage formats in one launch (kernels/gemv_mixed.py) against gemv_multi of each format:
the first format's rows byte for byte, the second's byte for byte in the interpreter (one order of sums) and
within an ulp on a GPU (laid out by the launch's warps); FP8 / NVFP4 / dense pairs, one or two parts a side,
awkward sizes; the refusals; the fused step with the switch on: tests/test_decode_fused.py. Interpreter on the CPU, natively on a GPU."""
import pytest
import torch

pytest.importorskip("triton")

from qwenlocal.engine.kernels import gemv_mixed  # noqa: E402
from qwenlocal.engine.kernels.gemv_multi import gemv_multi  # noqa: E402
from test_kernels_gemv_multi import make_part  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("fmt_a, ns_a, fmt_b, ns_b, k", [("fp8", (37, 5), "dense", (3, 3), 160),
                                                          ("nvfp4", (20,), "dense", (7,), 96),
                                                          ("dense", (9,), "fp8", (33, 2), 48),
                                                          ("fp8", (64,), "nvfp4", (16, 5), 2048)])
def test_two_formats_give_the_bytes_of_gemv_multi_of_each(fmt_a, ns_a, fmt_b, ns_b, k, x_dtype, nan_empty):
    gen = torch.Generator().manual_seed(k + sum(ns_a) + sum(ns_b))
    parts_a = [make_part(fmt_a, n, k, gen, dense_dtype=x_dtype) for n in ns_a]
    parts_b = [make_part(fmt_b, n, k, gen, dense_dtype=x_dtype) for n in ns_b]
    x = torch.randn(1, k, generator=gen).to(x_dtype).to(DEVICE)
    got = gemv_mixed.gemv_two_formats(x, parts_a, parts_b)
    ref_a, ref_b = gemv_multi(x, parts_a), gemv_multi(x, parts_b)
    assert got.shape == (1, sum(ns_a) + sum(ns_b)) and got.dtype == x_dtype and torch.isfinite(got).all()
    assert torch.equal(got[:, :sum(ns_a)], ref_a)
    b = got[:, sum(ns_a):]
    if DEVICE == "cpu":
        assert torch.equal(b, ref_b)
    else:
        ulp = 2.0 ** -7 if x_dtype == torch.bfloat16 else 2.0 ** -20
        assert ((b.float() - ref_b.float()).abs() <= 2 * ulp * ref_b.float().abs() + 1e-5).all()


@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32])
def test_the_second_format_in_the_fewest_tiles_keeps_the_bytes(x_dtype, monkeypatch, nan_empty):
    """FEWEST_B_TILES: in_proj_b + a (2 x 32 bf16 rows of 2048) in 2 x 4 tiles of 8 rows, not 2 x 16 of 2 (so the
    real in_proj is 776 programs, two H200 waves, not 800); the FP8 side byte for byte, the dense side
    gemv_multi's bytes in the interpreter (an ulp on a GPU, laid out by other warps)."""
    assert gemv_mixed.fewest_tiles_rows("dense", [32, 32], 2048, 2) == 8
    assert gemv_mixed.fewest_tiles_rows("dense", [3, 3], 160, 4) == 4
    gen = torch.Generator().manual_seed(8)
    parts_a = [make_part("fp8", n, 2048, gen) for n in (40, 24)]
    parts_b = [make_part("dense", 32, 2048, gen, dense_dtype=x_dtype) for _ in range(2)]
    x = torch.randn(1, 2048, generator=gen).to(x_dtype).to(DEVICE)
    monkeypatch.setattr(gemv_mixed, "FEWEST_B_TILES", True)
    grids, real = [], gemv_mixed.gemv_mixed_kernel

    class Spy:  # the launch's grid
        def __getitem__(self, grid):
            grids.append(grid)
            return real[grid]
    monkeypatch.setattr(gemv_mixed, "gemv_mixed_kernel", Spy())
    got = gemv_mixed.gemv_two_formats(x, parts_a, parts_b)
    cfg_a = gemv_mixed.gm.launch_config("fp8", 64, 2048, 2, x.device)
    rows_b = gemv_mixed.fewest_tiles_rows("dense", [32, 32], 2048, x.element_size())  # 8 bf16 rows, 4 fp32
    assert grids == [(-(-40 // cfg_a.block_n) - (-24 // cfg_a.block_n) + 2 * 32 // rows_b,)]
    assert torch.isfinite(got).all() and torch.equal(got[:, :64], gemv_multi(x, parts_a))
    ref_b = gemv_multi(x, parts_b)
    if DEVICE == "cpu":
        assert torch.equal(got[:, 64:], ref_b)
    else:
        ulp = 2.0 ** -7 if x_dtype == torch.bfloat16 else 2.0 ** -20
        assert ((got[:, 64:].float() - ref_b.float()).abs() <= 2 * ulp * ref_b.float().abs() + 1e-5).all()


def test_bad_calls_are_refused():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(1, 32, generator=gen).to(DEVICE)
    dense, fp8 = make_part("dense", 4, 32, gen, torch.float32), make_part("fp8", 4, 32, gen)
    with pytest.raises(ValueError, match="one format a call"):
        gemv_mixed.gemv_two_formats(x, [dense], [dense])
    with pytest.raises(ValueError, match="1 to 2"):
        gemv_mixed.gemv_two_formats(x, [fp8, fp8, fp8], [dense])
    with pytest.raises(ValueError, match="K = 48"):
        gemv_mixed.gemv_two_formats(x, [fp8], [make_part("dense", 4, 48, gen, torch.float32)])
