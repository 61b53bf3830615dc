"""What NVML (nvidia-ml-py) says: driver version, PCIe link, UUID, the Windows driver model.

NVML often does not answer under WSL2 (PCIe queries are "Not Supported"), and is absent without a driver:
every fact it cannot give comes back unavailable with the reason.
"""
from __future__ import annotations

from .profile import Fact, read, unavailable

NVML_FACTS = ("driver_version", "pcie_gen", "pcie_width", "pcie_gen_max", "pcie_width_max", "driver_model")
_MODELS = {0: "WDDM", 1: "TCC", 2: "MCDM"}  # NVML_DRIVER_WDDM / NVML_DRIVER_WDM (TCC) / NVML_DRIVER_MCDM


def _err(exc: BaseException) -> str:
    return f"NVML: {type(exc).__name__.replace('NVMLError_', '')}: {exc}"[:160]


def _decode(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def nvml_facts(uuid: str | None, name: str | None, *, windows: bool) -> dict[str, Fact]:
    """The NVML facts for the GPU with this UUID (or the only GPU / the only one with this name)."""
    try:
        import pynvml
    except ImportError as exc:
        return {k: unavailable(f"nvidia-ml-py is not installed ({exc})") for k in NVML_FACTS}
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return {k: unavailable(_err(exc)) for k in NVML_FACTS}
    try:
        return _query(pynvml, uuid, name, windows)
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def _handle(pynvml, uuid: str | None, name: str | None):
    if uuid:
        try:
            return pynvml.nvmlDeviceGetHandleByUUID(uuid), "matched by UUID"
        except Exception:  # noqa: BLE001 - fall through to the other ways of matching
            pass
    count = pynvml.nvmlDeviceGetCount()
    if count == 1:
        return pynvml.nvmlDeviceGetHandleByIndex(0), "the only NVML device"
    if name:
        hits = [i for i in range(count) if _decode(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))) == name]
        if len(hits) == 1:
            return pynvml.nvmlDeviceGetHandleByIndex(hits[0]), "the only NVML device with this name"
    raise LookupError(f"cannot tell which of {count} NVML devices is the CUDA device (no UUID match)")


def _query(pynvml, uuid: str | None, name: str | None, windows: bool) -> dict[str, Fact]:
    facts: dict[str, Fact] = {}
    try:
        facts["driver_version"] = read(_decode(pynvml.nvmlSystemGetDriverVersion()), "NVML")
    except Exception as exc:  # noqa: BLE001
        facts["driver_version"] = unavailable(_err(exc))
    try:
        handle, how = _handle(pynvml, uuid, name)
    except Exception as exc:  # noqa: BLE001
        why = _err(exc) if not isinstance(exc, LookupError) else str(exc)
        for k in NVML_FACTS[1:]:
            facts[k] = unavailable(why)
        return facts
    calls = {
        "pcie_gen": ("nvmlDeviceGetCurrPcieLinkGeneration", "read after the timed copies (an idle link drops its generation)"),
        "pcie_width": ("nvmlDeviceGetCurrPcieLinkWidth", ""),
        "pcie_gen_max": ("nvmlDeviceGetMaxPcieLinkGeneration", "the most this GPU and slot can do"),
        "pcie_width_max": ("nvmlDeviceGetMaxPcieLinkWidth", ""),
    }
    for key, (fn, note) in calls.items():
        try:
            facts[key] = read(int(getattr(pynvml, fn)(handle)), f"NVML ({how})" + (f"; {note}" if note else ""))
        except Exception as exc:  # noqa: BLE001 - "Not Supported" under WSL2 is the common case
            facts[key] = unavailable(_err(exc))
    if windows:
        try:
            current, _pending = pynvml.nvmlDeviceGetDriverModel(handle)
            facts["driver_model"] = read(_MODELS.get(int(current), f"unknown ({current})"), "NVML")
        except Exception as exc:  # noqa: BLE001
            facts["driver_model"] = unavailable(_err(exc))
    else:
        facts["driver_model"] = unavailable("NVML reports a driver model on Windows only")
    return facts


def nvml_driver_version() -> str | None:
    """Just the driver version (for the cache key), or None."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001
        return None
    try:
        return _decode(pynvml.nvmlSystemGetDriverVersion())
    except Exception:  # noqa: BLE001
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass
