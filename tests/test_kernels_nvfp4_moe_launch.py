"""The MoE's gate/up and down parts in one launch (nvfp4_moe_launch.expert_moe) against the two launches it
replaces (byte for byte: the same programs' arithmetic) and against the torch references, on awkward sizes: in
Triton's interpreter on the CPU, natively on the GPU tier. The counters are back at 0 after every launch (a
graph replay reuses them)."""
import pytest
import torch

pytest.importorskip("triton")

from qwenlocal.engine.kernels.launch import new_counter  # noqa: E402
from qwenlocal.engine.kernels.nvfp4_experts_decode import expert_gate_up  # noqa: E402
from qwenlocal.engine.kernels.nvfp4_experts_parts import BLOCK_M, expert_down_parts  # noqa: E402
from qwenlocal.engine.kernels.nvfp4_moe_launch import counters_needed, expert_moe, expert_moe_reference  # noqa: E402
from test_kernels_nvfp4_experts_decode import DEVICE, _close, _dev, _problem  # noqa: E402

# (H, I, E, routed ids with a repeat): row groups that are not a power of 2 (masked words), 3 or 5 experts
SIZES = [(96, 48, 7, [2, 5, 2]), (160, 80, 6, [5, 0, 3, 3, 1])]


def _two_launches(x, weights, ids, rows, hidden, inter, shared, scale, write_shared, sums=None, out=None):
    gu = shared[0] + shared[1] if write_shared else None
    act = expert_gate_up(x, ids, rows, hidden, inter, gu, num_warps=4)
    return expert_down_parts(act, weights, ids, rows, hidden, inter, extra=shared[2] if write_shared else None,
                             extra_scale=scale if write_shared else None, write_shared=write_shared, sums=sums,
                             out=out, num_warps=4)


@pytest.mark.parametrize("hidden, inter, experts, ids", SIZES)
@pytest.mark.parametrize("dtype, tickets", [(torch.bfloat16, True), (torch.float32, True), (torch.bfloat16, False)])
def test_one_launch_gives_the_two_launches_bytes(hidden, inter, experts, ids, dtype, tickets, nan_empty,
                                                 monkeypatch):
    """Serial (routed + shared, the shared part scaled by its gate), twice over the same counters (they are back
    at 0), and within fp32 rounding of the torch references; work items by ticket or by program index."""
    from qwenlocal.engine.kernels import nvfp4_moe_launch

    monkeypatch.setattr(nvfp4_moe_launch, "TICKETS", tickets)
    x, weights, ids_t, rows, shared, scale, _ = _problem(hidden, inter, experts, ids, hidden + inter, dtype)
    args = (*_dev(x, weights, ids_t, rows), hidden, inter)
    sh, sc = _dev(shared, scale)
    want = _two_launches(*args, sh, sc, True)
    counters = new_counter(torch.device(DEVICE), counters_needed(len(ids) + 1))
    for _ in range(2):
        got = expert_moe(*args, counters, sh[0] + sh[1], sh[2], sc)
        assert torch.equal(got, want)
        assert not counters.any()
    _close(got, expert_moe_reference(x, weights, ids_t, rows, hidden, inter, shared[0] + shared[1], shared[2],
                                     scale).to(got.device), rel=1e-4)


@pytest.mark.parametrize("hidden, inter, experts, ids", SIZES[:1])
def test_the_split_and_the_tile_sums_give_the_serial_bytes(hidden, inter, experts, ids, nan_empty):
    """The overlap's split: the shared expert alone (no routed ids) into parts[k], then the routed experts with
    write_shared=False and the tile sums (the new residual and its sums of squares, parts_norm TILE_SUMS): the
    two launches' bytes, and the shared row as the serial launch writes it."""
    x, weights, ids_t, rows, shared, scale, _ = _problem(hidden, inter, experts, ids, 31, torch.bfloat16)
    args = (*_dev(x, weights, ids_t, rows), hidden, inter)
    sh, sc = _dev(shared, scale)
    dev = torch.device(DEVICE)
    serial = expert_moe(*args, new_counter(dev, counters_needed(len(ids) + 1)), sh[0] + sh[1], sh[2], sc)
    k = len(ids)
    parts = torch.empty(k + 1, 1, hidden, device=dev)
    none = args[2][:, :0]
    expert_moe(args[0], args[1], none, *args[3:], new_counter(dev, counters_needed(1)), sh[0] + sh[1], sh[2], sc,
               out=parts[k:])
    assert torch.equal(parts[k], serial[k])
    residual = _dev(torch.randn(1, hidden, generator=torch.Generator().manual_seed(2)).bfloat16())[0]
    tiles = -(-hidden // BLOCK_M)
    got = expert_moe(*args, new_counter(dev, counters_needed(k)), out=parts, write_shared=False,
                     sums=(residual, new_counter(dev, tiles)))
    want_parts = parts.clone()
    want = _two_launches(*args, sh, sc, False, sums=(residual, new_counter(dev, tiles)), out=want_parts)
    assert torch.equal(parts, want_parts) and torch.equal(parts[:k], serial[:k])
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_bad_calls_raise_clear_errors():
    x, weights, ids_t, rows, shared, scale, _ = _problem(96, 48, 7, [2, 5], 3)
    args = (*_dev(x, weights, ids_t, rows), 96, 48)
    sh, sc = _dev(shared, scale)
    dev = torch.device(DEVICE)
    with pytest.raises(ValueError, match="counters must be"):
        expert_moe(*args, new_counter(dev, 4), sh[0] + sh[1], sh[2], sc)
    with pytest.raises(ValueError, match="together"):
        expert_moe(*args, new_counter(dev, counters_needed(3)), sh[0] + sh[1], None, sc)
    with pytest.raises(ValueError, match="write_shared"):
        expert_moe(*args, new_counter(dev, counters_needed(2)))
    with pytest.raises(ValueError, match="no expert"):
        expert_moe(args[0], args[1], args[2][:, :0], *args[3:], new_counter(dev, 1), write_shared=False)


@pytest.mark.gpu
def test_the_down_programs_wait_for_their_experts_gate_up(nan_empty):
    """The ordering's negative control, natively (in the interpreter the programs run in ticket order, so the
    wait is never needed there): every gate/up program first sleeps 20 us; with the wait the bytes of the two
    launches, without it the down programs read act before it is written (NaN-poisoned) and the parts differ."""
    hidden, inter, ids = 256, 128, [3, 1, 4, 1]
    x, weights, ids_t, rows, shared, scale, _ = _problem(hidden, inter, 6, ids, 41, torch.bfloat16)
    args = (*_dev(x, weights, ids_t, rows), hidden, inter)
    sh, sc = _dev(shared, scale)
    want = _two_launches(*args, sh, sc, True)
    counters = new_counter(torch.device(DEVICE), counters_needed(len(ids) + 1))
    waited = expert_moe(*args, counters, sh[0] + sh[1], sh[2], sc, stall_us=20)
    unordered = expert_moe(*args, counters, sh[0] + sh[1], sh[2], sc, stall_us=20, wait=False)
    assert torch.equal(waited, want)
    assert not torch.equal(unordered, want)
