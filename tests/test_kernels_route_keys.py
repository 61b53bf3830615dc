"""The router's top-k as packed keys (kernels/route_keys.py): ranks against route_topk_reference on awkward
sizes, ties and signed zeros; and expert_gate_up's route= (each program finds its own expert) against
route_topk + expert_gate_up byte for byte: the act, the weights, ids and shared gate the down launch reads, with
and without a benchmark's trace ids. In Triton's interpreter on the CPU, natively on a GPU."""
import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from qwenlocal.engine.kernels.decode_router import route_topk, route_topk_reference  # noqa: E402
from qwenlocal.engine.kernels.nvfp4_experts_decode import expert_gate_up  # noqa: E402
from qwenlocal.engine.kernels.route_keys import route_rank_key  # noqa: E402
from test_kernels_nvfp4_experts_decode import _dev, _problem  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@triton.jit
def _ranks_kernel(logits_ptr, out_ptr, E, BLOCK_E: tl.constexpr):
    j = tl.program_id(0)
    key = route_rank_key(logits_ptr, E, j, BLOCK_E)
    tl.store(out_ptr + j, 0xFFFF - (key & 0xFFFF))


def _ranks(logits: torch.Tensor, experts: int, k: int) -> list[int]:
    out = torch.full((k,), -1, dtype=torch.int32, device=logits.device)
    _ranks_kernel[(k,)](logits, out, experts, BLOCK_E=triton.next_power_of_2(experts))
    return out.tolist()


def _logits(experts: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    """Distinct logits (distinct in 16 bits), negative and positive, then the shared gate's."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randperm(experts, generator=gen).float() * (6.0 / experts) - 3.0
    logits = torch.cat([logits, torch.randn(1, generator=gen)]).to(dtype)
    assert logits[:experts].unique().numel() == experts
    return logits.to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("experts, k", [(7, 3), (13, 5), (256, 8), (100, 1), (5, 5), (33, 8)])
def test_each_rank_is_the_references(experts, k, dtype):
    logits = _logits(experts, experts + k, dtype)
    _, ref_ids, _ = route_topk_reference(logits, experts, k, torch.float32)
    assert _ranks(logits, experts, k) == ref_ids[0].tolist()


def test_ties_take_the_lower_id_and_the_zeros_are_one_value():
    logits = torch.tensor([0.5, 2.0, -0.0, 2.0, 0.0, 1.0, -1.0, -3.0, 0.0], dtype=torch.bfloat16, device=DEVICE)
    assert _ranks(logits, 8, 8) == [1, 3, 5, 0, 2, 4, 6, 7]  # -0.0 (id 2) and +0.0 (id 4): equal, lower id first


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_route_topk_on_16_bit_logits_gives_the_references_order_and_weights(dtype):
    logits = _logits(256, 9, dtype)
    weights, ids, shared = route_topk(logits, 256, 8, dtype)
    ref_w, ref_ids, ref_shared = route_topk_reference(logits, 256, 8, dtype)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(weights.float(), ref_w.float(), rtol=1e-2, atol=0)  # 16-bit weights
    torch.testing.assert_close(shared, ref_shared, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("traced", [False, True])
@pytest.mark.parametrize("hidden, inter, experts, k", [(96, 48, 13, 5), (64, 32, 7, 7)])
def test_gate_up_routing_itself_is_route_topk_then_gate_up_byte_for_byte(hidden, inter, experts, k, traced):
    x, _, _, rows, shared, _, _ = _dev(*_problem(hidden, inter, experts, list(range(k)), seed=experts + k,
                                                  dtype=torch.bfloat16))
    extra = shared[0] + shared[1]
    logits = _logits(experts, 3 * k, torch.bfloat16)
    ref_w, ref_ids, ref_shared = route_topk(logits, experts, k, torch.bfloat16)
    trace = torch.randint(0, experts, (1, k), generator=torch.Generator().manual_seed(k)).to(DEVICE)
    ref_act = expert_gate_up(x, trace if traced else ref_ids, rows, hidden, inter, extra=extra, block_n=16)
    outs = (torch.full((1, k), float("nan"), dtype=torch.bfloat16, device=DEVICE),
            torch.full((1, k), -1, dtype=torch.int64, device=DEVICE), torch.full((1,), float("nan"), device=DEVICE))
    act = expert_gate_up(x, trace if traced else None, rows, hidden, inter, extra=extra, block_n=16,
                         route=(logits, experts, *outs))
    assert torch.equal(act, ref_act)
    assert torch.equal(outs[0], ref_w) and torch.equal(outs[1], ref_ids) and torch.equal(outs[2], ref_shared)


def test_gate_up_route_refuses_what_it_cannot_rank():
    x, _, _, rows, shared, _, _ = _dev(*_problem(64, 32, 7, [0, 1], seed=1, dtype=torch.bfloat16))
    outs = (torch.empty(1, 2, dtype=torch.bfloat16, device=DEVICE), torch.empty(1, 2, dtype=torch.int64, device=DEVICE),
            torch.empty(1, device=DEVICE))
    with pytest.raises(ValueError, match="bf16/fp16"):
        expert_gate_up(x, None, rows, 64, 32, route=(_logits(7, 1, torch.float32), 7, *outs))
    with pytest.raises(ValueError, match="persistent"):
        expert_gate_up(x, None, rows, 64, 32, programs=1, route=(_logits(7, 1, torch.bfloat16), 7, *outs))
