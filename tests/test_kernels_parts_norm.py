"""The next residual add + RMSNorm as the tail of the MoE down projection's launch (expert_down_parts with
norm=, kernels/parts_norm.py) against the parts then add_rms_norm: the new residual byte for byte, the normed
row byte for byte in the interpreter (one order of sums) and within an ulp on a GPU; masked output tiles; twice
through one set of counters; a negative control (a row counter that says all but one tile are in makes the
norm read a residual the others have not written); the refusals. The fused step with the switch on:
tests/test_decode_fused.py. Interpreter on the CPU, natively on a GPU."""
import pytest
import torch

pytest.importorskip("triton")

from qwenlocal.engine.kernels.decode_norm import add_rms_norm  # noqa: E402
from qwenlocal.engine.kernels.launch import new_counter  # noqa: E402
from qwenlocal.engine.kernels.nvfp4_experts_parts import expert_down_parts  # noqa: E402
from test_kernels_gemv_norm import _assert_bytes  # noqa: E402 (the residual equal, the normed row an ulp on a GPU)
from test_kernels_nvfp4_experts_decode import _dev, _problem  # noqa: E402

EPS = 1e-6


def _case(hidden, inter, experts, ids, dtype, seed):
    _, weights, ids_t, rows, shared, scale, _ = _problem(hidden, inter, experts, ids, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    act = torch.randn(len(ids) + 1, inter, generator=gen)
    x = (torch.randn(1, hidden, generator=gen) * 2).to(dtype)
    norm_w = (0.3 * torch.randn(hidden, generator=gen)).to(dtype)
    args = (*_dev(act, weights, ids_t, rows), hidden, inter, _dev(shared[2])[0], _dev(scale)[0])
    return args, *_dev(x, norm_w)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hidden, inter, experts, ids, block_m", [(96, 48, 7, [2, 5, 2], 16),
                                                                  (160, 80, 6, [5, 0, 3, 3, 1], 64)])  # a masked tile
def test_the_norm_tail_gives_the_bytes_of_the_parts_then_add_rms_norm(hidden, inter, experts, ids, block_m, dtype):
    args, x, norm_w = _case(hidden, inter, experts, ids, dtype, seed=hidden)
    ref = add_rms_norm(x, expert_down_parts(*args, block_m=block_m), norm_w, EPS)
    counters = new_counter(x.device, -(-hidden // block_m) + 1)
    for _ in range(2):  # the counters are back at 0: the second launch's tail runs as the first's did
        got = expert_down_parts(*args, block_m=block_m, norm=(x, norm_w, EPS, counters))
        _assert_bytes(got, ref, dtype)
        assert not counters.any()


@pytest.mark.interpreter_order
def test_a_norm_before_every_tile_arrived_gives_other_bytes(nan_empty):
    """Negative control: the row counter preset to all tiles but one: the first tile to finish runs the norm
    over a residual the other tiles have not written yet (what the row's count guards)."""
    hidden = 96
    args, x, norm_w = _case(hidden, 48, 7, [2, 5, 2], torch.float32, seed=4)
    parts = expert_down_parts(*args)
    ref = add_rms_norm(x, parts, norm_w, EPS)  # kept alive: the launch's buffers cannot reuse their memory
    tiles = -(-hidden // 16)
    counters = new_counter(x.device, tiles + 1)
    counters[tiles] = tiles - 1
    got = expert_down_parts(*args, norm=(x, norm_w, EPS, counters))
    assert torch.equal(got[0][:, :16], ref[0][:, :16])  # tile 0's residual is its own, written before its count
    assert not torch.equal(got[1], ref[1])


def test_bad_norm_tails_are_refused():
    args, x, norm_w = _case(96, 48, 7, [2, 5, 2], torch.float32, seed=5)
    good = new_counter(x.device, 96 // 16 + 1)
    with pytest.raises(ValueError, match="counters"):
        expert_down_parts(*args, norm=(x, norm_w, EPS, new_counter(x.device, 3)))
    with pytest.raises(ValueError, match="x \\[1, 96\\]"):
        expert_down_parts(*args, norm=(x[:, :48].contiguous(), norm_w, EPS, good))
    with pytest.raises(ValueError, match="one program a tile"):
        expert_down_parts(*args[:6], write_shared=False, norm=(x, norm_w, EPS, good))
    with pytest.raises(ValueError, match="one program a tile"):
        expert_down_parts(*args, programs=4, norm=(x, norm_w, EPS, good))


def _tile_sums_reference(new_x: torch.Tensor, block_m: int) -> torch.Tensor:
    x = new_x.float().reshape(-1)
    pad = (-x.numel()) % block_m
    return torch.nn.functional.pad(x, (0, pad)).reshape(-1, block_m).pow(2).sum(1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hidden, inter, experts, ids, block_m", [(96, 48, 7, [2, 5, 2], 16),
                                                                  (160, 80, 6, [5, 0, 3, 3, 1], 64)])  # a masked tile
def test_the_tile_sums_tail_gives_add_rms_norms_residual_and_its_tiles_sums(hidden, inter, experts, ids, block_m,
                                                                            dtype):
    """parts_norm TILE_SUMS (sums=): the new residual byte for byte as add_rms_norm writes it, and each tile's
    sum of squares of it; twice through one set of counters (back at 0)."""
    args, x, norm_w = _case(hidden, inter, experts, ids, dtype, seed=hidden + 1)
    ref_x, _ = add_rms_norm(x, expert_down_parts(*args, block_m=block_m), norm_w, EPS)
    counters = new_counter(x.device, -(-hidden // block_m))
    for _ in range(2):
        new_x, sums = expert_down_parts(*args, block_m=block_m, sums=(x, counters))
        assert torch.equal(new_x, ref_x) and not counters.any()
        ref_sums = _tile_sums_reference(ref_x, block_m)
        torch.testing.assert_close(sums.cpu(), ref_sums.cpu(), rtol=1e-6, atol=0)


def test_the_tile_sums_of_a_launch_without_the_shared_expert_sum_its_part_too():
    """The overlap's split: the shared expert's part written by a launch before (expert_gate_up / down_parts with
    no routed ids), the routed launch (write_shared=False) counting k programs a tile and summing k + 1 parts:
    the serial launch's residual and sums, byte for byte."""
    hidden, block_m = 96, 16
    args, x, _ = _case(hidden, 48, 7, [2, 5, 2], torch.bfloat16, seed=9)
    act, weights, ids, rows, h, i, extra, scale = args
    tiles = -(-hidden // block_m)
    serial = expert_down_parts(*args, sums=(x, new_counter(x.device, tiles)))
    parts = torch.empty(4, 1, hidden, device=x.device, dtype=torch.float32)
    expert_down_parts(act[3:], weights, ids[:, :0], rows, h, i, extra, scale, out=parts[3:])
    split = expert_down_parts(act, weights, ids, rows, h, i, out=parts, write_shared=False,
                              sums=(x, new_counter(x.device, tiles)))
    assert torch.equal(split[0], serial[0]) and torch.equal(split[1], serial[1])


def test_bad_tile_sums_are_refused():
    args, x, norm_w = _case(96, 48, 7, [2, 5, 2], torch.float32, seed=5)
    with pytest.raises(ValueError, match="counters"):
        expert_down_parts(*args, sums=(x, new_counter(x.device, 2)))
    with pytest.raises(ValueError, match="not both"):
        expert_down_parts(*args, sums=(x, new_counter(x.device, 6)), norm=(x, norm_w, EPS, new_counter(x.device, 7)))


@pytest.mark.interpreter_order
def test_a_tile_sum_before_every_expert_arrived_gives_other_bytes(nan_empty):
    """Negative control: tile 0's counter preset to all its programs but two: its second program to finish sums
    the tile's parts while the last expert's part is not written yet (what the tile's count guards)."""
    hidden = 96
    args, x, norm_w = _case(hidden, 48, 7, [2, 5, 2], torch.float32, seed=12)
    ref_x, _ = add_rms_norm(x, expert_down_parts(*args), norm_w, EPS)
    counters = new_counter(x.device, -(-hidden // 16))
    counters[0] = 4 - 2  # k + 1 = 4 programs a tile
    new_x, _ = expert_down_parts(*args, sums=(x, counters))
    assert torch.equal(new_x[:, 16:], ref_x[:, 16:])  # the other tiles counted every program
    assert not torch.equal(new_x[:, :16], ref_x[:, :16])
