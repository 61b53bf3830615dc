"""The post-mixer add + RMSNorm done by every program of the router's GEMV (kernels/router_norm.py) against the
two launches it replaces (add_rms_norm, then gemv_multi of the normed row): the new residual byte for byte, the
normed row byte for byte in the interpreter and within an ulp on a GPU, the logits within the rounding of
another summation order; awkward sizes and the real one; bad calls refused. The fused step with the switch on:
tests/test_decode_fused.py. Interpreter on the CPU, natively on a GPU."""
import pytest
import torch

pytest.importorskip("triton")

from qwenlocal.engine.kernels.decode_norm import add_rms_norm  # noqa: E402
from qwenlocal.engine.kernels.gemv_multi import gemv_multi_reference  # noqa: E402
from qwenlocal.engine.kernels.router_norm import router_norm  # noqa: E402
from test_kernels_gemv_norm import _assert_bytes  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
EPS = 1e-6


def _inputs(e, k, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(1, k, generator=gen) * 2).to(dtype).to(DEVICE)
    delta = torch.randn(1, k, generator=gen).to(dtype).to(DEVICE)
    norm_w = (0.3 * torch.randn(k, generator=gen)).to(dtype).to(DEVICE)
    router_w = (torch.randn(e, k, generator=gen) * 0.05).to(dtype).to(DEVICE)
    gate = (torch.randn(1, k, generator=gen) * 0.05).to(dtype).to(DEVICE)
    return x, delta, norm_w, router_w, gate


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("e, k", [(256, 2048), (37, 100), (9, 48), (1, 16)])
def test_router_norm_gives_add_rms_norm_then_the_router_gemv(e, k, dtype):
    x, delta, norm_w, router_w, gate = _inputs(e, k, dtype, seed=e + k)
    new_x, normed = add_rms_norm(x, delta, norm_w, EPS)
    got_x, got_normed, logits = router_norm(x, delta, norm_w, EPS, router_w, gate)
    _assert_bytes((got_x, got_normed), (new_x, normed), dtype)
    want = gemv_multi_reference(got_normed, [router_w, gate], out_dtype=torch.float32)
    tol = 2.0 ** -7 if dtype == torch.bfloat16 else 1e-5  # one bf16 rounding, or fp32 sums in another order
    assert logits.shape == (1, e + 1) and logits.dtype == dtype
    assert ((logits.float() - want).abs() <= tol * want.abs() + 1e-5).all()
    assert torch.equal(x, _inputs(e, k, dtype, seed=e + k)[0])  # the residual's input is left as it was


def test_bad_calls_are_refused():
    x, delta, norm_w, router_w, gate = _inputs(9, 48, torch.float32, seed=1)
    with pytest.raises(ValueError, match="delta"):
        router_norm(x, delta[:, :40], norm_w, EPS, router_w, gate)
    with pytest.raises(ValueError, match="norm_w"):
        router_norm(x, delta, norm_w[:40], EPS, router_w, gate)
    with pytest.raises(ValueError, match="plain"):
        router_norm(x, delta, norm_w, EPS, router_w.to(torch.bfloat16), gate)
    with pytest.raises(ValueError, match="shared_gate"):
        router_norm(x, delta, norm_w, EPS, router_w, router_w[:2])
