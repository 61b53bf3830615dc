"""The CPU thread count: physical cores this process may use, and the default the engine runs with. No torch.

Why not torch's default (every core): batch-1 decode is memory-bound and every op ends in an OpenMP barrier,
so one thread more than there are free cores stalls each barrier on a descheduled thread. Measured on a
2-core machine beside one busy process: 366 -> 44-116 tok/s with 2 threads, 367 with 1 (issue 19).
"""
from __future__ import annotations

import os
from pathlib import Path

MAX_DEFAULT_THREADS = 8  # past this, memory bandwidth, not threads, bounds batch-1 decode


def usable_logical_cpus() -> list[int]:
    """The logical CPUs this process may run on (its affinity where the OS reports one)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def physical_cores(topology: Path = Path("/sys/devices/system/cpu")) -> int:
    """Physical cores among the usable logical CPUs (SMT siblings counted once). Linux reads the topology;
    elsewhere (or if it is unreadable) the logical count is used as is."""
    cpus = usable_logical_cpus()
    cores = set()
    for cpu in cpus:
        base = topology / f"cpu{cpu}" / "topology"
        try:
            cores.add((base / "physical_package_id").read_text().strip() + ":" + (base / "core_id").read_text().strip())
        except OSError:
            return max(1, len(cpus))
    return max(1, len(cores))


def default_threads(cores: int) -> tuple[int, str]:
    """(threads, reason) for `cores` physical cores: one left for the app and the OS, at most 8."""
    n = max(1, min(MAX_DEFAULT_THREADS, cores - 1))
    why = (f"{n} of {cores} physical core{'s' if cores != 1 else ''}: "
           + ("one left for the app and the OS, " if cores > 1 else "")
           + f"at most {MAX_DEFAULT_THREADS} (batch-1 decode is memory-bound; a thread more than the free cores "
             "stalls every op's barrier)")
    return n, why
