"""kernels/nvfp4_int_experts.py: the experts' gate/up through integer dots against its torch twin (fp32 order)
and within x's int16 quantization of expert_gate_up's fp32 reference, on awkward sizes, repeated ids, with and
without the shared expert, bf16 and fp32 x; NaN-poisoned outputs; the refusals. The down projection's rows the
same way (expert_down_parts int_dot): twin, reference, act's blocks as quantize_x16's, the overlap's split."""
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
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gate_up_int_matches_its_twin_and_the_fp32_reference(hidden, inter, experts, ids, with_shared, dtype):
    x, _, ids_t, rows, shared, _, _ = _dev(*_problem(hidden, inter, experts, ids, hidden + inter, dtype))
    extra = shared[0] + shared[1] if with_shared else None
    out = torch.full((len(ids) + with_shared, inter), float("nan"), device=rows.device)
    expert_gate_up_int(x, ids_t, rows, hidden, inter, extra, out=out, block_n=16 if inter % 16 == 0 else 32)
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


DOWN_SIZES = [(96, 48, 7, [2, 5, 2]), (160, 80, 6, [5, 0, 3, 3, 1]), (2048, 512, 3, [1, 2])]  # I 48: groups padded


@pytest.mark.parametrize("hidden,inter,experts,ids", DOWN_SIZES)
@pytest.mark.parametrize("with_extra, with_scale, with_addend", [(True, True, False), (True, False, False),
                                                                  (False, False, True), (False, False, False)])
def test_down_parts_int_match_their_twin_and_the_fp32_reference(hidden, inter, experts, ids, with_extra, with_scale,
                                                                with_addend, nan_empty):
    """expert_down_parts(int_dot=True): act quantized to int16 blocks in each program, the rows as integer dots;
    against expert_down_parts_int_reference (the same integers, fp32 sums in another order) and within act's
    quantization of the float parts' fp32 reference; the shared row as its down projection (scaled or not), as
    the addend, or zeros."""
    from qwenlocal.engine.kernels.nvfp4_experts_parts import expert_down_parts, expert_down_parts_reference
    from qwenlocal.engine.kernels.nvfp4_int_experts import expert_down_parts_int_reference

    _, weights, ids_t, rows, shared, scale, addend = _problem(hidden, inter, experts, ids, inter + with_extra)
    act = torch.randn(len(ids) + with_extra, inter, generator=torch.Generator().manual_seed(9))
    act[0, :16] *= 1e-6  # a block of tiny values: its own scale
    act[-1, 16:32] = 0.0  # an all-zero block
    kw = dict(extra=shared[2] if with_extra else None, extra_scale=scale if with_scale else None)
    dev_kw = {k: (_dev(v)[0] if v is not None else None) for k, v in kw.items()}
    parts = expert_down_parts(*_dev(act, weights, ids_t, rows), hidden, inter, **dev_kw,
                              addend=_dev(addend)[0] if with_addend else None, int_dot=True)
    twin = expert_down_parts_int_reference(act, weights, ids_t, rows, hidden, inter, **kw)
    ref = expert_down_parts_reference(act, weights, ids_t, rows, hidden, inter, **kw,
                                      addend=addend if with_addend else None)
    if with_addend:
        twin[-1, 0] = addend.reshape(-1).float()
    parts = parts.cpu()
    big = ref.abs().max()
    assert torch.isfinite(parts).all() and parts.shape == ref.shape
    assert ((parts - twin).abs().max() / big) < 1e-5
    assert ((parts - ref).abs().max() / big) < 5e-4
    if not with_extra and not with_addend:
        assert torch.equal(parts[-1], torch.zeros(1, hidden))


def test_down_int_quantizes_act_as_quantize_x16():
    """The program's own quantization of act (x_pairs_of_values) is quantize_x16's, byte for byte: a down matrix of
    one-hot rows (code 1 = 0.5 at one column, scale 1, global 1) gives back act's dequantized int16 values."""
    from qwenlocal.engine.kernels.nvfp4_experts_parts import expert_down_parts
    from qwenlocal.engine.kernels.nvfp4_int_dot import quantize_x16_reference
    from qwenlocal.engine.quant.nvfp4_rows import pack_nvfp4_expert

    hidden, inter = 32, 64  # row m of down picks act column m
    codes = torch.zeros(hidden, inter, dtype=torch.uint8)
    codes[torch.arange(hidden), torch.arange(hidden)] = 1  # E2M1 code 1: 0.5
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous()
    one = torch.tensor(1.0).to(torch.float8_e4m3fn)
    gate = (torch.zeros(inter, hidden // 2, dtype=torch.uint8), torch.full((inter, hidden // 16), one.item()).to(
        torch.float8_e4m3fn), torch.tensor(1.0))
    down = (packed, torch.full((hidden, inter // 16), 1.0).to(torch.float8_e4m3fn), torch.tensor(2.0))
    rows = pack_nvfp4_expert(gate, gate, down)[None]
    act = torch.randn(1, inter, generator=torch.Generator().manual_seed(3)) * torch.logspace(-3, 2, inter)
    parts = expert_down_parts(*_dev(act, torch.ones(1, 1), torch.tensor([[0]]), rows), hidden, inter, int_dot=True)
    q, scales = quantize_x16_reference(act[0])
    want = (q.float() * scales.repeat_interleave(16))[:hidden]  # 0.5 * 2 (global) * q * scale
    assert torch.equal(parts[0, 0].cpu(), want)


def test_down_int_with_the_shared_expert_apart_gives_the_joint_launchs_bytes(nan_empty):
    """The overlap's split: the shared row from a launch of its own, the routed rows with write_shared=False, both
    through the integer rows: the joint launch's bytes."""
    from qwenlocal.engine.kernels.nvfp4_experts_parts import expert_down_parts

    hidden, inter, experts, ids = 160, 80, 6, [5, 0, 3, 3, 1]
    _, weights, ids_t, rows, shared, scale, _ = _problem(hidden, inter, experts, ids, 12)
    act = torch.randn(len(ids) + 1, inter, generator=torch.Generator().manual_seed(4))
    act, weights, ids_t, rows, scale = _dev(act, weights, ids_t, rows, scale)
    dn = _dev(shared[2])[0]
    k = len(ids)
    joint = expert_down_parts(act, weights, ids_t, rows, hidden, inter, dn, scale, int_dot=True)
    parts = torch.full((k + 1, 1, hidden), float("nan"), device=act.device)
    expert_down_parts(act[k:], weights, ids_t[:, :0], rows, hidden, inter, dn, scale, out=parts[k:], int_dot=True)
    expert_down_parts(act[:k], weights, ids_t, rows, hidden, inter, out=parts, write_shared=False, int_dot=True)
    assert torch.equal(parts, joint)
    with pytest.raises(ValueError, match="persistent"):
        expert_down_parts(act, weights, ids_t, rows, hidden, inter, dn, scale, int_dot=True, programs=4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the PTX path needs a CUDA GPU (the GPU tier)")
def test_the_down_rows_ptx_words_give_the_plain_paths_bytes_at_the_real_geometry():
    from qwenlocal.engine.kernels.nvfp4_experts_parts import expert_down_parts

    _, weights, ids_t, rows, shared, scale, _ = _dev(*_problem(2048, 512, 12, [3, 7, 1, 0, 11, 5, 2, 9], 6))
    act = torch.randn(9, 512, generator=torch.Generator().manual_seed(6)).to(rows.device)
    a = expert_down_parts(act, weights, ids_t, rows, 2048, 512, shared[2], scale, int_dot=True, int_decode="asm")
    b = expert_down_parts(act, weights, ids_t, rows, 2048, 512, shared[2], scale, int_dot=True, int_decode="plain")
    assert torch.isfinite(a).all() and torch.equal(a, b)
