"""The persistent gate/up that loads a tile ahead (kernels/nvfp4_gate_up_stream.py) against expert_gate_up, one
program a tile: the same bytes for every program count (one program takes every tile; a count that does not
divide the tiles; more programs than tiles), with and without the shared expert and with it alone, both scale
paths and both activation loads; and the torch reference. Interpreter on the CPU, natively on a GPU."""
import pytest
import torch

pytest.importorskip("triton")

from qwenlocal.engine.kernels.nvfp4_experts_decode import expert_gate_up, expert_gate_up_reference  # noqa: E402
from qwenlocal.engine.kernels.nvfp4_gate_up_stream import expert_gate_up_stream  # noqa: E402
from test_kernels_nvfp4_experts_decode import _close, _dev, _problem, _to_dev  # noqa: E402


@pytest.mark.parametrize("with_extra, k_routed", [(True, 3), (False, 3), (True, 0)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_streamed_gate_up_gives_expert_gate_ups_bytes(with_extra, k_routed, dtype, nan_empty):
    hidden, inter = 160, 80  # 10 scale groups a row (masked words), 5 row blocks of 16 an expert
    x, _, ids_t, rows, shared, _, _ = _problem(hidden, inter, 7, [2, 5, 2][:k_routed], 23, dtype)
    ids_t = ids_t.reshape(1, k_routed)
    extra = _to_dev(shared[0] + shared[1]) if with_extra else None
    args = (*_dev(x, ids_t, rows), hidden, inter, extra)
    for cfg in (dict(block_n=16), dict(block_n=16, x_split=False, group_scales=True)):
        one_each = expert_gate_up(*args, **cfg)
        for programs in (1, 4, 100):
            streamed = expert_gate_up_stream(*args, programs=programs, **cfg)
            assert torch.isfinite(streamed).all() and torch.equal(streamed, one_each)
    if k_routed:  # (the reference dequantizes a stack of routed rows)
        _close(one_each, expert_gate_up_reference(x, ids_t, rows, hidden, inter,
                                                  shared[0] + shared[1] if with_extra else None).to(one_each.device))


def test_bad_calls_are_refused():
    x, _, ids_t, rows, _, _, _ = _problem(96, 48, 7, [2, 5], 3)
    args = _dev(x, ids_t, rows)
    with pytest.raises(ValueError, match="no expert"):
        expert_gate_up_stream(args[0], args[1][:, :0], args[2], 96, 48)
