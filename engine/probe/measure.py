"""Measure this machine: the one function that builds a HardwareProfile from the real hardware.

Each step is guarded on its own: a step that fails leaves its facts unavailable with the reason, and the probe
still returns a profile. No GPU, no NVML, an old driver: the profile says so instead of raising.
torch is imported inside functions only.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable

from . import bandwidth
from .device import copy_engine_count, cuda_status, device_facts, driver_version_fallback
from .host import host_facts, pinnable_estimate, ram_facts
from .nvml import nvml_driver_version, nvml_facts
from .profile import Fact, HardwareProfile, assumed, fact_names, measured, read, unavailable

GPU_FACTS = ("gpu_name", "gpu_uuid", "compute_capability", "sm_count", "vram_total", "vram_free", "driver_version",
             "cuda_version", "torch_version", "pcie_gen", "pcie_width", "pcie_gen_max", "pcie_width_max",
             "copy_engines", "h2d_pinned_gbps", "d2h_pinned_gbps", "h2d_pageable_gbps", "d2h_pageable_gbps",
             "bidir_pinned_gbps", "h2d_expert_gather_gbps", "h2d_overlaps_compute", "driver_model")
DEPTHS = {"quick": bandwidth.QUICK, "full": bandwidth.FULL}


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("qwenlocal")
    except PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True)
class GpuIdentity:
    """What keys the cache: the GPU (UUID, else name; "no-cuda" without one) and the driver version."""

    gpu: str
    driver: str
    name: str | None = None


def identify(index: int = 0) -> GpuIdentity:
    """Cheap: which GPU and driver this is, without timing anything."""
    ok, _why = cuda_status()
    if not ok:
        return GpuIdentity(gpu="no-cuda", driver="none")
    import torch

    from .device import torch_uuid

    props = torch.cuda.get_device_properties(index)
    driver = nvml_driver_version()
    if driver is None:
        fallback = driver_version_fallback()
        driver = str(fallback.value) if fallback.known else "unknown"
    return GpuIdentity(gpu=torch_uuid(props) or props.name, driver=driver, name=props.name)


def _guard(facts: dict[str, Fact], names: tuple[str, ...], step: Callable[[], dict[str, Fact]], what: str) -> None:
    try:
        facts.update(step())
    except Exception as exc:  # noqa: BLE001 - any failure becomes "unavailable, because ..."
        why = f"{what} failed: {type(exc).__name__}: {exc}"[:200]
        for name in names:
            facts.setdefault(name, unavailable(why))


def _mb(nbytes: int) -> str:
    return f"{nbytes // bandwidth.MIB} MiB"


def _transfer_facts(index: int, depth: bandwidth.Depth, vram_free: int | None) -> dict[str, Fact]:
    facts: dict[str, Fact] = {}
    sizes = [bandwidth.fit_size(s, vram_free) for s in depth.sizes]
    notes: list[str] = []
    result: dict[str, float] = {}
    for size in sizes:
        result = bandwidth.pinned(index, size, depth.reps)
        notes.append(f"{_mb(size)}: H2D {result['h2d_gbps']:.1f}, D2H {result['d2h_gbps']:.1f}, "
                     f"both {result['bidir_gbps']:.1f}")
    size = sizes[-1]
    how = f"median of {depth.reps} copies of {_mb(size)}, CUDA events"
    extra = f" (by size: {'; '.join(notes)})" if len(notes) > 1 else ""
    facts["h2d_pinned_gbps"] = measured(round(result["h2d_gbps"], 2), how + extra)
    facts["d2h_pinned_gbps"] = measured(round(result["d2h_gbps"], 2), how)
    facts["bidir_pinned_gbps"] = measured(round(result["bidir_gbps"], 2),
                                          f"aggregate of H2D and D2H of {_mb(size)} each on two streams; "
                                          "near the sum of both means two copy engines work at once")
    return facts


def _pageable_facts(index: int, depth: bandwidth.Depth, vram_free: int | None) -> dict[str, Fact]:
    size = bandwidth.fit_size(depth.sizes[-1], vram_free)
    result = bandwidth.pageable(index, size, depth.pageable_reps)
    how = f"median of {depth.pageable_reps} copies of {_mb(size)} from ordinary (unpinned) memory, wall clock"
    return {"h2d_pageable_gbps": measured(round(result["h2d_gbps"], 2), how),
            "d2h_pageable_gbps": measured(round(result["d2h_gbps"], 2), how)}


def _gather_facts(index: int, depth: bandwidth.Depth) -> dict[str, Fact]:
    result = bandwidth.expert_gather(index, depth.reps * 2)
    return {"h2d_expert_gather_gbps": measured(
        round(result["gbps"], 2),
        f"{bandwidth.GATHER_COPIES} separate pinned copies of {bandwidth.EXPERT_BYTES:,} B (one decode step's "
        f"expert misses) in {result['ms']:.2f} ms")}


def _overlap_facts(index: int, depth: bandwidth.Depth, vram_free: int | None) -> dict[str, Fact]:
    size = bandwidth.fit_size(bandwidth.QUICK.sizes[-1], vram_free)
    r = bandwidth.copy_compute_overlap(index, size, depth.overlap_reps)
    return {"h2d_overlaps_compute": measured(
        r["hidden"] >= 0.5,
        f"copy {r['copy_ms']:.2f} ms, {int(r['matmuls'])} matmuls {r['compute_ms']:.2f} ms, both on two streams "
        f"{r['both_ms']:.2f} ms: {r['hidden']:.0%} of the shorter hidden")}


def measure_profile(depth: str = "quick", index: int = 0) -> HardwareProfile:
    """Probe the machine. depth "quick" (the default, a few seconds) or "full" (more sizes and repetitions)."""
    if depth not in DEPTHS:
        raise ValueError(f"probe depth {depth!r} is not one of {sorted(DEPTHS)}")
    t0 = time.perf_counter()
    facts: dict[str, Fact] = {}
    _guard(facts, ("os_name", "os_release", "wsl2", "host_ram_total", "host_ram_available", "pinnable_bytes",
                   "cpu_cores"), host_facts, "host query")
    facts["overlap_microbench"] = unavailable("the overlap micro-bench has not run on this machine")
    ok, why = cuda_status()
    facts["cuda_available"] = read(ok, why)
    if not ok:
        for name in GPU_FACTS:
            facts[name] = unavailable("no CUDA GPU (see 'CUDA GPU')")
        try:
            import torch

            facts["torch_version"] = read(str(torch.__version__), "torch.__version__")
        except Exception:  # noqa: BLE001
            pass
    else:
        _measure_gpu(facts, DEPTHS[depth], index)
    for name in fact_names():
        facts.setdefault(name, unavailable("not measured"))
    return HardwareProfile(**facts, qwenlocal_version=package_version(),
                           probed_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                           probe_seconds=round(time.perf_counter() - t0, 3), depth=depth)


def _measure_gpu(facts: dict[str, Fact], depth: bandwidth.Depth, index: int) -> None:
    _guard(facts, ("gpu_name", "gpu_uuid", "compute_capability", "sm_count", "vram_total", "vram_free",
                   "cuda_version", "torch_version"), lambda: device_facts(index), "device query")
    facts["copy_engines"] = copy_engine_count(index)
    free = facts["vram_free"].value if facts["vram_free"].known else None
    _guard(facts, ("h2d_pinned_gbps", "d2h_pinned_gbps", "bidir_pinned_gbps"),
           lambda: _transfer_facts(index, depth, free), "pinned copies")
    _guard(facts, ("h2d_pageable_gbps", "d2h_pageable_gbps"), lambda: _pageable_facts(index, depth, free),
           "pageable copies")
    _guard(facts, ("h2d_expert_gather_gbps",), lambda: _gather_facts(index, depth), "expert gather")
    _guard(facts, ("h2d_overlaps_compute",), lambda: _overlap_facts(index, depth, free), "copy/compute overlap")
    try:
        import torch

        torch.cuda.empty_cache()
    except Exception:  # noqa: BLE001
        pass
    windows = facts["os_name"].value == "Windows"
    # NVML after the copies: an idle link reports a lower PCIe generation than it runs at.
    _guard(facts, ("driver_version", "pcie_gen", "pcie_width", "pcie_gen_max", "pcie_width_max", "driver_model"),
           lambda: nvml_facts(facts["gpu_uuid"].value, facts["gpu_name"].value, windows=windows), "NVML")
    if not facts["driver_version"].known:
        facts["driver_version"] = driver_version_fallback()
    if facts.get("wsl2", Fact()).value:
        facts["driver_model"] = assumed("WDDM", "WSL2 runs CUDA on the Windows WDDM driver")
    elif not windows and facts["os_name"].known:
        facts["driver_model"] = assumed("native", f"{facts['os_name'].value}: no WDDM")


def refresh_volatile(profile: HardwareProfile, index: int = 0) -> HardwareProfile:
    """Re-read what changes between runs (free VRAM, available RAM) into a cached profile. Cheap."""
    updates: dict[str, Fact] = {}
    try:
        ram = ram_facts()
        updates.update(ram)
        capped = bool(profile.value("wsl2", False)) or profile.value("os_name") == "Windows"
        updates["pinnable_bytes"] = pinnable_estimate(ram["host_ram_total"].value, ram["host_ram_available"].value,
                                                      capped)
    except Exception:  # noqa: BLE001 - keep the cached figures
        pass
    if profile.has_cuda:
        try:
            import torch

            free, _total = torch.cuda.mem_get_info(index)
            updates["vram_free"] = read(int(free), "cudaMemGetInfo, re-read now (the rest of the profile is cached)")
        except Exception:  # noqa: BLE001
            pass
    return profile.with_facts(**updates)
