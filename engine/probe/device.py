"""What the CUDA runtime says about the GPU: availability, properties, copy engines, driver version.

torch is imported inside the functions only, so importing this module stays cheap.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import glob
import sys
import warnings
from pathlib import Path

from ..env import read_env
from .profile import Fact, read, unavailable

ASYNC_ENGINE_COUNT = 40  # cudaDevAttrAsyncEngineCount == CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT


def cuda_status() -> tuple[bool, str]:
    """(usable, why): whether torch sees a CUDA GPU, and if not, the reason in words."""
    if read_env().no_cuda:
        return False, "QWENLOCAL_NO_CUDA is set: treating this machine as having no CUDA GPU"
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - a broken torch install is "no CUDA" with the reason
        return False, f"torch could not be imported ({type(exc).__name__}: {exc})"
    if torch.version.cuda is None:
        return False, f"no CUDA GPU found: torch {torch.__version__} is a CPU-only build"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            ok = torch.cuda.is_available() and torch.cuda.device_count() > 0
        except Exception as exc:  # noqa: BLE001
            return False, f"no CUDA GPU found: CUDA initialisation failed ({exc})"
    if ok:
        return True, f"torch {torch.__version__}, CUDA {torch.version.cuda}"
    said = "; ".join(str(w.message).strip().splitlines()[0] for w in caught if str(w.message).strip())
    return False, "no CUDA GPU found" + (f": {said}" if said else " (no NVIDIA driver, or no device visible)")


def torch_uuid(props) -> str | None:
    """torch's device UUID in NVML's spelling ("GPU-xxxxxxxx-..."), or None when this torch has none."""
    raw = getattr(props, "uuid", None)
    if raw is None:
        return None
    text = str(raw).strip()
    if not text:
        return None
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"


def device_facts(index: int) -> dict[str, Fact]:
    import torch

    props = torch.cuda.get_device_properties(index)
    where = "torch.cuda.get_device_properties"
    facts = {
        "gpu_name": read(props.name, where),
        "compute_capability": read(f"{props.major}.{props.minor}", where),
        "sm_count": read(int(props.multi_processor_count), where),
        "vram_total": read(int(props.total_memory), where),
        "cuda_version": read(str(torch.version.cuda), "torch.version.cuda"),
        "torch_version": read(str(torch.__version__), "torch.__version__"),
    }
    uuid = torch_uuid(props)
    facts["gpu_uuid"] = read(uuid, where) if uuid else unavailable(f"this torch ({torch.__version__}) reports no UUID")
    try:
        free, _total = torch.cuda.mem_get_info(index)
        facts["vram_free"] = read(int(free), "cudaMemGetInfo at probe time (refreshed when the cache is used)")
    except Exception as exc:  # noqa: BLE001
        facts["vram_free"] = unavailable(f"cudaMemGetInfo failed: {exc}")
    return facts


def copy_engine_count(index: int) -> Fact:
    """cudaDevAttrAsyncEngineCount: from torch's device properties if it has the field, else cuda-python, then
    libcuda (driver API), then libcudart, through ctypes."""
    tried: list[str] = []
    for name, fn in (("torch device properties", _engines_torch), ("cuda-python", _engines_cuda_python),
                     ("libcuda", _engines_libcuda), ("libcudart", _engines_libcudart)):
        try:
            return read(fn(index), f"cudaDevAttrAsyncEngineCount via {name}")
        except Exception as exc:  # noqa: BLE001 - each route may be missing; say which and why
            tried.append(f"{name}: {type(exc).__name__}: {exc}"[:120])
    return unavailable("could not query cudaDevAttrAsyncEngineCount (" + "; ".join(tried) + ")")


def _engines_torch(index: int) -> int:
    import torch

    props = torch.cuda.get_device_properties(index)
    for attr in ("async_engine_count", "asyncEngineCount"):  # not in torch <= 2.13; taken if a later one adds it
        if isinstance(getattr(props, attr, None), int):
            return int(getattr(props, attr))
    raise AttributeError("no async engine count field")


def _engines_cuda_python(index: int) -> int:
    try:
        from cuda.bindings import runtime as rt  # cuda-python >= 12.6 / cuda-bindings
    except ImportError:
        from cuda import cudart as rt  # type: ignore[no-redef]  # older cuda-python
    err, value = rt.cudaDeviceGetAttribute(rt.cudaDeviceAttr.cudaDevAttrAsyncEngineCount, index)
    if err != rt.cudaError_t.cudaSuccess:
        raise RuntimeError(f"cudaDeviceGetAttribute returned {err}")
    return int(value)


def _libcuda() -> ctypes.CDLL:
    names = ["nvcuda.dll"] if sys.platform == "win32" else ["libcuda.so.1", "libcuda.so", "/usr/lib/wsl/lib/libcuda.so.1"]
    errors = []
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError as exc:
            errors.append(str(exc))
    raise OSError("; ".join(errors) or "libcuda not found")


def _engines_libcuda(index: int) -> int:
    lib = _libcuda()
    rc = lib.cuInit(0)
    if rc:
        raise RuntimeError(f"cuInit returned {rc}")
    dev = ctypes.c_int()
    rc = lib.cuDeviceGet(ctypes.byref(dev), ctypes.c_int(index))
    if rc:
        raise RuntimeError(f"cuDeviceGet returned {rc}")
    value = ctypes.c_int()
    rc = lib.cuDeviceGetAttribute(ctypes.byref(value), ctypes.c_int(ASYNC_ENGINE_COUNT), dev)
    if rc:
        raise RuntimeError(f"cuDeviceGetAttribute returned {rc}")
    return int(value.value)


def _cudart_candidates() -> list[str]:
    found: list[str] = []
    try:
        import torch

        roots = [Path(torch.__file__).parent / "lib", Path(torch.__file__).parent.parent / "nvidia"]
        for root in roots:
            found += sorted(glob.glob(str(root / "**" / ("cudart64_*.dll" if sys.platform == "win32"
                                                         else "libcudart.so*")), recursive=True))
    except Exception:  # noqa: BLE001
        pass
    name = ctypes.util.find_library("cudart")
    if name:
        found.append(name)
    return found


def _engines_libcudart(index: int) -> int:
    errors = []
    for path in _cudart_candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError as exc:
            errors.append(str(exc))
            continue
        value = ctypes.c_int()
        rc = lib.cudaDeviceGetAttribute(ctypes.byref(value), ctypes.c_int(ASYNC_ENGINE_COUNT), ctypes.c_int(index))
        if rc:
            raise RuntimeError(f"cudaDeviceGetAttribute returned {rc}")
        return int(value.value)
    raise OSError("; ".join(errors) or "libcudart not found")


def driver_version_fallback() -> Fact:
    """The driver version when NVML does not answer: /proc/driver/nvidia/version, else cuDriverGetVersion."""
    path = Path("/proc/driver/nvidia/version")
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
        for word in text.split():
            parts = word.split(".")
            if len(parts) >= 2 and all(p.isdigit() for p in parts):
                return read(word, str(path))
    except OSError:
        pass
    try:
        lib = _libcuda()
        value = ctypes.c_int()
        if lib.cuDriverGetVersion(ctypes.byref(value)) == 0 and value.value:
            major, minor = divmod(value.value, 1000)
            return read(f"CUDA {major}.{minor // 10} driver API",
                        "cuDriverGetVersion (NVML did not answer; the exact driver build is unknown)")
    except Exception:  # noqa: BLE001
        pass
    return unavailable("neither NVML, /proc/driver/nvidia/version nor libcuda answered")

