"""HardwareProfile: what the probe found on this machine, each fact with where it came from. No torch here.

Every hardware fact is a `Fact(value, source, note)`. `source` is one of
  measured     timed on this machine (bandwidth, overlap)
  read         reported by the OS, the CUDA runtime or NVML
  assumed      derived from other facts by a stated rule (WSL2 implies WDDM, the pinnable estimate)
  unavailable  could not be found out; `note` says why, `value` is None
The profile round-trips through JSON (`to_dict` / `from_dict`), which is how the cache stores it.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

SOURCES = ("measured", "read", "assumed", "unavailable")
SCHEMA = 1
_GIB = 2**30


@dataclass(frozen=True)
class Fact:
    value: Any = None
    source: str = "unavailable"
    note: str = ""

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"fact source {self.source!r} is not one of {SOURCES}")
        if self.source == "unavailable" and self.value is not None:
            raise ValueError("an unavailable fact carries no value")

    @property
    def known(self) -> bool:
        return self.source != "unavailable"

    def to_dict(self) -> dict:
        return {"value": self.value, "source": self.source, "note": self.note}

    @classmethod
    def from_dict(cls, raw: Any) -> "Fact":
        if not isinstance(raw, dict) or set(raw) != {"value", "source", "note"} or not isinstance(raw["note"], str):
            raise ValueError(f"not a fact: {raw!r}")
        return cls(raw["value"], raw["source"], raw["note"])


def measured(value: Any, note: str = "") -> Fact:
    return Fact(value, "measured", note)


def read(value: Any, note: str = "") -> Fact:
    return Fact(value, "read", note)


def assumed(value: Any, note: str = "") -> Fact:
    return Fact(value, "assumed", note)


def unavailable(note: str) -> Fact:
    return Fact(None, "unavailable", note)


_NOT_PROBED = unavailable("not probed")

# name -> (label, unit). Units: "bytes" shows GiB, "GB/s" is decimal (1e9 B/s), as the seeds report it.
LABELS: dict[str, tuple[str, str]] = {
    "cuda_available": ("CUDA GPU", ""),
    "gpu_name": ("GPU", ""),
    "gpu_uuid": ("GPU UUID", ""),
    "compute_capability": ("compute capability", ""),
    "sm_count": ("SMs", ""),
    "vram_total": ("VRAM total", "bytes"),
    "vram_free": ("VRAM free", "bytes"),
    "driver_version": ("driver", ""),
    "cuda_version": ("CUDA runtime (torch)", ""),
    "torch_version": ("torch", ""),
    "pcie_gen": ("PCIe generation (now)", ""),
    "pcie_width": ("PCIe width (now)", "lanes"),
    "pcie_gen_max": ("PCIe generation (max)", ""),
    "pcie_width_max": ("PCIe width (max)", "lanes"),
    "copy_engines": ("copy engines", ""),
    "h2d_pinned_gbps": ("H2D pinned", "GB/s"),
    "d2h_pinned_gbps": ("D2H pinned", "GB/s"),
    "h2d_pageable_gbps": ("H2D pageable", "GB/s"),
    "d2h_pageable_gbps": ("D2H pageable", "GB/s"),
    "bidir_pinned_gbps": ("H2D + D2H at once", "GB/s"),
    "h2d_expert_gather_gbps": ("H2D expert gather (28 copies)", "GB/s"),
    "h2d_overlaps_compute": ("H2D overlaps compute", ""),
    "overlap_microbench": ("overlap micro-bench", ""),
    "os_name": ("OS", ""),
    "os_release": ("kernel / OS release", ""),
    "wsl2": ("WSL2", ""),
    "driver_model": ("driver model", ""),
    "host_ram_total": ("host RAM total", "bytes"),
    "host_ram_available": ("host RAM available", "bytes"),
    "pinnable_bytes": ("pinnable host RAM (estimate)", "bytes"),
    "cpu_cores": ("CPU cores", ""),
}


@dataclass(frozen=True)
class HardwareProfile:
    """One machine, one GPU (device index 0 unless asked otherwise). Frozen; `with_facts` makes a changed copy."""

    # GPU
    cuda_available: Fact = _NOT_PROBED
    gpu_name: Fact = _NOT_PROBED
    gpu_uuid: Fact = _NOT_PROBED
    compute_capability: Fact = _NOT_PROBED  # "9.0"
    sm_count: Fact = _NOT_PROBED
    vram_total: Fact = _NOT_PROBED  # bytes
    vram_free: Fact = _NOT_PROBED  # bytes, at probe time (refreshed when the cached profile is used)
    driver_version: Fact = _NOT_PROBED
    cuda_version: Fact = _NOT_PROBED
    torch_version: Fact = _NOT_PROBED
    # the host link
    pcie_gen: Fact = _NOT_PROBED
    pcie_width: Fact = _NOT_PROBED
    pcie_gen_max: Fact = _NOT_PROBED
    pcie_width_max: Fact = _NOT_PROBED
    copy_engines: Fact = _NOT_PROBED  # cudaDevAttrAsyncEngineCount
    h2d_pinned_gbps: Fact = _NOT_PROBED
    d2h_pinned_gbps: Fact = _NOT_PROBED
    h2d_pageable_gbps: Fact = _NOT_PROBED
    d2h_pageable_gbps: Fact = _NOT_PROBED
    bidir_pinned_gbps: Fact = _NOT_PROBED
    h2d_expert_gather_gbps: Fact = _NOT_PROBED
    h2d_overlaps_compute: Fact = _NOT_PROBED  # bool
    # {"off": us, "copy-side": us, "shared-side": us}: per-layer decode time from the overlap micro-bench,
    # filled by that bench when it has run on this machine; the plan prefers it to the heuristics.
    overlap_microbench: Fact = _NOT_PROBED
    # the host
    os_name: Fact = _NOT_PROBED  # platform.system(): "Linux" | "Windows" | "Darwin"
    os_release: Fact = _NOT_PROBED
    wsl2: Fact = _NOT_PROBED
    driver_model: Fact = _NOT_PROBED  # "WDDM" | "TCC" | "MCDM" | "native"
    host_ram_total: Fact = _NOT_PROBED
    host_ram_available: Fact = _NOT_PROBED
    pinnable_bytes: Fact = _NOT_PROBED
    cpu_cores: Fact = _NOT_PROBED
    # about the probe itself (not hardware facts)
    qwenlocal_version: str = "unknown"
    probed_at: str = ""  # ISO 8601, UTC
    probe_seconds: float = 0.0
    depth: str = "quick"  # "quick" | "full" | "fake" (tests)
    schema: int = field(default=SCHEMA)

    def __post_init__(self) -> None:
        for name in fact_names():
            if not isinstance(getattr(self, name), Fact):
                raise TypeError(f"HardwareProfile.{name} must be a Fact, got {getattr(self, name)!r}")

    def value(self, name: str, default: Any = None) -> Any:
        fact = getattr(self, name)
        return fact.value if fact.known else default

    def with_facts(self, **facts: Fact) -> "HardwareProfile":
        return replace(self, **facts)

    @property
    def has_cuda(self) -> bool:
        return bool(self.value("cuda_available", False))

    @property
    def wddm(self) -> bool:
        """True when the GPU runs under WDDM (native Windows on WDDM, or WSL2, which always does)."""
        return self.value("driver_model") == "WDDM" or bool(self.value("wsl2", False))

    def to_dict(self) -> dict:
        out: dict[str, Any] = {
            "schema": self.schema,
            "qwenlocal_version": self.qwenlocal_version,
            "probed_at": self.probed_at,
            "probe_seconds": self.probe_seconds,
            "depth": self.depth,
        }
        out["facts"] = {name: getattr(self, name).to_dict() for name in fact_names()}
        return out

    @classmethod
    def from_dict(cls, raw: Any) -> "HardwareProfile":
        """Strict: a wrong schema, a missing or unknown fact, or a malformed one raises ValueError."""
        if not isinstance(raw, dict):
            raise ValueError("a profile must be a JSON object")
        if raw.get("schema") != SCHEMA:
            raise ValueError(f"profile schema {raw.get('schema')!r}, this version reads {SCHEMA}")
        facts = raw.get("facts")
        if not isinstance(facts, dict):
            raise ValueError("profile has no 'facts' object")
        names = fact_names()
        missing, unknown = sorted(set(names) - set(facts)), sorted(set(facts) - set(names))
        if missing or unknown:
            raise ValueError(f"profile facts differ: missing {missing}, unknown {unknown}")
        meta = {}
        for key, kind in (("qwenlocal_version", str), ("probed_at", str), ("probe_seconds", (int, float)),
                          ("depth", str)):
            if not isinstance(raw.get(key), kind) or isinstance(raw.get(key), bool):
                raise ValueError(f"profile field {key!r} is missing or malformed")
            meta[key] = raw[key]
        meta["probe_seconds"] = float(meta["probe_seconds"])
        return cls(**{name: Fact.from_dict(facts[name]) for name in names}, **meta)

    def rows(self) -> list[tuple[str, str, str, str]]:
        """(label, formatted value, source, note) per fact, in declaration order: for tables."""
        return [(LABELS[name][0], format_fact(name, getattr(self, name)), getattr(self, name).source,
                 getattr(self, name).note) for name in fact_names()]


def fact_names() -> tuple[str, ...]:
    return tuple(f.name for f in fields(HardwareProfile) if f.name in LABELS)


def format_fact(name: str, fact: Fact) -> str:
    if not fact.known:
        return "-"
    unit = LABELS[name][1]
    value = fact.value
    if isinstance(value, bool):
        return "yes" if value else "no"
    if unit == "bytes" and isinstance(value, (int, float)):
        return f"{value / _GIB:.1f} GiB"
    if unit == "GB/s" and isinstance(value, (int, float)):
        return f"{value:.1f} GB/s"
    if unit == "lanes" and isinstance(value, int):
        return f"x{value}"
    if isinstance(value, dict):
        return ", ".join(f"{k} {v:g}" if isinstance(v, (int, float)) else f"{k} {v}" for k, v in value.items())
    return str(value)
