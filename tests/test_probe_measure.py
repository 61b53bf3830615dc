"""The measurement on a CPU machine: host parsing, NVML answers faked, a GPU faked step by step (no CUDA here)."""
from __future__ import annotations

import sys
import types

import pytest

from qwenlocal.engine.probe import host, measure, nvml
from qwenlocal.engine.probe.profile import HardwareProfile, fact_names, read

GIB = 2**30
MEMINFO = "MemTotal:       32768000 kB\nMemFree:         1000000 kB\nMemAvailable:   30000000 kB\n"


def test_wsl2_is_read_from_the_kernel_string() -> None:
    wsl = host.os_facts(proc_version="Linux version 5.15.167.4-microsoft-standard-WSL2 (root@...)",
                        release="5.15.167.4-microsoft-standard-WSL2")
    native = host.os_facts(proc_version="Linux version 6.8.0-45-generic (buildd@...)", release="6.8.0-45-generic")
    if wsl["os_name"].value == "Linux":
        assert wsl["wsl2"].value is True and "Microsoft" in wsl["wsl2"].note
        assert native["wsl2"].value is False
    assert wsl["wsl2"].source == "read"


def test_meminfo_and_the_pinnable_estimate() -> None:
    total, avail, where = host.meminfo(MEMINFO)
    assert total == 32768000 * 1024 and avail == 30000000 * 1024 and where == "/proc/meminfo"
    native = host.pinnable_estimate(total, avail, capped=False)
    capped = host.pinnable_estimate(total, avail, capped=True)
    assert native.source == capped.source == "assumed"
    assert capped.value == total // 2 < native.value < avail
    assert "half of RAM" in capped.note
    assert host.pinnable_estimate(None, None, False).source == "unavailable"


def test_measure_on_this_machine_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QWENLOCAL_NO_CUDA", "1")
    profile = measure.measure_profile()
    assert profile.cuda_available.value is False and "QWENLOCAL_NO_CUDA" in profile.cuda_available.note
    for name in set(measure.GPU_FACTS) - {"torch_version"}:  # torch's version is still worth saying
        assert getattr(profile, name).source == "unavailable", name
    assert profile.host_ram_total.known and profile.cpu_cores.known and profile.os_name.known
    assert HardwareProfile.from_dict(profile.to_dict()) == profile
    assert measure.identify().gpu == "no-cuda"


def _fake_gpu(monkeypatch: pytest.MonkeyPatch, fail: set[str]) -> None:
    """Pretend there is a GPU: every measurement step returns figures, or raises when named in `fail`."""
    monkeypatch.setattr(measure, "cuda_status", lambda: (True, "fake CUDA"))

    def step(name, value):
        def run(*args, **kwargs):
            if name in fail:
                raise RuntimeError(f"{name} broke")
            return value
        return run

    monkeypatch.setattr(measure, "device_facts", step("device", {
        "gpu_name": read("Fake GPU"), "gpu_uuid": read("GPU-fake"), "compute_capability": read("9.0"),
        "sm_count": read(132), "vram_total": read(80 * GIB), "vram_free": read(79 * GIB),
        "cuda_version": read("13.0"), "torch_version": read("2.11")}))
    monkeypatch.setattr(measure, "copy_engine_count", lambda index: read(3, "fake"))
    monkeypatch.setattr(measure.bandwidth, "pinned", step("pinned", {
        "h2d_ms": 5.0, "d2h_ms": 5.0, "bidir_ms": 6.0, "h2d_gbps": 53.7, "d2h_gbps": 53.6, "bidir_gbps": 89.5}))
    monkeypatch.setattr(measure.bandwidth, "pageable", step("pageable", {
        "h2d_ms": 45.0, "d2h_ms": 40.0, "h2d_gbps": 6.0, "d2h_gbps": 6.7}))
    monkeypatch.setattr(measure.bandwidth, "expert_gather", step("gather", {"ms": 1.05, "gbps": 47.5}))
    monkeypatch.setattr(measure.bandwidth, "copy_compute_overlap", step("overlap", {
        "copy_ms": 5.0, "compute_ms": 5.2, "both_ms": 5.6, "matmuls": 35.0, "hidden": 0.92}))
    monkeypatch.setattr(measure, "nvml_facts", step("nvml", {
        "driver_version": read("580.1"), "pcie_gen": read(5), "pcie_width": read(16), "pcie_gen_max": read(5),
        "pcie_width_max": read(16), "driver_model": read("n/a")}))
    monkeypatch.setattr(measure, "driver_version_fallback", lambda: read("580.1", "fallback"))


def test_measure_with_a_faked_gpu_fills_every_fact(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_gpu(monkeypatch, fail=set())
    p = measure.measure_profile()
    assert p.has_cuda and p.value("copy_engines") == 3
    assert p.h2d_pinned_gbps.source == "measured" and p.value("h2d_pinned_gbps") == 53.7
    assert p.value("h2d_overlaps_compute") is True and "92%" in p.h2d_overlaps_compute.note
    assert p.value("pcie_gen") == 5 and p.value("driver_version") == "580.1"
    unknown = [n for n in fact_names() if not getattr(p, n).known]
    assert unknown == ["overlap_microbench"]


@pytest.mark.parametrize("broken", ["pinned", "pageable", "gather", "overlap", "nvml", "device"])
def test_a_failing_step_leaves_its_facts_unavailable_and_the_rest_measured(monkeypatch: pytest.MonkeyPatch,
                                                                           broken: str) -> None:
    _fake_gpu(monkeypatch, fail={broken})
    p = measure.measure_profile()
    owned = {"pinned": ["h2d_pinned_gbps", "d2h_pinned_gbps", "bidir_pinned_gbps"],
             "pageable": ["h2d_pageable_gbps", "d2h_pageable_gbps"], "gather": ["h2d_expert_gather_gbps"],
             "overlap": ["h2d_overlaps_compute"], "nvml": ["pcie_gen", "pcie_width"],
             "device": ["gpu_name", "vram_free"]}[broken]
    for name in owned:
        fact = getattr(p, name)
        assert fact.source == "unavailable" and f"{broken} broke" in fact.note, (name, fact)
    assert p.has_cuda and p.value("copy_engines") == 3
    if broken == "nvml":
        assert p.driver_version.note == "fallback"  # the driver version still comes from elsewhere


class _NVMLError(Exception):
    pass


def _fake_pynvml(monkeypatch: pytest.MonkeyPatch, *, pcie_supported: bool, model: int = 0) -> None:
    mod = types.ModuleType("pynvml")

    def not_supported(*a):
        raise _NVMLError("Not Supported")

    mod.nvmlInit = lambda: None
    mod.nvmlShutdown = lambda: None
    mod.nvmlSystemGetDriverVersion = lambda: "581.57"
    mod.nvmlDeviceGetHandleByUUID = lambda uuid: "handle" if uuid == "GPU-1" else not_supported()
    mod.nvmlDeviceGetCount = lambda: 2
    mod.nvmlDeviceGetHandleByIndex = lambda i: f"h{i}"
    mod.nvmlDeviceGetName = lambda h: "GPU A" if h == "h0" else "GPU B"
    for fn, value in (("nvmlDeviceGetCurrPcieLinkGeneration", 5), ("nvmlDeviceGetCurrPcieLinkWidth", 16),
                      ("nvmlDeviceGetMaxPcieLinkGeneration", 5), ("nvmlDeviceGetMaxPcieLinkWidth", 16)):
        setattr(mod, fn, (lambda v: (lambda h: v))(value) if pcie_supported else not_supported)
    mod.nvmlDeviceGetDriverModel = lambda h: [model, model]
    monkeypatch.setitem(sys.modules, "pynvml", mod)


def test_nvml_under_wsl2_says_what_it_could_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_pynvml(monkeypatch, pcie_supported=False)
    facts = nvml.nvml_facts("GPU-1", "GPU A", windows=False)
    assert facts["driver_version"].value == "581.57"
    assert facts["pcie_gen"].source == "unavailable" and "Not Supported" in facts["pcie_gen"].note


def test_nvml_matches_by_uuid_then_by_name_and_reads_the_windows_driver_model(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_pynvml(monkeypatch, pcie_supported=True, model=1)
    by_uuid = nvml.nvml_facts("GPU-1", None, windows=True)
    assert by_uuid["pcie_gen"].value == 5 and "UUID" in by_uuid["pcie_gen"].note
    assert by_uuid["driver_model"].value == "TCC"
    by_name = nvml.nvml_facts("GPU-unknown", "GPU B", windows=False)
    assert by_name["pcie_width"].value == 16 and "name" in by_name["pcie_width"].note
    lost = nvml.nvml_facts(None, None, windows=False)  # two devices, nothing to match on
    assert lost["pcie_gen"].source == "unavailable" and lost["driver_version"].known


def test_nvml_missing_entirely(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    facts = nvml.nvml_facts("GPU-1", "x", windows=False)
    assert all(f.source == "unavailable" and "nvidia-ml-py" in f.note for f in facts.values())
