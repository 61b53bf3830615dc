"""kernels/nvfp4_int_experts.py: the experts' gate/up through integer dots against its torch twin (fp32 order)
and within x's int16 quantization of expert_gate_up's fp32 reference, on awkward sizes, repeated ids, with and
without the shared expert, bf16 and fp32 x; NaN-poisoned outputs; the refusals."""
import pytest
import torch

pytest.importorskip("triton")

from qwenlocal.engine.kernels.nvfp4_experts_decode import expert_gate_up_reference  # noqa: E402
from qwenlocal.engine.kernels.nvfp4_int_dot import quantize_x16  # noqa: E402
from qwenlocal.engine.kernels.nvfp4_int_experts import (expert_gate_up_int,  # noqa: E402
                                                         expert_gate_up_int_reference)
from test_kernels_nvfp4_experts_decode import _dev, _problem  # noqa: E402

SIZES = [(96, 48, 7, [2, 5, 2]), (160, 80, 6, [5, 0, 3, 3, 1]), (2048, 16, 3, [1])]  # (H, I, E, ids)


@pytest.mark.parametrize("hidden,inter,experts,ids", SIZES)
@pytest.mark.parametrize("with_shared", [True, False])
# the row path with both x dtypes, and nvfp4_int_groups' (GROUPS; x is quantized to the same int16 blocks first)
@pytest.mark.parametrize("dtype, groups", [(torch.float32, False), (torch.bfloat16, False), (torch.bfloat16, True)])
def test_gate_up_int_matches_its_twin_and_the_fp32_reference(hidden, inter, experts, ids, with_shared, dtype,
                                                               groups):
    x, _, ids_t, rows, shared, _, _ = _dev(*_problem(hidden, inter, experts, ids, hidden + inter, dtype))
    extra = shared[0] + shared[1] if with_shared else None
    out = torch.full((len(ids) + with_shared, inter), float("nan"), device=rows.device)
    expert_gate_up_int(x, ids_t, rows, hidden, inter, extra, out=out, block_n=16 if inter % 16 == 0 else 32,
                       groups=groups)
    twin = expert_gate_up_int_reference(x.cpu(), ids_t.cpu(), rows.cpu(), hidden, inter,
                                        tuple(t.cpu() for t in extra) if extra else None)
    ref = expert_gate_up_reference(x.cpu(), ids_t.cpu(), rows.cpu(), hidden, inter,
                                   tuple(t.cpu() for t in extra) if extra else None)
    big = ref.abs().max()
    assert torch.isfinite(out).all()
    assert ((out.cpu() - twin).abs().max() / big) < 1e-5  # the fp32 sums in another order
    assert ((out.cpu() - ref).abs().max() / big) < 5e-4  # x's int16 blocks


def test_a_quantized_x_given_is_used_and_bad_calls_are_refused():
    hidden, inter = 96, 48
    x, _, ids_t, rows, shared, _, _ = _dev(*_problem(hidden, inter, 4, [1, 3], 9))
    xq = quantize_x16(x.reshape(-1))
    a = expert_gate_up_int(x, ids_t, rows, hidden, inter, xq=xq, block_n=16)
    b = expert_gate_up_int(torch.zeros_like(x), ids_t, rows, hidden, inter, xq=xq, block_n=16)  # x itself unread
    assert torch.equal(a, b)
    with pytest.raises(ValueError, match="xq must be"):
        expert_gate_up_int(x, ids_t, rows, hidden, inter, xq=(xq[0][:10], xq[1]))
    with pytest.raises(ValueError, match="rows must"):
        expert_gate_up_int(x, ids_t, rows.float(), hidden, inter)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the PTX path needs a CUDA GPU (the GPU tier)")
def test_the_ptx_words_give_the_plain_paths_bytes_at_the_real_geometry():
    x, _, ids_t, rows, shared, _, _ = _dev(*_problem(2048, 512, 12, [3, 7, 1, 0, 11, 5, 2, 9], 4, torch.bfloat16))
    extra = shared[0] + shared[1]
    a = expert_gate_up_int(x, ids_t, rows, 2048, 512, extra, decode="asm")
    assert torch.equal(a, expert_gate_up_int(x, ids_t, rows, 2048, 512, extra, decode="plain"))
