"""The probe cache: one JSON file per GPU, keyed by (GPU UUID or name, driver version, qwenlocal version).

A file that is corrupt, of another GPU, driver or qwenlocal version, or of a shallower probe than asked, is a
miss: the machine is measured again and the file replaced. Writes go to a temporary file in the same folder
and are renamed over the old one (os.replace), so a reader sees the old file or the new one, never half of
one, however many writers race. A cache that cannot be written is not an error; the profile is still used.
"""
from __future__ import annotations

import json
import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..env import read_env
from .profile import HardwareProfile

FILE_SCHEMA = 1
_DEPTH_RANK = {"fake": 0, "quick": 1, "full": 2}


@dataclass(frozen=True)
class ProbeResult:
    profile: HardwareProfile
    path: Path | None  # the cache file (None when the cache folder could not be used)
    from_cache: bool
    note: str = ""  # why the cache was or was not used
    identity: object = None  # the GpuIdentity the cache was keyed by
    version: str = ""


def cache_root() -> Path:
    """QWENLOCAL_CACHE_DIR, else QWENLOCAL_HOME/cache, else platformdirs' user cache dir for qwenlocal."""
    env = read_env()
    if env.cache_dir:
        return Path(env.cache_dir).expanduser()
    if env.home:
        return Path(env.home).expanduser() / "cache"
    try:
        from platformdirs import user_cache_dir

        return Path(user_cache_dir("qwenlocal", appauthor=False))
    except ImportError:  # platformdirs is a dependency; this keeps a bare GPU machine working without it
        return Path.home() / ".cache" / "qwenlocal"


def cache_path(identity, directory: Path | None = None) -> Path:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", identity.gpu).strip("_")[:96] or "gpu"
    return (directory or cache_root() / "probe") / f"profile-{slug}.json"


def _key(identity, version: str) -> dict:
    return {"gpu": identity.gpu, "driver": identity.driver, "qwenlocal": version}


def load(path: Path, identity, version: str, depth: str = "quick") -> tuple[HardwareProfile | None, str]:
    """(profile, why): the cached profile if it is valid and for this GPU, driver and version; else (None, why)."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, "no cached profile"
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return None, f"cached profile unreadable ({type(exc).__name__}); measuring again"
    if not isinstance(raw, dict) or raw.get("file_schema") != FILE_SCHEMA:
        return None, "cached profile has another format; measuring again"
    key, want = raw.get("key"), _key(identity, version)
    if key != want:
        diff = [k for k in want if not isinstance(key, dict) or key.get(k) != want[k]]
        return None, f"cached profile is for another {'/'.join(diff) or 'key'}; measuring again"
    try:
        profile = HardwareProfile.from_dict(raw.get("profile"))
    except (ValueError, TypeError) as exc:
        return None, f"cached profile malformed ({exc}); measuring again"
    if _DEPTH_RANK.get(profile.depth, 0) < _DEPTH_RANK.get(depth, 1):
        return None, f"cached profile is a {profile.depth} probe, {depth} asked; measuring again"
    return profile, f"cached {profile.probed_at}"


def save(path: Path, identity, version: str, profile: HardwareProfile) -> bool:
    """Write atomically: temp file in the same folder, fsync, os.replace. False (and no file left) on failure."""
    data = json.dumps({"file_schema": FILE_SCHEMA, "key": _key(identity, version), "profile": profile.to_dict()},
                      indent=1, sort_keys=False)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}-", suffix=".tmp", dir=path.parent)
    except OSError:
        return False
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        for attempt in range(20):
            try:
                os.replace(tmp, path)
                return True
            except PermissionError:  # Windows: the target is open in another process for a moment
                time.sleep(0.01 * (attempt + 1))
        return False
    except OSError:
        return False
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def get_profile(*, refresh: bool = False, depth: str = "quick", index: int = 0, directory: Path | None = None,
                measure: Callable[..., HardwareProfile] | None = None, identify: Callable[..., object] | None = None,
                refresh_volatile: Callable[..., HardwareProfile] | None = None,
                version: str | None = None) -> ProbeResult:
    """The profile for this machine: from the cache when valid (free VRAM/RAM re-read), else measured and saved.

    measure/identify/refresh_volatile default to the real ones (engine/probe/measure.py); tests pass fakes.
    """
    if measure is None or identify is None or refresh_volatile is None or version is None:
        from . import measure as real

        measure = measure or real.measure_profile
        identify = identify or real.identify
        refresh_volatile = refresh_volatile or real.refresh_volatile
        version = version or real.package_version()
    ident = identify(index)
    path = cache_path(ident, directory)
    why = "refresh asked"
    if not refresh:
        cached, why = load(path, ident, version, depth)
        if cached is not None:
            return ProbeResult(refresh_volatile(cached, index), path, True, why, ident, version)
    profile = measure(depth=depth, index=index)
    saved = save(path, ident, version, profile)
    return ProbeResult(profile, path if saved else None, False,
                       why + ("" if saved else f"; could not write the cache under {path.parent}"), ident, version)


def update_profile(change: Callable[[HardwareProfile], HardwareProfile], *, directory: Path | None = None,
                   **kwargs) -> ProbeResult:
    """Change this machine's cached profile and save it: how a later measurement adds to the profile, e.g. the
    overlap micro-bench storing {"off": us, "copy-side": us, "shared-side": us} as `overlap_microbench`
    (`lambda p: p.with_facts(overlap_microbench=measured(times, note))`). Measures first if nothing is cached."""
    result = get_profile(directory=directory, **kwargs)
    profile = change(result.profile)
    path = cache_path(result.identity, directory)
    saved = save(path, result.identity, result.version, profile)
    return ProbeResult(profile, path if saved else None, result.from_cache, "updated" if saved else
                       f"updated in memory; could not write the cache under {path.parent}", result.identity,
                       result.version)
