"""route_topk over 16-bit logits through packed keys (kernels/route_keys.py, decode_router.KEYS): the experts and
their order against route_topk_reference on awkward sizes, ties and signed zeros, the weights at the reference's
level and against the fp32 form's, the bytes the same at any warps. In Triton's interpreter on the CPU, natively
on a GPU."""
import pytest
import torch

pytest.importorskip("triton")

from qwenlocal.engine.kernels import decode_router  # noqa: E402
from qwenlocal.engine.kernels.decode_router import route_topk, route_topk_reference  # noqa: E402
from test_kernels_decode_fused import distinct_logits as _logits  # noqa: E402 (distinct in 16 bits too)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("experts, k", [(7, 3), (13, 5), (256, 8), (100, 1), (5, 5), (33, 8), (200, 10)])
def test_the_keys_give_the_references_experts_and_weights(experts, k, dtype):
    logits = _logits(experts, experts + k, dtype)
    weights, ids, shared = route_topk(logits, experts, k, dtype)
    ref_w, ref_ids, ref_shared = route_topk_reference(logits, experts, k, dtype)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(weights.float(), ref_w.float(), rtol=1e-2, atol=0)  # 16-bit weights
    torch.testing.assert_close(shared, ref_shared, rtol=1e-6, atol=1e-7)


def test_ties_take_the_lower_id_and_the_zeros_are_one_value():
    logits = torch.tensor([0.5, 2.0, -0.0, 2.0, 0.0, 1.0, -1.0, -3.0, 0.0], dtype=torch.bfloat16, device=DEVICE)
    _, ids, _ = route_topk(logits, 8, 8, torch.float32)
    assert ids.tolist() == [[1, 3, 5, 0, 2, 4, 6, 7]]  # -0.0 (id 2) and +0.0 (id 4): equal, lower id first


@pytest.mark.parametrize("experts, k", [(256, 8), (13, 5)])
def test_the_keys_and_the_fp32_form_agree(experts, k, monkeypatch):
    """The same experts in the same order; fp32 weights an ulp or so apart (the renormalisation's other order)."""
    logits = _logits(experts, 7 * k, torch.bfloat16)
    w_keys, ids_keys, shared_keys = route_topk(logits, experts, k, torch.float32)
    monkeypatch.setattr(decode_router, "KEYS", False)
    w_fp32, ids_fp32, shared_fp32 = route_topk(logits, experts, k, torch.float32)
    assert torch.equal(ids_keys, ids_fp32) and torch.equal(shared_keys, shared_fp32)
    torch.testing.assert_close(w_keys, w_fp32, rtol=4e-7, atol=0)


def test_the_bytes_do_not_depend_on_the_launchs_warps():
    logits = _logits(256, 11, torch.bfloat16)
    one = route_topk(logits, 256, 8, torch.bfloat16, num_warps=1)
    four = route_topk(logits, 256, 8, torch.bfloat16, num_warps=4)
    assert all(torch.equal(a, b) for a, b in zip(one, four))


def test_too_many_experts_for_16_bit_ids_is_refused():
    with pytest.raises(ValueError, match="16 bits"):
        route_topk(torch.zeros(70000, dtype=torch.bfloat16, device=DEVICE), 69999, 8, torch.bfloat16)


@pytest.mark.parametrize("traced", [False, True])
@pytest.mark.parametrize("with_shared", [True, False])
@pytest.mark.parametrize("hidden, inter, experts, k", [(96, 48, 13, 5), (64, 32, 7, 7), (160, 80, 33, 8)])
def test_the_integer_gate_up_routing_itself_is_route_topk_then_gate_up_byte_for_byte(hidden, inter, experts, k,
                                                                                    traced, with_shared):
    """expert_gate_up_int route= (nvfp4_int_experts.ROUTE): each routed program finds its expert from the logits;
    the act, and the weights, ids and shared gate the down launch reads, are route_topk's + the launch given
    ids, byte for byte; with a benchmark's trace the rows are the trace's and the outs still route_topk's."""
    from qwenlocal.engine.kernels.nvfp4_int_experts import expert_gate_up_int
    from test_kernels_nvfp4_experts_decode import _dev, _problem

    x, _, _, rows, shared, _, _ = _dev(*_problem(hidden, inter, experts, list(range(k)), seed=experts + k,
                                                  dtype=torch.bfloat16))
    extra = shared[0] + shared[1] if with_shared else None
    logits = _logits(experts, 3 * k, torch.bfloat16)
    ref_w, ref_ids, ref_shared = route_topk(logits, experts, k, torch.bfloat16)
    trace = torch.randint(0, experts, (1, k), generator=torch.Generator().manual_seed(k)).to(DEVICE)
    block_n = 16
    ref_act = expert_gate_up_int(x, trace if traced else ref_ids, rows, hidden, inter, extra, block_n=block_n)
    outs = (torch.full((1, k), float("nan"), dtype=torch.bfloat16, device=DEVICE),
            torch.full((1, k), -1, dtype=torch.int64, device=DEVICE), torch.full((1,), float("nan"), device=DEVICE))
    act = expert_gate_up_int(x, trace if traced else None, rows, hidden, inter, extra, block_n=block_n,
                             route=(logits, experts, *outs))
    assert torch.equal(act, ref_act)
    assert torch.equal(outs[0], ref_w) and torch.equal(outs[1], ref_ids) and torch.equal(outs[2], ref_shared)


def test_the_integer_gate_up_refuses_a_route_it_cannot_rank():
    from qwenlocal.engine.kernels.nvfp4_int_experts import expert_gate_up_int
    from test_kernels_nvfp4_experts_decode import _dev, _problem

    x, _, _, rows, _, _, _ = _dev(*_problem(64, 32, 7, [0, 1], seed=1, dtype=torch.bfloat16))
    outs = (torch.empty(1, 2, dtype=torch.bfloat16, device=DEVICE), torch.empty(1, 2, dtype=torch.int64, device=DEVICE),
            torch.empty(1, device=DEVICE))
    with pytest.raises(ValueError, match="bf16/fp16"):
        expert_gate_up_int(x, None, rows, 64, 32, route=(_logits(7, 1, torch.float32), 7, *outs))
    with pytest.raises(ValueError, match="trace's ids"):
        expert_gate_up_int(x, torch.zeros(1, 3, dtype=torch.int64, device=DEVICE), rows, 64, 32,
                           route=(_logits(7, 1, torch.bfloat16), 7, *outs))
    with pytest.raises(ValueError, match="outs must be"):
        expert_gate_up_int(x, None, rows, 64, 32, route=(_logits(7, 1, torch.bfloat16), 7, outs[0],
                                                         outs[1].int(), outs[2]))
