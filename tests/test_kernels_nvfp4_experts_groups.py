"""The group-word expert kernels (kernels/nvfp4_experts_groups.py: int64 words a 16-code scale group, rows at
an 8-byte stride) against the same torch references as the 4-byte-word kernels: awkward sizes, repeated ids,
masked rows and groups, the shared expert in the launch and alone, every code and scale byte, NaN-poisoned
outputs, 0xFF padding bytes that must never be read, bank vs slot rows byte-equal, and the fallback to the
4-byte-word kernels where the rows do not allow group words."""
import pytest
import torch

pytest.importorskip("triton")

from qwenlocal.engine.kernels import nvfp4_experts_groups  # noqa: E402
from qwenlocal.engine.kernels.nvfp4_experts_decode import expert_gate_up, expert_gate_up_reference  # noqa: E402
from qwenlocal.engine.kernels.nvfp4_experts_parts import (  # noqa: E402
    expert_down_parts, expert_down_parts_reference,
)
from qwenlocal.engine.kernels.nvfp4_grouped import random_nvfp4_rows  # noqa: E402
from test_kernels_nvfp4_experts_decode import DEVICE, SIZES, _close, _dev, _problem, _to_dev, slot_copy  # noqa: E402


def triton_steps(k_in: int, chunk: int) -> int:
    """The group steps a row of k_in codes takes at `chunk` words a step (a power of 2)."""
    steps = -(-(k_in // 16) // chunk)
    return 1 << (steps - 1).bit_length()


def padded(rows: torch.Tensor, align: int = 16) -> torch.Tensor:
    """The same rows at an `align`-byte stride, the padding bytes 0xFF (a kernel that read them would show it)."""
    stride = -(-rows.shape[1] // align) * align
    out = torch.full((rows.shape[0], stride), 0xFF, dtype=torch.uint8)
    out[:, :rows.shape[1]] = rows
    return out


@pytest.mark.parametrize("hidden, inter, experts, ids", SIZES)
@pytest.mark.parametrize("with_extra, dtype", [(False, torch.bfloat16), (True, torch.float32)])
@pytest.mark.parametrize("cfg", [dict(), dict(block_n=16, chunk=4)])
def test_gate_up_matches_reference(hidden, inter, experts, ids, with_extra, dtype, cfg, nan_empty, monkeypatch):
    """Whole experts a program (the interpreter's default) and masked row tiles with several group steps."""
    cfg = dict(cfg)  # (the parametrized dict is shared between cases)
    monkeypatch.setattr(nvfp4_experts_groups, "MAX_CHUNK", cfg.pop("chunk", 64))
    x, _, ids_t, rows, shared, _, _ = _problem(hidden, inter, experts, ids, hidden + with_extra, dtype)
    extra = shared[0] + shared[1] if with_extra else None
    rows16 = padded(rows)
    assert rows.stride(0) % 8 and nvfp4_experts_groups.groups_rows(rows16, True)
    steps = nvfp4_experts_groups._chunks(hidden, None)[1]
    assert steps == (1 if nvfp4_experts_groups.MAX_CHUNK == 64 else triton_steps(hidden, 4))
    out = expert_gate_up(*_dev(x, ids_t, rows16), hidden, inter, _to_dev(extra) if extra else None, groups=True,
                         **cfg)
    ref = expert_gate_up_reference(x, ids_t, rows, hidden, inter, extra)
    assert out.shape == ref.shape == (len(ids) + with_extra, inter) and out.dtype == torch.float32
    _close(out, ref)


@pytest.mark.parametrize("hidden, inter, experts, ids", SIZES)
@pytest.mark.parametrize("with_extra, with_scale, with_addend", [(False, False, False), (True, True, False),
                                                                 (True, False, False), (False, False, True)])
@pytest.mark.parametrize("cfg", [dict(), dict(block_m=16, chunk=2)])
def test_parts_match_reference(hidden, inter, experts, ids, with_extra, with_scale, with_addend, cfg, nan_empty,
                               monkeypatch):
    cfg = dict(cfg)  # (the parametrized dict is shared between cases)
    monkeypatch.setattr(nvfp4_experts_groups, "MAX_CHUNK", cfg.pop("chunk", 64))
    x, weights, ids_t, rows, shared, scale, addend = _problem(hidden, inter, experts, ids, inter + 3, torch.bfloat16)
    act = expert_gate_up_reference(x, ids_t, rows, hidden, inter, shared[0] + shared[1])
    kw = dict(extra=shared[2] if with_extra else None, extra_scale=scale if with_scale else None,
              addend=addend if with_addend else None)
    out = expert_down_parts(*_dev(act, weights, ids_t, padded(rows)), hidden, inter,
                            **{k: _to_dev(v) if v is not None else None for k, v in kw.items()}, groups=True, **cfg)
    ref = expert_down_parts_reference(act, weights, ids_t, rows, hidden, inter, **kw)
    assert out.shape == ref.shape == (len(ids) + 1, 1, hidden)
    _close(out, ref)


def test_the_shared_expert_alone_gives_the_joint_launchs_bytes(nan_empty):
    """The overlap runs the shared expert apart (ids [1, 0], beside the miss copy) and the routed ones with
    write_shared off: the same programs' arithmetic, so act and parts byte-equal to the joint launches."""
    hidden, inter = 160, 80
    x, weights, ids, rows, shared, scale, _ = _problem(hidden, inter, 6, [5, 0, 3], 9, torch.bfloat16)
    x, weights, ids, rows16, scale = _dev(x, weights, ids, padded(rows), scale)
    gate_up, down = _to_dev(shared[0] + shared[1]), _to_dev(shared[2])
    act = expert_gate_up(x, ids, rows16, hidden, inter, gate_up, groups=True)
    joint = expert_down_parts(act, weights, ids, rows16, hidden, inter, down, scale, groups=True)
    none = ids[:, :0]
    alone = expert_gate_up(x, none, rows16, hidden, inter, gate_up, groups=True)
    assert torch.equal(alone[0], act[3])
    parts = torch.empty(4, 1, hidden, device=x.device)
    expert_down_parts(alone, weights, none, rows16, hidden, inter, down, scale, out=parts[3:], groups=True)
    routed = expert_gate_up(x, ids, rows16, hidden, inter, None, groups=True)
    assert torch.equal(routed, act[:3])
    expert_down_parts(routed, weights, ids, rows16, hidden, inter, out=parts, write_shared=False, groups=True)
    assert torch.equal(parts, joint)


def test_every_code_and_scale_byte(nan_empty):
    """Rows of uniform random bytes (every E2M1 code; E4M3 scale bytes 0..255 less NaN, subnormals included):
    the fp16-pair decode and the exact decode give the reference, and the same bytes."""
    hidden, inter = 64, 32
    gen = torch.Generator().manual_seed(4)
    rows = random_nvfp4_rows(5, hidden, inter, generator=gen, scale_bits=(0, 256))
    ids = torch.tensor([[4, 1, 1, 0]])
    x = torch.randn(1, hidden, generator=gen)
    ref = expert_gate_up_reference(x, ids, rows, hidden, inter)
    decodes = ("asm", "fp16", "exact") if DEVICE == "cuda" else ("fp16", "exact")  # no inline PTX on the CPU
    fast, *others = (expert_gate_up(*_dev(x, ids, padded(rows)), hidden, inter, decode=d, groups=True)
                     for d in decodes)
    _close(fast, ref)
    assert all(torch.equal(fast, other) for other in others)
    weights = torch.rand(1, 4, generator=gen)
    parts = [expert_down_parts(*_dev(ref, weights, ids, padded(rows)), hidden, inter, decode=d, groups=True)
             for d in decodes]
    _close(parts[0], expert_down_parts_reference(ref, weights, ids, rows, hidden, inter))
    assert all(torch.equal(parts[0], other) for other in parts[1:])


def test_bank_and_slot_rows_give_identical_bytes(nan_empty):
    """The offloaded engine reads slot rows, the resident one its own rows, both at the 16-byte stride: act and
    parts byte-equal either way (one compiled code: pointers 16-byte aligned, the stride a kernel constant
    of the same value)."""
    hidden, inter = 96, 48
    x, weights, ids, bank, shared, scale, _ = _problem(hidden, inter, 7, [3, 6, 3, 1], 5, torch.bfloat16)
    bank = padded(bank)
    slots, slot_ids = slot_copy(bank, ids, extra=0)  # the same stride, another tensor and other slots
    got = []
    for rows, which in ((bank, ids), (slots, slot_ids)):
        rows_d, ids_d = _dev(rows, which)
        act = expert_gate_up(_dev(x)[0], ids_d, rows_d, hidden, inter, _to_dev(shared[0] + shared[1]), groups=True)
        got.append((act, expert_down_parts(act, _dev(weights)[0], ids_d, rows_d, hidden, inter, _to_dev(shared[2]),
                                           _dev(scale)[0], groups=True)))
    for a, b in zip(*got):
        assert torch.isfinite(a).all() and torch.equal(a, b)


def test_rows_without_an_8_byte_stride_keep_the_word_kernels(monkeypatch, nan_empty):
    """groups=True over rows the group words cannot read (the checkpoint's 4-byte-aligned stride): the
    4-byte-word kernels run instead, with their own bytes; the switch's default is off."""
    assert nvfp4_experts_groups.GROUPS is False
    hidden, inter = 96, 48
    x, weights, ids, rows, shared, scale, _ = _problem(hidden, inter, 7, [3, 6, 1], 2, torch.bfloat16)
    assert not nvfp4_experts_groups.groups_rows(rows, True) and nvfp4_experts_groups.groups_rows(padded(rows, 8), True)
    launched = []
    monkeypatch.setattr(nvfp4_experts_groups, "gate_up_groups", lambda *a, **k: launched.append(1))
    extra = _to_dev(shared[0] + shared[1])
    forced = expert_gate_up(*_dev(x, ids, rows), hidden, inter, extra, groups=True)
    plain = expert_gate_up(*_dev(x, ids, rows), hidden, inter, extra)
    assert not launched and torch.equal(forced, plain)
    _close(forced, expert_gate_up_reference(x, ids, rows, hidden, inter, shared[0] + shared[1]))


@pytest.mark.gpu
def test_gpu_real_shape_graph_replay_and_bank_vs_slots():
    """At the real shape on the GPU: CUDA-graph replay byte-equal to eager and a slot cache (another tensor,
    permuted slots, the same 16-byte stride) byte-equal to the bank, both kernels, close to the references."""
    h, i, e, k = 2048, 512, 16, 8
    gen = torch.Generator(device="cuda").manual_seed(0)
    bank = padded(random_nvfp4_rows(e, h, i, "cuda", gen).cpu()).cuda()
    shared = tuple(_to_dev(t) for t in _problem(h, i, 1, [0], 1)[4])
    x = torch.randn(1, h, device="cuda", generator=gen).to(torch.bfloat16)
    ids = torch.randperm(e, device="cuda", generator=gen)[:k][None]
    w = torch.softmax(torch.randn(1, k, device="cuda", generator=gen), -1).to(torch.bfloat16)
    scale = torch.sigmoid(torch.randn(1, device="cuda", generator=gen))

    def step(rows, which):
        act = expert_gate_up(x, which, rows, h, i, shared[0] + shared[1], groups=True)
        return act, expert_down_parts(act, w, which, rows, h, i, shared[2], scale, groups=True)

    eager = step(bank, ids)
    _close(eager[0], expert_gate_up_reference(x, ids, bank, h, i, shared[0] + shared[1]))
    _close(eager[1], expert_down_parts_reference(eager[0], w, ids, bank, h, i, shared[2], scale))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = step(bank, ids)
    graph.replay()
    assert all(torch.equal(a, b) for a, b in zip(replayed, eager))
    perm = torch.randperm(e, device="cuda", generator=gen)  # slot s holds expert perm[s]
    slots = torch.zeros_like(bank)
    slots.copy_(bank[perm])
    assert all(torch.equal(a, b) for a, b in zip(step(slots, torch.argsort(perm)[ids]), eager))
