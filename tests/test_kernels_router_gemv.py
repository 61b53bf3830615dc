"""The router GEMV with the top-k tail in its last program (kernels/router_gemv.py) against the two launches it
replaces (gemv_multi over [router | shared gate], then route_topk): byte for byte, on awkward sizes, fp32 and bf16,
twice in a row through one counter (it is back at 0 after each launch), a negative control (a tail run before
every program has arrived gives other bytes). The fused step with the switch on: tests/test_decode_fused.py.
Interpreter on the CPU, natively on a GPU."""
import pytest
import torch

pytest.importorskip("triton")

from qwenlocal.engine.kernels import router_gemv  # noqa: E402
from qwenlocal.engine.kernels.decode_router import route_topk  # noqa: E402
from qwenlocal.engine.kernels.gemv_multi import gemv_multi, launch_config  # noqa: E402
from qwenlocal.engine.kernels.launch import new_counter  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _inputs(experts, k, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(1, k, generator=gen).to(dtype).to(DEVICE)
    router_w = (torch.randn(experts, k, generator=gen) * 0.05).to(dtype).to(DEVICE)
    shared_gate = (torch.randn(1, k, generator=gen) * 0.05).to(dtype).to(DEVICE)
    return h, router_w, shared_gate


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("experts, k, top_k", [(256, 2048, 8), (37, 100, 5), (9, 48, 9), (1, 16, 1)])
def test_router_topk_gives_the_bytes_of_the_gemv_then_route_topk(experts, k, top_k, dtype):
    h, router_w, shared_gate = _inputs(experts, k, dtype, seed=experts + k)
    ref = route_topk(gemv_multi(h, [router_w, shared_gate]).reshape(-1), experts, top_k, dtype)
    counter = new_counter(h.device)
    for _ in range(2):  # the counter is back at 0: the second launch's tail runs as the first's did
        got = router_gemv.router_topk(h, router_w, shared_gate, top_k, dtype, counter)
        assert all(torch.equal(g, r) for g, r in zip(got, ref))
        assert int(counter) == 0


@pytest.mark.interpreter_order
def test_a_tail_before_every_program_arrived_gives_other_bytes(nan_empty):
    """Negative control: a counter that says all but one program are in makes the first to arrive run the tail
    over logits the others have not written: the routing differs (what the arrival count guards against)."""
    h, router_w, shared_gate = _inputs(256, 2048, torch.float32, seed=5)
    logits = gemv_multi(h, [router_w, shared_gate])  # kept alive: the launch's buffer cannot reuse its memory
    ref = route_topk(logits.reshape(-1), 256, 8, torch.float32)
    tiles = -(-257 // launch_config("dense", 257, 2048, 4, h.device).block_n)
    assert tiles > 1
    early = torch.full((1,), tiles - 1, dtype=torch.int32, device=DEVICE)
    got = router_gemv.router_topk(h, router_w, shared_gate, 8, torch.float32, early)
    assert not all(torch.equal(g, r) for g, r in zip(got, ref))


def test_bad_calls_are_refused():
    h, router_w, shared_gate = _inputs(16, 32, torch.float32, seed=1)
    counter = new_counter(h.device)
    with pytest.raises(ValueError, match="h's dtype"):
        router_gemv.router_topk(h, router_w.half(), shared_gate, 4, torch.float32, counter)
    with pytest.raises(ValueError, match="shared_gate"):
        router_gemv.router_topk(h, router_w, router_w, 4, torch.float32, counter)
    with pytest.raises(ValueError, match="top_k"):
        router_gemv.router_topk(h, router_w, shared_gate, 17, torch.float32, counter)
    with pytest.raises(ValueError, match="counter"):
        router_gemv.router_topk(h, router_w, shared_gate, 4, torch.float32, counter.long())
