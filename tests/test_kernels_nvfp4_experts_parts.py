"""The MoE down projection split over the experts (expert_down_parts) against its torch reference on awkward
sizes, and its parts summed by add_rms_norm (a 3-D delta) against the model's sum: in Triton's interpreter on the
CPU, natively on the GPU tier. Byte-equality of bank rows vs slot rows with another stride. The group path
(nvfp4_down_groups, groups=): the same references, its refusals, its PTX against its plain form (GPU tier)."""
import pytest
import torch

pytest.importorskip("triton")

from qwenlocal.engine.kernels.decode_norm import add_rms_norm, add_rms_norm_reference  # noqa: E402
from qwenlocal.engine.kernels import nvfp4_experts_parts  # noqa: E402
from qwenlocal.engine.kernels.nvfp4_experts_decode import expert_down_reference  # noqa: E402
from qwenlocal.engine.kernels.nvfp4_experts_parts import (  # noqa: E402
    expert_down_parts, expert_down_parts_reference)
from test_kernels_nvfp4_experts_decode import DEVICE, SIZES, _close, _dev, _problem  # noqa: E402

CASES = [(False, False, False), (True, True, False), (True, False, False), (False, False, True)]
CONFIGS = [dict(block_m=16, groups=False), dict(block_m=32, block_g=2, x_split=False, group_scales=False),
           dict(block_m=64, decode="exact"), dict(block_m=16, groups=True)]  # groups: nvfp4_down_groups


@pytest.mark.parametrize("hidden, inter, experts, ids", SIZES)
@pytest.mark.parametrize("with_extra, with_scale, with_addend", CASES)
def test_parts_match_reference(hidden, inter, experts, ids, with_extra, with_scale, with_addend, nan_empty):
    _, weights, ids_t, rows, shared, scale, addend = _problem(hidden, inter, experts, ids, inter + with_extra)
    act = torch.randn(len(ids) + with_extra, inter, generator=torch.Generator().manual_seed(9))
    kw = dict(extra=shared[2] if with_extra else None, extra_scale=scale if with_scale else None,
              addend=addend if with_addend else None)
    ref = expert_down_parts_reference(act, weights, ids_t, rows, hidden, inter, **kw)
    assert ref.shape == (len(ids) + 1, 1, hidden)
    dev_kw = {k: (_dev(v)[0] if v is not None else None) for k, v in kw.items()}
    for cfg in CONFIGS:
        parts = expert_down_parts(*_dev(act, weights, ids_t, rows), hidden, inter, **dev_kw, **cfg)
        assert parts.shape == ref.shape and parts.dtype == torch.float32
        _close(parts, ref)
        if not with_extra and not with_addend:
            assert torch.equal(parts[-1].cpu(), torch.zeros(1, hidden))
        # summed in order, they are expert_down's output (which sums in another fixed order)
        total = expert_down_reference(act, weights, ids_t, rows, hidden, inter, **kw, out_dtype=torch.float32)
        _close(parts.sum(0), total)


@pytest.mark.parametrize("programs", [4, 9])
@pytest.mark.parametrize("with_extra, with_addend, write_shared", [(True, False, True), (False, True, True),
                                                                  (False, False, False)])
def test_persistent_parts_give_the_bytes_of_one_program_a_tile(programs, with_extra, with_addend, write_shared,
                                                               nan_empty):
    """Persistent programs (one or two an expert for its 6 or 12 output tiles, act[j] loaded once) write the
    bytes one program a tile writes: the shared row as its down projection, as the addend, or left to the
    caller. NaN-poisoned parts: a tile no turn visits fails."""
    hidden, inter, experts, ids = 96, 48, 7, [2, 5, 2]
    _, weights, ids_t, rows, shared, scale, addend = _problem(hidden, inter, experts, ids, 21)
    act = torch.randn(len(ids) + 1, inter, generator=torch.Generator().manual_seed(5))
    kw = dict(extra=_dev(shared[2])[0] if with_extra else None, extra_scale=_dev(scale)[0] if with_extra else None,
              addend=_dev(addend)[0] if with_addend else None, write_shared=write_shared)
    args = (*_dev(act, weights, ids_t, rows), hidden, inter)
    for cfg in (dict(block_m=16, groups=False), dict(block_m=8, x_split=False, group_scales=False)):
        one_each = expert_down_parts(*args, **kw, **cfg)
        turns = expert_down_parts(*args, **kw, programs=programs, **cfg)
        rows_written = slice(None) if write_shared else slice(0, len(ids))
        assert torch.isfinite(turns[rows_written]).all() and torch.equal(turns[rows_written], one_each[rows_written])
    with pytest.raises(ValueError, match="one K step"):
        expert_down_parts(*args, **kw, block_m=16, block_g=1, programs=4)


def test_bank_and_slot_rows_give_identical_parts(nan_empty):
    """The same experts read from the bank and from a slot cache (other row stride, permuted slots)."""
    hidden, inter, experts, ids = SIZES[0]
    _, weights, ids_t, rows, shared, scale, _ = _problem(hidden, inter, experts, ids, 3)
    act = torch.randn(len(ids) + 1, inter, generator=torch.Generator().manual_seed(2))
    perm = torch.randperm(experts, generator=torch.Generator().manual_seed(1))
    slots = torch.zeros(experts, rows.shape[1] + 12, dtype=torch.uint8)
    slots[:, :rows.shape[1]] = rows[perm]
    slot_of = torch.argsort(perm)
    a = expert_down_parts(*_dev(act, weights, ids_t, rows), hidden, inter, _dev(shared[2])[0], _dev(scale)[0])
    b = expert_down_parts(*_dev(act, weights, slot_of[ids_t], slots), hidden, inter, _dev(shared[2])[0],
                          _dev(scale)[0])
    assert torch.equal(a, b)


def test_bad_arguments_are_refused():
    hidden, inter, experts, ids = SIZES[0]
    _, weights, ids_t, rows, shared, scale, addend = _problem(hidden, inter, experts, ids, 4)
    act = torch.randn(len(ids) + 1, inter)
    with pytest.raises(ValueError, match="not both"):
        expert_down_parts(act, weights, ids_t, rows, hidden, inter, shared[2], addend=addend)
    with pytest.raises(ValueError, match="out must be"):
        expert_down_parts(act, weights, ids_t, rows, hidden, inter, out=torch.empty(len(ids), 1, hidden))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("parts_n, hidden", [(9, 2048), (1, 37), (4, 2051)])
def test_add_rms_norm_sums_parts_in_order_and_rounds_once(parts_n, hidden, dtype, nan_empty):
    gen = torch.Generator().manual_seed(parts_n + hidden)
    x = torch.randn(1, hidden, generator=gen).to(dtype).to(DEVICE)
    parts = torch.randn(parts_n, 1, hidden, generator=gen).to(DEVICE)  # fp32, as expert_down_parts gives them
    w = (torch.randn(hidden, generator=gen) * 0.3).to(dtype).to(DEVICE)
    new_x, normed = add_rms_norm(x, parts, w, 1e-6)
    ref_x, ref_norm = add_rms_norm_reference(x, parts, w, 1e-6)
    assert torch.equal(new_x, ref_x)  # the same fp32 sum in the same order, the same two roundings
    torch.testing.assert_close(normed.float(), ref_norm.float(), rtol=2 ** -7, atol=1e-6)
    total = parts[0].clone()
    for p in range(1, parts_n):
        total += parts[p]
    assert torch.equal(ref_x, x + total.to(dtype))
    with pytest.raises(ValueError, match="delta parts"):
        add_rms_norm(x, parts[:, :, :-1], w, 1e-6)


@pytest.mark.gpu
def test_gpu_real_shape_parts_graph_replay_and_no_sync():
    """At the real shape on the GPU: no host sync, CUDA-graph replay byte-equal to eager (the parts and their sum
    by add_rms_norm), close to the reference."""
    from qwenlocal.engine.kernels.nvfp4_grouped import random_nvfp4_rows
    from qwenlocal.engine.quant.formats import quantize_nvfp4

    h, i, e, k = 2048, 512, 16, 8
    gen = torch.Generator(device="cuda").manual_seed(0)
    bank = random_nvfp4_rows(e, h, i, "cuda", gen)
    down = quantize_nvfp4(torch.randn(h, i, device="cuda", generator=gen) / i ** 0.5)
    act = torch.randn(k + 1, i, device="cuda", generator=gen)
    ids = torch.randperm(e, device="cuda", generator=gen)[:k][None]
    w = torch.softmax(torch.randn(1, k, device="cuda", generator=gen), -1).to(torch.bfloat16)
    scale = torch.sigmoid(torch.randn(1, device="cuda", generator=gen))
    x = torch.randn(1, h, device="cuda", generator=gen).to(torch.bfloat16)
    norm_w = torch.randn(h, device="cuda", generator=gen).to(torch.bfloat16) * 0.1

    def step():
        parts = expert_down_parts(act, w, ids, bank, h, i, down, scale)
        return parts, add_rms_norm(x, parts, norm_w, 1e-6)

    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        parts, (new_x, normed) = step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    _close(parts, expert_down_parts_reference(act, w, ids, bank, h, i, down, scale), 2 ** -7)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        g_parts, (g_x, g_norm) = step()
    graph.replay()
    assert torch.equal(g_parts, parts) and torch.equal(g_x, new_x) and torch.equal(g_norm, normed)


def test_the_shared_expert_alone_gives_the_joint_launchs_bytes(nan_empty):
    """The decode overlap computes the shared expert apart (ids [1, 0] with extra) into the last part while the
    routed experts fill the others (write_shared=False): the same bytes as one joint launch, act and parts."""
    from qwenlocal.engine.kernels.nvfp4_experts_decode import expert_gate_up

    for hidden, inter, experts, ids in SIZES:
        x, weights, ids_t, rows, shared, scale, _ = _problem(hidden, inter, experts, ids, 17)
        x, weights, ids_t, rows, scale = _dev(x, weights, ids_t, rows, scale)
        gu, dn = _dev(shared[0] + shared[1])[0], _dev(shared[2])[0]
        k = ids_t.shape[-1]
        act = expert_gate_up(x, ids_t, rows, hidden, inter, gu)
        joint = expert_down_parts(act, weights, ids_t, rows, hidden, inter, dn, scale)
        none = ids_t[:, :0]
        act_shared = expert_gate_up(x, none, rows, hidden, inter, gu)
        assert act_shared.shape == (1, inter) and torch.equal(act_shared, act[k:])
        parts = torch.full((k + 1, 1, hidden), float("nan"), device=DEVICE)
        expert_down_parts(act_shared, weights, none, rows, hidden, inter, dn, scale, out=parts[k:])
        routed_act = expert_gate_up(x, ids_t, rows, hidden, inter)
        assert torch.equal(routed_act, act[:k])
        expert_down_parts(routed_act, weights, ids_t, rows, hidden, inter, out=parts, write_shared=False)
        assert torch.equal(parts, joint)
    with pytest.raises(ValueError, match="write_shared=False"):
        expert_down_parts(act, weights, ids_t, rows, hidden, inter, dn, scale, write_shared=False)


def test_the_group_path_refuses_persistent_programs_and_unaligned_rows():
    hidden, inter = 96, 48
    _, weights, ids_t, rows, shared, _, _ = _problem(hidden, inter, 4, [1, 3], 2)
    act = torch.randn(3, inter, generator=torch.Generator().manual_seed(2))
    with pytest.raises(ValueError, match="one program a tile"):
        expert_down_parts(act, weights, ids_t, rows, hidden, inter, groups=True, programs=4)
    wide = torch.zeros(rows.shape[0], rows.shape[1] + 20, dtype=torch.uint8)
    wide[:, 4:4 + rows.shape[1]] = rows
    with pytest.raises(ValueError, match="16-byte start and stride"):
        expert_down_parts(act, weights, ids_t, wide[:, 4:], hidden, inter, groups=True, decode="asm")


@pytest.mark.skipif(DEVICE == "cpu", reason="the PTX path needs a CUDA GPU (the GPU tier)")
@pytest.mark.parametrize("inter", [32, 512])
def test_the_group_ptx_gives_the_plain_forms_chains_at_the_real_geometry(inter):
    """nvfp4_down_groups' PTX block and its tl.load / tl.fma form: the same integers and FMA order a group. With
    two groups a row (inter 32) the sum over them has one order, so the parts are the same bytes; with 32 groups
    the sum follows the tile's layout, which the plain form's tl.loads choose (another order of the adds: within
    an fp32 rounding, seen on the H100 in session 24). Both within an fp32 rounding of the row path's."""
    from qwenlocal.engine.quant.nvfp4_rows import padded_rows

    hidden = 2048
    _, weights, ids_t, rows, shared, scale, _ = _problem(hidden, inter, 12, [3, 7, 1, 0, 11, 5, 2, 9], 6)
    act = torch.randn(9, inter, generator=torch.Generator().manual_seed(6))
    args = _dev(act, weights, ids_t, padded_rows(rows, hidden, inter))
    kw = dict(extra=_dev(shared[2])[0], extra_scale=_dev(scale)[0], groups=True)
    a = expert_down_parts(*args, hidden, inter, decode="asm", **kw)
    b = expert_down_parts(*args, hidden, inter, decode="fp16", **kw)  # "fp16": the group path's plain form
    assert torch.isfinite(a).all()
    if inter == 32:
        assert torch.equal(a, b)
    else:
        assert ((a - b).abs().max() / b.abs().max()) < 1e-6
    rowwise = expert_down_parts(*args, hidden, inter, extra=kw["extra"], extra_scale=kw["extra_scale"])
    assert ((a - rowwise).abs().max() / rowwise.abs().max()) < 1e-5


_COMPILE = r"""
import json, os, sys
import sass_down_groups as s
print(json.dumps({str(g): s.counts(s.compile_down_sm90(g), os.path.join(sys.argv[1], f"d{int(g)}"), False)
                  for g in (False, True)}))
"""


def test_sm90_code_of_the_group_path_drops_the_layouts_barriers_and_registers(tmp_path):
    """The step's down launch compiled here for sm_90 (no GPU; scripts/sass_down_groups.py): on the group path
    fewer instructions, registers, barriers and shared-memory loads than on the row path."""
    from sass_support import sm90_json

    out = sm90_json(_COMPILE, tmp_path)
    rows, groups = out["False"], out["True"]
    assert groups["n"] < rows["n"] and int(groups["reg"]) < int(rows["reg"])
    assert groups["bar"] < rows["bar"] and groups["lds"] < rows["lds"]


def test_the_group_switch_leaves_row_path_requests_to_the_row_path():
    """nvfp4_experts_parts.GROUPS (on) takes the calls that ask nothing of the row path only; a part of a row's
    groups a step, the exact decode or persistent programs keep the row path's bytes, and the group path asked
    for with a part of a row's groups is refused before the launch."""
    hidden, inter, experts, ids = 96, 48, 7, [2, 5, 2]
    _, weights, ids_t, rows, shared, scale, _ = _problem(hidden, inter, experts, ids, 31)
    act = torch.randn(len(ids) + 1, inter, generator=torch.Generator().manual_seed(6))
    args = (*_dev(act, weights, ids_t, rows), hidden, inter)
    kw = dict(extra=_dev(shared[2])[0], extra_scale=_dev(scale)[0], block_m=16)
    assert nvfp4_experts_parts.GROUPS
    for row_only in (dict(block_g=2), dict(decode="exact"), dict(programs=4)):
        assert torch.equal(expert_down_parts(*args, **kw, **row_only),
                           expert_down_parts(*args, **kw, **row_only, groups=False))
    with pytest.raises(ValueError, match="in one tile"):
        expert_down_parts(*args, **kw, block_g=2, groups=True)
