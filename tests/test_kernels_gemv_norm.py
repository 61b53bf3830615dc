"""The projection + residual add + RMSNorm in one launch (kernels/gemv_norm.py) against the two launches it
replaces (gemv, then add_rms_norm): the projection and the new residual byte for byte, the normed row byte for
byte in the interpreter (one order of sums) and within an ulp on a GPU (the norm's sums laid out by the GEMV's
warps); dense / FP8 (both conversions) / NVFP4 weights, awkward sizes; twice through one counter; a negative
control (a norm run before every program has arrived gives other bytes); the fused decode step's logits with the
switch on and off. Interpreter on the CPU, natively on a GPU."""
import dataclasses

import pytest
import torch

pytest.importorskip("triton")

from qwenlocal.engine import Engine  # noqa: E402
from qwenlocal.engine.kernels import gemv_norm  # noqa: E402
from qwenlocal.engine.kernels.decode_norm import add_rms_norm  # noqa: E402
from qwenlocal.engine.kernels.gemv_multi import gemv, launch_config  # noqa: E402
from qwenlocal.engine.kernels.launch import new_counter  # noqa: E402
from qwenlocal.engine.quant.convert import quantize_checkpoint  # noqa: E402
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
    assert torch.equal(got[0], ref[0])  # the residual: the projection's bytes plus x, rounded once
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


def test_a_norm_before_every_program_arrived_gives_other_bytes():
    """Negative control: a counter that says all but one program are in makes the first to arrive run the norm
    over a projection the others have not written: the new residual differs (what the count guards)."""
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


@pytest.fixture(scope="module")
def quantized_ckpt(tiny_ckpt, tmp_path_factory):
    return quantize_checkpoint(tiny_ckpt, tmp_path_factory.mktemp("gemv-norm"))


@pytest.mark.skipif(DEVICE == "cuda", reason="the GPU tier: tests/test_gpu_decode_fused.py's switch gates")
def test_the_fused_step_gives_the_same_logits_with_the_norm_in_the_projection(quantized_ckpt, monkeypatch):
    """The tiny quantized checkpoint (FP8 / NVFP4 projections kept in their bytes), fused decode, off then on."""
    ids = torch.randint(0, 600, (16 + 2,), generator=torch.Generator().manual_seed(7))
    layers = []

    def run():
        eng = Engine.from_pretrained(quantized_ckpt, device="cpu", options={
            "prefill_chunk": 16, "expert_format": "nvfp4", "linear_format": "native"})
        eng.model.kernels = dataclasses.replace(eng.model.kernels, fused_decode=True)
        layers.append(len(eng.model.layers))
        return eng.score(ids, prefill=16)

    calls = []
    real = gemv_norm.gemv_add_rms_norm
    monkeypatch.setattr(gemv_norm, "gemv_add_rms_norm", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    off = run()
    assert not calls
    monkeypatch.setattr(gemv_norm, "FUSED", True)
    on = run()
    assert len(calls) == (len(ids) - 16) * layers[-1]  # every layer's projection of every decode step
    assert torch.isfinite(on).all() and torch.equal(on, off)
