"""GatedDeltaNet's chunked core replayed from one graph per full prefill chunk (kernels/gdn_graph.py): the
wrapper's buffers and fall-backs on the CPU, with a stand-in graph that replays the captured call into the
captured outputs (a CUDA graph's contract); the real graphs natively in tests/test_gpu_gdn_graph.py."""
import pytest
import torch

from qwenlocal.engine.errors import OptionError
from qwenlocal.engine.kernel_rules import kernel_choices
from qwenlocal.engine.kernels.gdn_graph import ChunkGraphs
from qwenlocal.engine.kernels.gdn_torch import gdn_core_torch


def stand_in_graph(fn):
    """What a CUDA graph does: the captured call's outputs are fixed buffers, each replay rewrites them from
    the (static) inputs the capture saw."""
    outputs = fn()

    def replay():
        for buf, value in zip(outputs, fn()):
            buf.copy_(value)
    return replay, outputs, 0


def _chunk(t, seed, hk=2, hv=4, d=16):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(t, hk, d, generator=gen), torch.randn(t, hk, d, generator=gen),
            torch.randn(t, hv, d, generator=gen), -torch.rand(t, hv, generator=gen),
            torch.rand(t, hv, generator=gen), torch.randn(hv, d, d, generator=gen) * 0.1)


def test_every_full_chunk_replays_one_capture_with_its_own_inputs():
    graphs = ChunkGraphs(gdn_core_torch, 24, graph_factory=stand_in_graph)
    for seed in range(4):  # other values each time: the replay must read this call's, not the capture's
        args = _chunk(24, seed)
        want = gdn_core_torch(*args, False)
        got = graphs(*args, False)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert (graphs.captures, graphs.replays, graphs.plain_calls) == (1, 4, 0)


def test_decode_a_partial_chunk_and_the_switch_take_the_plain_call():
    graphs = ChunkGraphs(gdn_core_torch, 24, graph_factory=stand_in_graph)
    short = _chunk(7, 1)
    assert all(torch.equal(a, b) for a, b in zip(graphs(*short, False), gdn_core_torch(*short, False)))
    one = _chunk(1, 2)
    assert all(torch.equal(a, b) for a, b in zip(graphs(*one, True), gdn_core_torch(*one, True)))
    graphs.enabled = False
    full = _chunk(24, 3)
    assert all(torch.equal(a, b) for a, b in zip(graphs(*full, False), gdn_core_torch(*full, False)))
    assert (graphs.captures, graphs.replays, graphs.plain_calls) == (0, 0, 3)


def test_a_replay_without_the_input_copy_gives_other_bytes(monkeypatch):
    """Negative control: the static buffers keep the capture's values unless each call copies its own in."""
    graphs = ChunkGraphs(gdn_core_torch, 24, graph_factory=stand_in_graph)
    graphs(*_chunk(24, 0), False)
    args = _chunk(24, 1)
    monkeypatch.setattr(torch.Tensor, "copy_", lambda self, src, *a, **k: self)  # no copy reaches the buffers
    stale = [t.clone() for t in graphs(*args, False)]
    monkeypatch.undo()
    want = gdn_core_torch(*args, False)
    assert not torch.equal(stale[0], want[0])


def test_a_new_geometry_captures_again():
    graphs = ChunkGraphs(gdn_core_torch, 24, graph_factory=stand_in_graph)
    graphs(*_chunk(24, 0), False)
    wide = _chunk(24, 1, hk=3, hv=6)
    assert all(torch.equal(a, b) for a, b in zip(graphs(*wide, False), gdn_core_torch(*wide, False)))
    assert graphs.captures == 2


def test_the_option_resolves_to_the_gdn_kernel_and_refuses_what_cannot_run():
    from qwenlocal.engine.engine_config import Software
    from qwenlocal.engine.options import EngineOptions
    from test_resolve import BIG_NVFP4 as model

    every = Software(triton=True, flashinfer=True, fla=True)
    on = kernel_choices(model, "cuda", "bfloat16", "auto", every, (9, 0), gdn_graphs="on")
    assert on["gdn"][0] == "fla-graphs" and "CUDA graph" in on["gdn"][1]
    assert kernel_choices(model, "cuda", "bfloat16", "auto", every, (9, 0))["gdn"][0] == "fla"
    assert kernel_choices(model, "cuda", "bfloat16", "auto", every, (9, 0), gdn_graphs="off")["gdn"][0] == "fla"
    with pytest.raises(OptionError, match="gdn_graphs=on needs fla"):
        kernel_choices(model, "cuda", "bfloat16", "auto", Software(triton=True), (9, 0), gdn_graphs="on")
    with pytest.raises(OptionError, match="gdn_graphs=on needs a CUDA GPU"):
        kernel_choices(model, "cpu", "float32", "auto", every, None, gdn_graphs="on")
    with pytest.raises(OptionError, match="gdn_graphs"):
        EngineOptions(gdn_graphs="yes")


def test_the_engine_wraps_fla_only_when_the_config_says_fla_graphs():
    """build_kernels makes the wrapper for "fla-graphs" on a CUDA device (nothing is allocated until a call),
    keyed on the plan's prefill chunk; "fla" stays the plain function."""
    from qwenlocal.engine.kernels.gdn_fla import gdn_core_fla
    from qwenlocal.engine.model.kernels import build_kernels

    class Cfg:  # the parts build_kernels reads
        class attention:
            num_heads, num_kv_heads, head_dim = 4, 2, 16

        class moe:
            intermediate_size = 32
        hidden_size = 64

    choices = {"attention": ("sdpa", ""), "gdn": ("fla-graphs", ""), "moe": ("torch", ""),
               "decode": ("reference", ""), "prefill_kernels": ("torch", "")}
    wrapped = build_kernels(Cfg, torch.device("cuda"), torch.bfloat16, 64, choices, 2048).gdn
    assert isinstance(wrapped, ChunkGraphs) and wrapped.core is gdn_core_fla and wrapped.tokens == 2048
    choices["gdn"] = ("fla", "")
    assert build_kernels(Cfg, torch.device("cuda"), torch.bfloat16, 64, choices, 2048).gdn is gdn_core_fla
