"""One JSON file per bench run: what ran (commit, command, machine, plan per arm, routing spec), every raw trial,
and the summary table. Written atomically; read back for `--compare`. No torch.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

from ..errors import OptionError
from .stats import table

SCHEMA = 1
KIND = "qwenlocal-bench"


def git_commit(where: Path | None = None) -> dict:
    """The source tree's commit and whether it has local changes (a figure is only as good as its commit)."""
    root = where or Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None, "note": "git not available"}
    if not sha:
        return {"commit": None, "dirty": None, "note": "not a git checkout"}
    return {"commit": sha, "short": sha[:7], "dirty": bool(dirty)}


def machine_summary(profile: Any) -> dict:
    """The few facts a reader of a result wants first; the full profile is stored next to it."""
    if profile is None:
        return {}
    names = ("gpu_name", "compute_capability", "vram_total", "driver_version", "cuda_version", "torch_version",
             "pcie_gen", "pcie_width", "copy_engines", "h2d_pinned_gbps", "h2d_expert_gather_gbps", "os_name", "wsl2",
             "driver_model", "host_ram_total", "cpu_cores")
    return {n: profile.value(n) for n in names}


def build_record(*, command: Sequence[str], settings: dict, model: dict, arms: Sequence[Any], arm_info: dict,
                 cases: Sequence[Any], trials: Sequence[dict], skipped: Sequence[dict], profile: Any,
                 started: float, complete: bool, notes: Sequence[str] = (), fit: dict | None = None) -> dict:
    names = [a.name for a in arms]
    rows = table(trials, names)
    return {
        "kind": KIND, "schema": SCHEMA,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "duration_s": round(time.time() - started, 3),
        "complete": complete,
        "command": list(command),
        "source": git_commit(),
        "machine": machine_summary(profile),
        "profile": profile.to_dict() if profile is not None else None,
        "model": model,
        "fit": fit,
        "settings": settings,
        "routing": settings.get("routing"),
        "arms": [{"name": a.name, "description": a.description, "overrides": dict(a.options),
                  "runner": type(a.runner).__name__ if a.runner else "qwenlocal", **arm_info.get(a.name, {})}
                 for a in arms],
        "cases": [c.__dict__ for c in cases],
        "skipped_cases": list(skipped),
        "notes": list(notes),
        "summary": [r.as_dict() for r in rows],
        "trials": list(trials),
    }


def default_name(record: dict) -> str:
    stamp = datetime.now().strftime("%Y-%m-%d-%H%M%S")
    model = re.sub(r"[^A-Za-z0-9._-]+", "-", str(record.get("model", {}).get("name", "model"))).strip("-")[:48]
    dev = record.get("settings", {}).get("device") or "auto"
    short = record.get("source", {}).get("short") or "nocommit"
    return f"{stamp}-bench-{model}-{dev}-{short}.json"


def write_record(record: dict, out_dir: Path, name: str | None = None) -> Path:
    """Atomic: a reader (or a crash) sees the whole file or none of it."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / (name or default_name(record))
    if name is None:
        # Two runs within one second share the timestamp: never overwrite an earlier record.
        base, n = path, 2
        while path.exists():
            path, n = base.with_name(f"{base.stem}-{n}{base.suffix}"), n + 1
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}-", suffix=".tmp", dir=out_dir)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(record, fh, indent=1, default=_jsonable)
            fh.write("\n")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def _jsonable(value: Any) -> Any:
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if hasattr(value, "__dataclass_fields__"):
        return {k: getattr(value, k) for k in value.__dataclass_fields__}
    return str(value)


def load_record(path: Path) -> dict:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise OptionError(f"{path}: no such file") from None
    except (OSError, ValueError) as exc:
        raise OptionError(f"{path} is not a readable bench JSON ({exc})") from exc
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise OptionError(f"{path} is not a qwenlocal bench result")
    if data.get("schema") != SCHEMA:
        raise OptionError(f"{path} has bench schema {data.get('schema')!r}; this version reads {SCHEMA}")
    return data


def compare(a: dict, b: dict) -> list[dict]:
    """Medians of B against A for every (case, metric, arm) both runs measured. Two runs are not a pair: the
    ratio is of medians across runs, so it carries run-to-run drift that the in-run pair ratios do not."""
    index = {(r["case"], r["metric"], r["arm"]): r for r in a.get("summary", [])}
    out = []
    for r in b.get("summary", []):
        key = (r["case"], r["metric"], r["arm"])
        if key not in index:
            continue
        ma, mb = index[key]["summary"]["median"], r["summary"]["median"]
        out.append({"case": key[0], "metric": key[1], "arm": key[2], "a": index[key]["summary"], "b": r["summary"],
                    "ratio": (mb / ma) if ma else None})
    return out
