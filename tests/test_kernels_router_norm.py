"""The post-mixer add + RMSNorm done by every program of the router's GEMV (kernels/router_norm.py) against the
two launches it replaces (add_rms_norm, then gemv_multi of the normed row): the new residual byte for byte, the
normed row byte for byte in the interpreter and within an ulp on a GPU, the logits within the rounding of
another summation order; awkward sizes and the real one; bad calls refused. The fused step with the switch on:
tests/test_decode_fused.py. Interpreter on the CPU, natively on a GPU."""
import pytest
import torch

pytest.importorskip("triton")

from qwenlocal.engine.kernels.decode_norm import add_rms_norm  # noqa: E402
from qwenlocal.engine.kernels.decode_router import route_topk  # noqa: E402
from qwenlocal.engine.kernels.gemv_multi import gemv_multi_reference  # noqa: E402
from qwenlocal.engine.kernels.launch import new_counter  # noqa: E402
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


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("e, k, top_k", [(256, 2048, 8), (37, 100, 5), (9, 48, 9)])
def test_the_top_k_in_the_last_program_gives_route_topks_bytes(e, k, top_k, dtype, nan_empty):
    """route=: route_topk's outputs stored by the launch's last program to arrive, byte for byte what route_topk
    makes of the same launch's logits; twice over one counter (back at 0 after each launch)."""
    x, delta, norm_w, router_w, gate = _inputs(e, k, dtype, seed=3 * e + k)
    counter = new_counter(torch.device(DEVICE))
    for _ in range(2):
        new_x, normed, logits, outs = router_norm(x, delta, norm_w, EPS, router_w, gate,
                                                  route=(top_k, dtype, counter))
        want = route_topk(logits.reshape(-1), e, top_k, dtype)
        assert all(torch.equal(a, b) for a, b in zip(outs, want)) and not counter.any()
        plain = router_norm(x, delta, norm_w, EPS, router_w, gate)
        assert all(torch.equal(a, b) for a, b in zip((new_x, normed, logits), plain))


@pytest.mark.interpreter_order
def test_a_tail_before_every_program_arrived_gives_other_bytes(nan_empty):
    """Negative control: the counter preset to all programs but one, so the first program runs the tail before
    the others have written their logits (NaN-poisoned): other ids and weights than route_topk's."""
    x, delta, norm_w, router_w, gate = _inputs(64, 128, torch.bfloat16, seed=5)
    programs = -(-65 // 32)  # the interpreter's 32 rows a program
    early = new_counter(torch.device(DEVICE))
    early += programs - 1
    _, _, logits, outs = router_norm(x, delta, norm_w, EPS, router_w, gate, route=(8, torch.bfloat16, early))
    want = route_topk(logits.reshape(-1), 64, 8, torch.bfloat16)
    assert not all(torch.equal(a, b) for a, b in zip(outs, want))


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
    counter = new_counter(torch.device(DEVICE))
    with pytest.raises(ValueError, match="16-bit"):
        router_norm(x, delta, norm_w, EPS, router_w, gate, route=(2, torch.float32, counter))
    b = [t.to(torch.bfloat16) for t in (x, delta, norm_w, router_w, gate)]
    with pytest.raises(ValueError, match="top_k"):
        router_norm(*b[:3], EPS, *b[3:], route=(10, torch.bfloat16, counter))
    with pytest.raises(ValueError, match="counter"):
        router_norm(*b[:3], EPS, *b[3:], route=(2, torch.bfloat16, counter.long()))
