"""Decode overlap control flow with fake streams and events (CPU): both splits fork and join in the right
order, errors in either callback still join, "off" is the serial sequence, and the engine falls back to
serial where the overlap does not apply. The GPU byte-equality test and its negative control are GPU-tier."""
import contextlib

import pytest

from qwenlocal.engine.offload.overlap import DecodeOverlap


class FakeStream:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def wait_event(self, event):
        self.log.append(f"{self.name}.wait({event.name})")


class FakeEvent:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def record(self, stream):
        self.log.append(f"{stream.name}.record({self.name})")


class FakeStreams:
    def __init__(self):
        self.log = []
        self.compute = FakeStream("compute", self.log)
        self.side = FakeStream("side", self.log)
        self.ready, self.done = FakeEvent("ready", self.log), FakeEvent("done", self.log)
        self._current = self.compute

    def current(self):
        return self._current

    @contextlib.contextmanager
    def on(self, stream):
        before, self._current = self._current, stream
        try:
            yield
        finally:
            self._current = before

    def keep_alive(self, tensor, stream):
        self.log.append(f"keep_alive({tensor}, {stream.name})")


def run(split, copy_raises=False, shared_raises=False, join=True):
    s = FakeStreams()

    def copy():
        s.log.append(f"copy@{s.current().name}")
        if copy_raises:
            raise RuntimeError("copy failed")

    def shared():
        s.log.append(f"shared@{s.current().name}")
        if shared_raises:
            raise RuntimeError("shared failed")
        return "out"

    overlap = DecodeOverlap(split, s, join=join)
    return overlap.run(copy, shared, "x"), s.log


def test_copy_side_forks_the_copy_and_joins_before_the_routed_gemm():
    out, log = run("copy-side")
    assert out == "out"
    assert log == ["compute.record(ready)", "side.wait(ready)", "copy@side", "shared@compute",
                   "side.record(done)", "compute.wait(done)"]


def test_shared_side_forks_the_shared_expert_and_keeps_the_copy_on_compute():
    out, log = run("shared-side")
    assert out == "out"
    assert log == ["compute.record(ready)", "side.wait(ready)", "keep_alive(x, side)", "shared@side", "copy@compute",
                   "side.record(done)", "compute.wait(done)", "keep_alive(out, compute)"]


def test_off_is_the_serial_sequence_with_no_stream_operations():
    out, log = DecodeOverlap("off").run(lambda: None, lambda: "serial"), []
    assert out == "serial"
    s = FakeStreams()
    DecodeOverlap("off", s).run(lambda: s.log.append("copy"), lambda: s.log.append("shared"))
    assert s.log == ["copy", "shared"]


@pytest.mark.parametrize("split", ["copy-side", "shared-side"])
@pytest.mark.parametrize("which", ["copy", "shared"])
def test_an_error_in_either_half_still_joins(split, which):
    s = FakeStreams()
    overlap = DecodeOverlap(split, s)

    def copy():
        if which == "copy":
            raise RuntimeError("copy failed")

    def shared():
        if which == "shared":
            raise RuntimeError("shared failed")

    with pytest.raises(RuntimeError):
        overlap.run(copy, shared)
    assert s.log[-2:] == ["side.record(done)", "compute.wait(done)"]


def test_negative_control_switch_drops_the_join():
    _, log = run("copy-side", join=False)
    assert "compute.wait(done)" not in log


def test_bad_split_and_missing_streams_are_refused():
    with pytest.raises(ValueError):
        DecodeOverlap("sideways")
    with pytest.raises(ValueError):
        DecodeOverlap("copy-side")


def test_engine_falls_back_to_serial_where_the_overlap_does_not_apply(tiny_ckpt):
    from qwenlocal.engine import Engine

    cpu_forced = Engine.from_pretrained(tiny_ckpt, device="cpu", options={"overlap": "copy-side", "expert_slots": 20})
    assert cpu_forced.plan["overlap"]["value"] == "off" and "CPU" in cpu_forced.plan["overlap"]["reason"]
    assert all(layer.moe.overlap.split == "off" for layer in cpu_forced.model.layers)


def test_auto_overlap_follows_the_machine_plan(monkeypatch):
    """auto: the plan's split on a GPU with offloaded experts; off where the plan says off, without a plan,
    on the CPU and with every expert resident. Forced values stay."""
    import torch

    from qwenlocal.engine import api, choices
    from qwenlocal.engine.options import EngineOptions
    from qwenlocal.engine.plan import ModelFacts, resolve_plan
    from qwenlocal.engine.probe import fake
    from qwenlocal.engine.synthetic import synthetic_config

    monkeypatch.setattr(choices, "CudaStreams", lambda device: ("fake streams", device))
    facts = ModelFacts.from_config(synthetic_config("synthetic:qwen3.6-35b-a3b", 0), expert_dtype_bytes=2)
    opts = EngineOptions(vram_budget="16GiB")
    cuda, cache = torch.device("cuda"), object()
    native = resolve_plan(fake.linux_pcie5_x16(), facts, opts, device="cuda")
    wsl = resolve_plan(fake.wsl2_rtx5070ti(), facts, opts, device="cuda")
    assert (native.overlap, wsl.overlap) == ("copy-side", "shared-side")
    for plan in (native, wsl):
        chosen, why = api.choose_overlap(opts, cuda, cache, plan)
        assert chosen.split == plan.overlap and why.startswith("auto:") and chosen.streams[0] == "fake streams"
    assert api.choose_overlap(opts, cuda, cache, None)[0].split == "off"
    assert api.choose_overlap(opts, cuda, None, native)[0].split == "off"  # all resident: nothing to hide
    assert api.choose_overlap(opts, torch.device("cpu"), cache, native)[0].split == "off"
    forced = EngineOptions(vram_budget="16GiB", overlap="shared-side")
    assert api.choose_overlap(forced, cuda, cache, native)[0].split == "shared-side"
    assert api.choose_overlap(EngineOptions(overlap="off"), cuda, cache, native)[0].split == "off"
