"""Host facts without torch or CUDA: OS, WSL2, host RAM, CPU cores, and the pinnable-memory estimate."""
from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

from .profile import Fact, assumed, read, unavailable

_GIB = 2**30


def os_facts(proc_version: str | None = None, release: str | None = None) -> dict[str, Fact]:
    """os_name, os_release and wsl2. WSL2 shows in the kernel string ("...-microsoft-standard-WSL2")."""
    system = platform.system() or sys.platform
    release = platform.release() if release is None else release
    if proc_version is None:
        try:
            proc_version = Path("/proc/version").read_text(encoding="utf-8", errors="replace").strip()
        except OSError:
            proc_version = ""
    kernel = f"{release} {proc_version}".lower()
    facts = {"os_name": read(system), "os_release": read(release)}
    if system == "Linux":
        is_wsl = "microsoft" in kernel
        where = "/proc/version" if proc_version else "platform.release()"
        facts["wsl2"] = read(is_wsl, f"kernel string from {where}" + (" names Microsoft" if is_wsl else ""))
    else:
        facts["wsl2"] = read(False, f"not Linux ({system})")
    return facts


def meminfo(text: str | None = None) -> tuple[int | None, int | None, str]:
    """(total, available, where) from /proc/meminfo; Windows GlobalMemoryStatusEx; sysconf as a last resort."""
    if text is None and Path("/proc/meminfo").is_file():
        try:
            text = Path("/proc/meminfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            text = None
    if text:
        values: dict[str, int] = {}
        for line in text.splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                values[key.strip()] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1].lower() == "kb" else 1)
        total = values.get("MemTotal")
        avail = values.get("MemAvailable")
        if avail is None and total is not None:
            avail = values.get("MemFree", 0) + values.get("Cached", 0) + values.get("Buffers", 0) or None
        if total:
            return total, avail, "/proc/meminfo"
    if sys.platform == "win32":
        got = _windows_memory()
        if got:
            return got[0], got[1], "GlobalMemoryStatusEx"
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        try:
            avail = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            avail = None
        return total, avail, "sysconf"
    except (ValueError, OSError, AttributeError):
        return None, None, "no source answered"


def _windows_memory() -> tuple[int, int] | None:
    try:
        import ctypes

        class MEMORYSTATUSEX(ctypes.Structure):
            _fields_ = [("dwLength", ctypes.c_ulong), ("dwMemoryLoad", ctypes.c_ulong),
                        ("ullTotalPhys", ctypes.c_ulonglong), ("ullAvailPhys", ctypes.c_ulonglong),
                        ("ullTotalPageFile", ctypes.c_ulonglong), ("ullAvailPageFile", ctypes.c_ulonglong),
                        ("ullTotalVirtual", ctypes.c_ulonglong), ("ullAvailVirtual", ctypes.c_ulonglong),
                        ("ullAvailExtendedVirtual", ctypes.c_ulonglong)]

        status = MEMORYSTATUSEX()
        status.dwLength = ctypes.sizeof(MEMORYSTATUSEX)
        if not ctypes.windll.kernel32.GlobalMemoryStatusEx(ctypes.byref(status)):  # type: ignore[attr-defined]
            return None
        return int(status.ullTotalPhys), int(status.ullAvailPhys)
    except Exception:  # noqa: BLE001 - any failure means "not available"
        return None


def ram_facts(text: str | None = None) -> dict[str, Fact]:
    total, avail, where = meminfo(text)
    return {
        "host_ram_total": read(total, where) if total else unavailable(f"host RAM: {where}"),
        "host_ram_available": read(avail, where) if avail else unavailable(f"available RAM: {where}"),
    }


def cpu_facts() -> dict[str, Fact]:
    try:
        cores = len(os.sched_getaffinity(0))  # type: ignore[attr-defined]
        return {"cpu_cores": read(cores, "logical cores this process may use (sched_getaffinity)")}
    except (AttributeError, OSError):
        count = os.cpu_count()
        return {"cpu_cores": read(count, "logical cores (os.cpu_count)") if count else unavailable("os.cpu_count")}


def pinnable_estimate(total: int | None, available: int | None, capped: bool) -> Fact:
    """How much host RAM the expert bank may pin. A rule, not a measurement (pinning to find out is too costly).

    WSL2 and native Windows cap page-locked memory at about half of RAM; on native Linux the limit is what is
    free, less a reserve for the OS and the rest of the process (max(2 GiB, 5 % of RAM)).
    """
    if not total:
        return unavailable("host RAM unknown")
    reserve = max(2 * _GIB, total // 20)
    room = (available if available else total) - reserve
    if capped:
        cap = total // 2
        value = max(0, min(cap, room))
        return assumed(value, f"WSL2/Windows cap page-locked memory at about half of RAM ({cap / _GIB:.1f} GiB); "
                              f"also at most available RAM less {reserve / _GIB:.1f} GiB")
    return assumed(max(0, room), f"available RAM less a {reserve / _GIB:.1f} GiB reserve for the OS and the process")


def host_facts() -> dict[str, Fact]:
    """Every host fact the probe reports, including the pinnable estimate."""
    facts: dict[str, Fact] = {}
    facts.update(os_facts())
    facts.update(ram_facts())
    facts.update(cpu_facts())
    capped = bool(facts["wsl2"].value) or facts["os_name"].value == "Windows"
    facts["pinnable_bytes"] = pinnable_estimate(facts["host_ram_total"].value, facts["host_ram_available"].value,
                                                capped)
    return facts
