"""Faked hardware profiles for tests, demos and `bench --profile`-style what-ifs. No torch, no hardware.

`fake_gpu_profile` builds a CUDA machine from a few numbers (every fact marked as the real probe would mark
it); the presets are the machines the seeds and the lent GPU describe.
"""
from __future__ import annotations

from .host import pinnable_estimate
from .profile import Fact, HardwareProfile, assumed, fact_names, measured, read, unavailable

GIB = 2**30


def _base(**facts: Fact) -> HardwareProfile:
    for name in fact_names():
        facts.setdefault(name, unavailable("not in this fake"))
    return HardwareProfile(**facts, qwenlocal_version="test", probed_at="2026-01-01T00:00:00+00:00",
                           probe_seconds=0.0, depth="fake")


def fake_gpu_profile(*, name: str = "NVIDIA GeForce RTX 5070 Ti", cc: str = "12.0", sms: int = 70,
                     vram_total: float = 15.9, vram_free: float = 14.9, copy_engines: int | None = 2,
                     h2d_gbps: float | None = 42.0, pageable_gbps: float | None = 6.0,
                     pcie: tuple[int, int] | None = (5, 16), wsl2: bool = False, os_name: str = "Linux",
                     driver_model: str | None = None, ram_total: float = 64.0, ram_available: float = 58.0,
                     overlaps_compute: bool | None = True, microbench: dict | None = None,
                     uuid: str = "GPU-00000000-0000-0000-0000-000000000000", driver: str = "580.00") -> HardwareProfile:
    """A CUDA machine. Sizes in GiB, bandwidths in GB/s. None for a figure means "the probe could not get it"."""
    windows = os_name == "Windows"
    facts: dict[str, Fact] = {
        "cuda_available": read(True, "fake"),
        "gpu_name": read(name), "gpu_uuid": read(uuid), "compute_capability": read(cc), "sm_count": read(sms),
        "vram_total": read(int(vram_total * GIB)), "vram_free": read(int(vram_free * GIB)),
        "driver_version": read(driver), "cuda_version": read("13.0"), "torch_version": read("2.11.0+cu130"),
        "os_name": read(os_name), "os_release": read("6.6.87.2-microsoft-standard-WSL2" if wsl2 else "6.8.0"),
        "wsl2": read(wsl2), "cpu_cores": read(16),
        "host_ram_total": read(int(ram_total * GIB)), "host_ram_available": read(int(ram_available * GIB)),
    }
    if pcie is not None and not wsl2:
        facts.update(pcie_gen=read(pcie[0]), pcie_width=read(pcie[1]), pcie_gen_max=read(pcie[0]),
                     pcie_width_max=read(pcie[1]))
    else:
        for key in ("pcie_gen", "pcie_width", "pcie_gen_max", "pcie_width_max"):
            facts[key] = unavailable("NVML: Not Supported")
    facts["copy_engines"] = read(copy_engines) if copy_engines is not None else unavailable("no route answered")
    if h2d_gbps is not None:
        facts.update(h2d_pinned_gbps=measured(h2d_gbps), d2h_pinned_gbps=measured(h2d_gbps),
                     h2d_expert_gather_gbps=measured(h2d_gbps * 0.9),
                     bidir_pinned_gbps=measured(h2d_gbps * (1.6 if (copy_engines or 1) > 1 else 1.0)))
    if pageable_gbps is not None:
        facts.update(h2d_pageable_gbps=measured(pageable_gbps), d2h_pageable_gbps=measured(pageable_gbps))
    if overlaps_compute is not None:
        facts["h2d_overlaps_compute"] = measured(overlaps_compute, "fake")
    if microbench is not None:
        facts["overlap_microbench"] = measured(dict(microbench), "fake")
    if wsl2:
        facts["driver_model"] = assumed("WDDM", "WSL2 runs CUDA on the Windows WDDM driver")
    elif windows:
        facts["driver_model"] = read(driver_model or "WDDM", "NVML")
    else:
        facts["driver_model"] = assumed(driver_model or "native", "no WDDM")
    facts["pinnable_bytes"] = pinnable_estimate(int(ram_total * GIB), int(ram_available * GIB), wsl2 or windows)
    return _base(**facts)


def fake_cpu_profile(why: str = "no CUDA GPU found: fake", ram_total: float = 64.0,
                     ram_available: float = 60.0) -> HardwareProfile:
    total, avail = int(ram_total * GIB), int(ram_available * GIB)
    return _base(cuda_available=read(False, why), os_name=read("Linux"), os_release=read("6.8.0"),
                 wsl2=read(False), cpu_cores=read(8), host_ram_total=read(total), host_ram_available=read(avail),
                 pinnable_bytes=pinnable_estimate(total, avail, False))


def wsl2_rtx5070ti(**kw) -> HardwareProfile:
    """The seeds' machine: RTX 5070 Ti 16 GB, PCIe 5 x16 under WSL2, one copy engine, ~42 GB/s."""
    kw = {"copy_engines": 1, "h2d_gbps": 42.0, "wsl2": True, **kw}
    return fake_gpu_profile(**kw)


def linux_pcie5_x16(**kw) -> HardwareProfile:
    """A native Linux desktop: RTX 5080 16 GB, PCIe 5 x16, two copy engines, ~55 GB/s."""
    kw = {"name": "NVIDIA GeForce RTX 5080", "sms": 84, "copy_engines": 2, "h2d_gbps": 55.0, **kw}
    return fake_gpu_profile(**kw)


def laptop_pcie4_x8(**kw) -> HardwareProfile:
    """A laptop: RTX 4070 Laptop 8 GB on PCIe 4 x8, ~12 GB/s, 32 GB of RAM, native Linux."""
    kw = {"name": "NVIDIA GeForce RTX 4070 Laptop GPU", "cc": "8.9", "sms": 36, "vram_total": 8.0,
          "vram_free": 7.6, "copy_engines": 2, "h2d_gbps": 12.0, "pageable_gbps": 4.0, "pcie": (4, 8),
          "ram_total": 32.0, "ram_available": 28.0, **kw}
    return fake_gpu_profile(**kw)


def h200(**kw) -> HardwareProfile:
    """The lent machine (shared/device/README.md): H200, PCIe 5 x16, 3 copy engines, 55 GB/s, 128 GiB RAM."""
    kw = {"name": "NVIDIA H200", "cc": "9.0", "sms": 132, "vram_total": 139.8, "vram_free": 139.0, "copy_engines": 3,
          "h2d_gbps": 55.0, "ram_total": 128.0, "ram_available": 120.0, **kw}
    return fake_gpu_profile(**kw)
