"""nvfp4_experts_parts.PRELOAD: where the MoE down launch routes itself (ROUTE) on the group path (GROUPS), each
program loads its rows' code words and scale bytes before the PDL wait, and only the activations after it. In
Triton's interpreter on awkward sizes: the parts (and the tile sums the step takes) are the group path's bytes, for
the routed experts, the shared expert, a shared addend and none, under a routing trace too; without ROUTE or
GROUPS the switch changes nothing. In the sm_90 code compiled here (no GPU): the code words (ld.global.v2.b32), the
scale bytes (ld.global.u8) and the global scale come before griddepcontrol.wait, every activation
(ld.global.v4.f32) after it; without the switch no weight is loaded before the wait (the negative control).
That the engine's step keeps its bytes through the graph with programmatic launch is the GPU tier's
(tests/test_gpu_decode_fused.py, the switches that move no byte)."""
import re

import pytest
import torch

pytest.importorskip("triton")

from qwenlocal.engine.kernels import nvfp4_experts_parts  # noqa: E402
from qwenlocal.engine.kernels.decode_router import route_topk  # noqa: E402
from qwenlocal.engine.kernels.launch import new_counter  # noqa: E402
from qwenlocal.engine.kernels.nvfp4_experts_parts import expert_down_parts  # noqa: E402
from qwenlocal.engine.quant.nvfp4_rows import padded_rows  # noqa: E402
from sass_support import sm90_json  # noqa: E402
from test_down_route import _COMPILE, _logits  # noqa: E402
from test_decode_fused import _engine, quantized_ckpt  # noqa: E402,F401 (the fixture, by name)
from test_kernels_nvfp4_experts_decode import DEVICE, _dev, _problem  # noqa: E402


def _case(hidden, inter, experts, k, seed):
    _, _, _, rows, shared, scale, _ = _problem(hidden, inter, experts, [0] * k, seed)
    logits = _logits(experts, seed + 1)
    weights, ids, _ = route_topk(logits, experts, k, torch.bfloat16)
    act = torch.randn(k + 1, inter, generator=torch.Generator().manual_seed(seed + 2)).to(DEVICE)
    (rows,) = _dev(padded_rows(rows, hidden, inter))
    return act, weights, ids, rows, logits, _dev(shared[2])[0], _dev(scale)[0]


def _both(monkeypatch, call):
    """call() with the rows loaded after the wait, then before it (ROUTE and GROUPS on in both)."""
    monkeypatch.setattr(nvfp4_experts_parts, "ROUTE", True)
    monkeypatch.setattr(nvfp4_experts_parts, "GROUPS", True)
    monkeypatch.setattr(nvfp4_experts_parts, "PRELOAD", False)
    want = call()
    monkeypatch.setattr(nvfp4_experts_parts, "PRELOAD", True)
    return want, call()


@pytest.mark.parametrize("hidden, inter, experts, k, shared", [(160, 48, 12, 5, "extra"), (96, 32, 33, 8, "addend"),
                                                               (112, 80, 9, 3, "none")])
def test_the_rows_loaded_before_the_wait_give_the_group_paths_parts(hidden, inter, experts, k, shared,
                                                                    monkeypatch):
    act, weights, ids, rows, logits, extra, scale = _case(hidden, inter, experts, k, 11)
    kw = {"extra": dict(extra=extra, extra_scale=scale), "none": {},
          "addend": dict(addend=torch.randn(1, hidden).to(DEVICE))}[shared]
    want, got = _both(monkeypatch, lambda: expert_down_parts(act, weights, ids, rows, hidden, inter,
                                                             route=(logits, experts, False), **kw))
    assert torch.isfinite(got).all() and got[:k].abs().sum() > 0 and torch.equal(got, want)


def test_the_tile_sums_and_a_trace_keep_their_bytes(monkeypatch):
    hidden, inter, experts, k = 144, 48, 20, 4
    act, weights, _, rows, logits, extra, scale = _case(hidden, inter, experts, k, 21)
    trace = torch.tensor([[7, 3, 19, 3]], device=DEVICE)
    x = torch.randn(1, hidden).to(torch.bfloat16).to(DEVICE)
    tiles = -(-hidden // nvfp4_experts_parts.BLOCK_M)

    def step():  # the engine's call: the shared part written before (write_shared=False), the tile sums after
        parts = torch.zeros(k + 1, 1, hidden, device=DEVICE)
        return expert_down_parts(act, weights, trace, rows, hidden, inter, out=parts, write_shared=False,
                                 route=(logits, experts, True), sums=(x, new_counter(x.device, tiles)))

    (want_x, want_sums), (got_x, got_sums) = _both(monkeypatch, step)
    assert torch.equal(got_x, want_x) and torch.equal(got_sums, want_sums) and got_sums.abs().sum() > 0


def test_without_the_route_or_the_group_path_the_switch_changes_nothing(monkeypatch):
    hidden, inter, experts, k = 96, 32, 10, 3
    act, weights, ids, rows, logits, extra, scale = _case(hidden, inter, experts, k, 31)
    kw = dict(extra=extra, extra_scale=scale)
    for route, groups in ((None, True), ((logits, experts, False), False)):
        monkeypatch.setattr(nvfp4_experts_parts, "ROUTE", route is not None)
        monkeypatch.setattr(nvfp4_experts_parts, "PRELOAD", False)
        want = expert_down_parts(act, weights, ids, rows, hidden, inter, route=route, groups=groups, **kw)
        monkeypatch.setattr(nvfp4_experts_parts, "PRELOAD", True)
        assert torch.equal(expert_down_parts(act, weights, ids, rows, hidden, inter, route=route, groups=groups,
                                             **kw), want)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU tier's: Triton's interpreter runs the CPU engine's "
                    "fused kernels (the GPU tier's step gate is test_gpu_decode_fused's switches7)")
def test_every_down_launch_of_the_step_takes_it_and_the_logits_keep_their_bytes(quantized_ckpt,  # noqa: F811
                                                                                monkeypatch):
    """The engine's step (resident experts, gate/up routing itself, bf16 as on a GPU): with the switch every down
    launch of both decode steps loads its rows before the wait, and the logits are the group path's bytes."""
    ids = torch.randint(0, 600, (24 + 2,), generator=torch.Generator().manual_seed(9))
    eng = _engine(quantized_ckpt, True, dtype=torch.bfloat16)
    launches, kernel = [], nvfp4_experts_parts.expert_down_parts_kernel

    class Spy:  # the launch's PRELOAD, then the real launch
        def __getitem__(self, grid):
            return lambda *a, **k: launches.append(k.get("PRELOAD", False)) or kernel[grid](*a, **k)

    monkeypatch.setattr(nvfp4_experts_parts, "expert_down_parts_kernel", Spy())
    want, got = _both(monkeypatch, lambda: eng.score(ids, prefill=24))
    steps = 2 * len(eng.model.layers)
    assert launches == [False] * steps + [True] * steps
    assert torch.isfinite(got).all() and torch.equal(got, want)


def _edited(source: str, *edits: tuple[str, str]) -> str:
    """source with each (old, new) replaced, every old there once (so that an edit of the source cannot be lost)."""
    for old, new in edits:
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    return source


# test_down_route's compile on the group path: early 1 (the route alone), 3 (the route and the switch)
_PRELOAD_COMPILE = _edited(_COMPILE, ("for early in (0, 1, 2):", "for early in (1, 3):"),
                           ("GROUPS=False,", "GROUPS=True,"),
                           ("EARLY_ROUTE=early,", "EARLY_ROUTE=1, PRELOAD=early == 3,"))


def _split_loads(ptx: str) -> tuple[list, list]:
    """The global loads' opcodes before and after griddepcontrol.wait, inline PTX blocks' included."""
    lines = ptx.splitlines()
    wait = next(i for i, t in enumerate(lines) if t.strip().startswith("griddepcontrol.wait"))
    ops = [(i, op) for i, t in enumerate(lines) for op in re.findall(r"ld\.global[.\w]*", t)]
    return [op for i, op in ops if i < wait], [op for i, op in ops if i > wait]


def test_sm90_code_loads_the_rows_before_the_wait_and_the_activations_after(tmp_path):
    out = sm90_json(_PRELOAD_COMPILE, tmp_path)
    before, after = _split_loads(out["3"])
    assert "ld.global.v2.b32" in before and "ld.global.u8" in before, before  # the code words, the scale bytes
    assert "ld.global.v4.f32" in after and "ld.global.v4.f32" not in before  # the activations: after the wait
    assert "ld.global.v2.b32" not in after and "ld.global.u8" not in after, after
    # the negative control: the route alone reads only the logits before the wait (from L2), the rows after it
    before, after = _split_loads(out["1"])
    assert before and all(".cg" in op for op in before) and "ld.global.v2.b32" in after
