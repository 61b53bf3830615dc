"""The projection + residual add + RMSNorm in one launch (kernels/gemv_norm.py) against the two launches it
replaces (gemv, then add_rms_norm): the projection and the new residual byte for byte, the normed row byte for
byte in the interpreter (one order of sums) and within an ulp on a GPU (the norm's sums laid out by the GEMV's
warps); dense / FP8 (both conversions) / NVFP4 weights, awkward sizes; twice through one counter; a negative
control (a norm run before every program has arrived gives other bytes). The fused step with the switch on:
tests/test_decode_fused.py. Interpreter on the CPU, natively on a GPU."""
import pytest
import torch

pytest.importorskip("triton")

from qwenlocal.engine.kernels import gemv_norm  # noqa: E402
from qwenlocal.engine.kernels.decode_norm import add_rms_norm  # noqa: E402
from qwenlocal.engine.kernels.gemv_multi import gemv, launch_config  # noqa: E402
from qwenlocal.engine.kernels.launch import new_counter  # noqa: E402
from test_kernels_gemv_multi import make_part  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
EPS = 1e-6


def _inputs(fmt, n, k, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    weight = make_part(fmt, n, k, gen, dense_dtype=dtype)
    a = torch.randn(1, k, generator=gen).to(dtype).to(DEVICE)
    x = (torch.randn(1, n, generator=gen) * 2).to(dtype).to(DEVICE)
    norm_w = (0.3 * torch.randn(n, generator=gen)).to(dtype).to(DEVICE)
    return a, weight, x, norm_w


def _reference(a, weight, x, norm_w, fp8_cvt):
    return add_rms_norm(x, gemv(a, weight, fp8_cvt=fp8_cvt), norm_w, EPS)


def _assert_bytes(got, ref, dtype):
    assert torch.equal(got[0], ref[0])  # the residual: its addend's bytes plus x, rounded once
    if DEVICE == "cpu":
        assert torch.equal(got[1], ref[1])
    else:  # rstd's sum may go in another order: an ulp of the output dtype
        ulp = 2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -22
        assert ((got[1].float() - ref[1].float()).abs() <= ulp * ref[1].float().abs() + 1e-6).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fmt, n, k, fp8_cvt", [("dense", 37, 48, False), ("fp8", 100, 64, False),
                                                 ("fp8", 2048, 512, True), ("nvfp4", 160, 96, False)])
def test_gemv_add_rms_norm_gives_the_bytes_of_gemv_then_add_rms_norm(fmt, n, k, fp8_cvt, dtype):
    a, weight, x, norm_w = _inputs(fmt, n, k, dtype, seed=n + k)
    ref = _reference(a, weight, x, norm_w, fp8_cvt)
    counter = new_counter(a.device)
    for _ in range(2):  # the counter is back at 0: the second launch's norm runs as the first's did
        got = gemv_norm.gemv_add_rms_norm(a, weight, x, norm_w, EPS, counter, fp8_cvt=fp8_cvt)
        _assert_bytes(got, ref, dtype)
        assert int(counter) == 0


@pytest.mark.interpreter_order
def test_a_norm_before_every_program_arrived_gives_other_bytes(nan_empty):
    """Negative control: a counter that says all but one program are in makes the first to arrive run the norm
    over a projection the others have not written: the new residual differs (what the count guards). The
    buffers start NaN-poisoned (nan_empty): a fresh allocation that reused the reference's memory held its values,
    and the early norm then read the right numbers by chance (seen once in CI)."""
    a, weight, x, norm_w = _inputs("dense", 2048, 64, torch.float32, seed=3)
    proj = gemv(a, weight)  # kept alive: the launch's own buffer cannot be this one's memory, reused
    ref = add_rms_norm(x, proj, norm_w, EPS)
    tiles = -(-2048 // launch_config("dense", 2048, 64, 4, a.device).block_n)
    assert tiles > 1
    early = torch.full((1,), tiles - 1, dtype=torch.int32, device=DEVICE)
    got = gemv_norm.gemv_add_rms_norm(a, weight, x, norm_w, EPS, early)
    assert not torch.equal(got[0], ref[0])


def test_bad_calls_are_refused():
    a, weight, x, norm_w = _inputs("dense", 16, 32, torch.float32, seed=1)
    counter = new_counter(a.device)
    with pytest.raises(ValueError, match="residual"):
        gemv_norm.gemv_add_rms_norm(a, weight, x.half(), norm_w, EPS, counter)
    with pytest.raises(ValueError, match="features"):
        gemv_norm.gemv_add_rms_norm(a, weight, x[:, :8].contiguous(), norm_w, EPS, counter)
    with pytest.raises(ValueError, match="counter"):
        gemv_norm.gemv_add_rms_norm(a, weight, x, norm_w, EPS, counter.long())
