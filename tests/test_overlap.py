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
    """auto: the hardware rule's split on a GPU with offloaded experts; off on the CPU and with every expert
    resident. Forced values stay; the built DecodeOverlap is the config's split."""
    import torch

    from qwenlocal.engine import choices
    from qwenlocal.engine.engine_config import Software
    from qwenlocal.engine.memory import ModelInfo
    from qwenlocal.engine.options import EngineOptions
    from qwenlocal.engine.probe import fake
    from qwenlocal.engine.resolve import resolve
    from qwenlocal.engine.synthetic import synthetic_config

    monkeypatch.setattr(choices, "CudaStreams", lambda device: ("fake streams", device))
    info = ModelInfo.from_config(synthetic_config("synthetic:qwen3.6-35b-a3b", 0))
    sw = Software(triton=True, flashinfer=True, fla=True)
    opts = EngineOptions(vram_budget="16GiB")
    cuda = torch.device("cuda")
    native = resolve(opts, info, fake.linux_pcie5_x16(), "cuda", sw)
    wsl = resolve(opts, info, fake.wsl2_rtx5070ti(), "cuda", sw)
    assert native.offloaded and wsl.offloaded
    assert (native.overlap, wsl.overlap) == ("copy-side", "shared-side")
    for config in (native, wsl):
        built = choices.build_overlap(config, cuda)
        assert built.split == config.overlap and built.streams[0] == "fake streams"
    resident = resolve(EngineOptions(), info, fake.h200(), "cuda", sw)
    assert not resident.offloaded and resident.overlap == "off"  # all resident: nothing to hide
    assert choices.build_overlap(resident, cuda).split == "off"
    assert resolve({"expert_slots": 20}, info, None, "cpu", sw).overlap == "off"  # the CPU engine has no probe
    forced = resolve(EngineOptions(vram_budget="16GiB", overlap="shared-side"), info, fake.linux_pcie5_x16(), "cuda", sw)
    assert forced.overlap == "shared-side" and "overridden by user" in forced.reason("overlap")
    assert resolve(EngineOptions(overlap="off", vram_budget="16GiB"), info, fake.linux_pcie5_x16(), "cuda",
                   sw).overlap == "off"
    # Forced where it cannot apply (every expert resident): the config says it runs off, and why.
    idle = resolve(EngineOptions(overlap="copy-side"), info, fake.h200(), "cuda", sw)
    assert idle.overlap == "off" and "runs off" in idle.reason("overlap")


def test_microbench_schedule_gives_exactly_the_asked_misses_per_step():
    """The micro-bench's premise, on the real slot cache (CPU tensors): with k + m or more slots, each step of
    the schedule misses exactly m experts, so every split copies the same bytes."""
    import torch

    from qwenlocal.engine.offload.bank import HostExpertBank
    from qwenlocal.engine.offload.cache import ExpertSlotCache
    from qwenlocal.engine.probe.overlap_bench import miss_schedule
    from test_offload import small_cfg

    cfg = small_cfg(experts=40, top_k=3, layers=1)
    for misses in (1, 2, 3):
        cache = ExpertSlotCache(cfg, HostExpertBank(cfg, torch.float32, pin=False), 2 * (3 + misses),
                                torch.device("cpu"))
        sched = miss_schedule(60, 40, 3, misses)
        counts = []
        for row in sched:
            _, plan = cache.ensure(0, row[None])
            cache.copy_missing(plan)
            counts.append(int(plan.count))
        assert counts[0] == 3 and set(counts[1:]) == {misses}
    with pytest.raises(ValueError):
        miss_schedule(4, 12, 3, 0)


def test_microbench_summary_feeds_the_plan():
    from qwenlocal.engine.plan import _auto_overlap
    from qwenlocal.engine.probe import fake
    from qwenlocal.engine.probe.overlap_bench import describe, summarize

    detail = {"us_per_step": 100.0, "misses_per_step": 2, "expert_bytes": 1_769_484}
    per_split = {"off": dict(detail), "copy-side": {**detail, "us_per_step": 96.0, "copy_start_slip_us": 3.0,
                                                     "shared_ends_inside_copy": 0.9},
                 "shared-side": {**detail, "us_per_step": 98.0, "copy_start_slip_us": 1.0,
                                 "shared_ends_inside_copy": 0.5}}
    summary = summarize(per_split)
    assert summary["copy-side"] == 96.0 and "copy starts 3.0 us after the fork" in describe(summary)
    times = {k: summary[k] for k in ("off", "copy-side", "shared-side")}
    split, why = _auto_overlap(fake.wsl2_rtx5070ti(microbench=times), "cuda", False)
    assert split == "copy-side" and "micro-bench" in why  # the measurement beats the one-copy-engine rule
