"""What models are on this machine: the app's model folder, the Hugging Face cache, and the registry's names
not downloaded yet; each with its size on disk, its format and whether it fits here. No torch at import time.

The fit verdict is the one the commands themselves give: for a checkpoint on disk, models.fit_check (what
`chat`/`generate` check before loading); for one not downloaded, the download's check (disk included).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qwenlocal.engine.errors import QwenlocalError

if TYPE_CHECKING:
    from qwenlocal.app.fit import FitReport
    from qwenlocal.engine.registry import KnownModel

READY, INCOMPLETE, NOT_DOWNLOADED = "ready", "incomplete", "not downloaded"


@dataclass(frozen=True)
class Verdict:
    fits: str  # "yes" | "caveats" (runs, slower or after closing programs) | "no" | "unknown"
    why: str  # one line for people
    report: "FitReport | None" = None

    def describe(self) -> dict[str, Any]:
        from qwenlocal.app.fit import describe

        return {"fits": self.fits, "why": self.why, "report": describe(self.report) if self.report else None}


@dataclass(frozen=True)
class ModelEntry:
    name: str  # what --model takes
    status: str  # READY | INCOMPLETE | NOT_DOWNLOADED
    format: str  # "BF16" | "NVFP4" | "FP8" | ... ("?" when the config cannot be read)
    size_bytes: int  # on disk now; for NOT_DOWNLOADED, what the download would take
    path: Path | None
    source: str  # "app" (the app's model folder) | "hf-cache" | "registry"
    repo_id: str | None = None
    verdict: Verdict = field(default_factory=lambda: Verdict("unknown", "not checked"))
    note: str = ""
    is_demo: bool = False  # the built-in demo model (chat runs it when --model is left out)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "format": self.format, "size_bytes": self.size_bytes,
                "path": str(self.path) if self.path else None, "source": self.source, "repo_id": self.repo_id,
                "note": self.note, "is_demo": self.is_demo, **self.verdict.describe()}


def list_models(*, device: str | None = None, options: Any = None, profile: Any = None,
                with_fit: bool = True) -> list[ModelEntry]:
    """Everything on disk first (app folder, then the HF cache), then the registry's names not downloaded."""
    from qwenlocal.app.models import machine_profile

    found = _app_folder_models() + _cached_models()
    on_disk = {e.repo_id for e in found if e.repo_id}
    entries = found + [_not_downloaded(k) for k in _known() if k.repo_id not in on_disk]
    if not with_fit:
        return entries
    if profile is None:
        profile = machine_profile()
    return [_with_verdict(e, device, options, profile) for e in entries]


def _known() -> tuple["KnownModel", ...]:
    from qwenlocal.engine.registry import KNOWN_MODELS

    return KNOWN_MODELS


def _app_folder_models() -> list[ModelEntry]:
    from qwenlocal.app import hub
    from qwenlocal.app.paths import models_dir

    root = models_dir()
    if not root.is_dir():
        return []
    out = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        if folder.name.startswith(".") and folder.name.endswith(".partial"):  # a `download --dir` in progress
            final = folder.parent / folder.name[1:-len(".partial")]
            out.append(ModelEntry(str(final), INCOMPLETE, "?", tree_bytes(folder), folder, "app",
                                  note=f"unfinished download: run the same `qwenlocal download ... --dir {final}` again"))
            continue
        if folder.name.startswith(".") or not (folder / "config.json").is_file():
            continue
        missing = hub.missing_files(folder)
        status = INCOMPLETE if missing else READY
        note = f"missing {', '.join(missing[:3])}" if missing else ""
        demo = folder.name == _demo_name()
        if demo:
            note = note or "the built-in demo model: leave --model out"
        out.append(ModelEntry(folder.name if demo else str(folder), status, checkpoint_format(folder),
                              tree_bytes(folder), folder, "app", note=note, is_demo=demo))
    return out


def _cached_models() -> list[ModelEntry]:
    """Repos in the HF cache that are qwen3_5_moe checkpoints (or registry repos, even half-downloaded)."""
    from qwenlocal.app import hub
    from qwenlocal.engine.registry import find_known

    try:
        cache = hub.hub_cache_dir()
    except ImportError:
        return []
    if not cache.is_dir():
        return []
    out = []
    for storage in sorted(cache.glob("models--*")):
        repo_id = storage.name[len("models--"):].replace("--", "/")  # the hub's own folder naming
        known = find_known(repo_id)
        cached = hub.find_cached(repo_id)
        size = tree_bytes(storage / "blobs")
        if cached is None:
            if known is not None and size:
                out.append(ModelEntry(known.aliases[0], INCOMPLETE, known.expert_format.upper(), size, storage,
                                      "hf-cache", repo_id, note=f"run `qwenlocal download {known.aliases[0]}` again"))
            continue
        fmt = known.expert_format.upper() if known else checkpoint_format(cached.path)
        if known is None and fmt == "?":
            continue  # not a model this engine runs (another project's download)
        name = known.aliases[0] if known else repo_id
        note = "" if cached.complete else (f"missing {', '.join(cached.missing[:3])}: run `qwenlocal download "
                                           f"{name}` again, it resumes")
        out.append(ModelEntry(name, READY if cached.complete else INCOMPLETE, fmt, size, cached.path, "hf-cache",
                              repo_id, note=note))
    return out


def _not_downloaded(known: "KnownModel") -> ModelEntry:
    return ModelEntry(known.aliases[0], NOT_DOWNLOADED, known.expert_format.upper(), known.download_bytes, None,
                      "registry", known.repo_id)


def _demo_name() -> str:
    from qwenlocal.app.models import DEMO_NAME

    return DEMO_NAME


def checkpoint_format(folder: Path) -> str:
    """How the routed experts are stored: the quantization config's format, else the stored dtype; "?" when
    config.json is not a qwen3_5_moe config this engine reads."""
    from qwenlocal.engine.config import load_model_config
    from qwenlocal.engine.quant.scheme import parse_quant_scheme

    try:
        cfg = load_model_config(folder)
        scheme = parse_quant_scheme(cfg.quantization)
    except (QwenlocalError, OSError, ValueError):
        return "?"
    if scheme.quantized:
        return scheme.format_of("layers.0.mlp.experts").upper()
    return {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}.get(cfg.torch_dtype.lower(),
                                                                        cfg.torch_dtype.upper())


def tree_bytes(root: Path) -> int:
    """Bytes of the files under root, each counted once (the cache's snapshot links point into blobs/)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            try:
                st = os.stat(os.path.join(dirpath, name))
            except OSError:
                continue  # a dangling link
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


def _with_verdict(entry: ModelEntry, device, options, profile) -> ModelEntry:
    from dataclasses import replace

    return replace(entry, verdict=verdict_for(entry, device=device, options=options, profile=profile))


def verdict_for(entry: ModelEntry, *, device=None, options=None, profile=None) -> Verdict:
    from qwenlocal.app.models import FIT_CHECK_MIN_BYTES, ResolvedModel, fit_check
    from qwenlocal.engine.registry import find_known

    known = find_known(entry.repo_id) if entry.repo_id else None
    if entry.status == NOT_DOWNLOADED:
        from qwenlocal.app.commands.download import download_fit_report

        if profile is None:
            return Verdict("unknown", "this machine could not be probed")
        return _from_report(download_fit_report(known, entry.repo_id or entry.name, entry.size_bytes, device=device,
                                                options=options, profile=profile))
    if entry.status != READY or entry.path is None:
        return Verdict("unknown", "incomplete download")
    if entry.is_demo:
        return Verdict("yes", "the built-in demo model")
    resolved = ResolvedModel(entry.path, entry.name, False, kind="hub" if known else "local",
                             repo_id=entry.repo_id, known=known)
    facts = resolved.facts()
    if facts is None:
        return Verdict("unknown", "its sizes could not be read")
    if facts.experts_total_bytes + facts.dense_bytes < FIT_CHECK_MIN_BYTES:
        return Verdict("yes", "a small model")
    if profile is None:
        return Verdict("unknown", "this machine could not be probed")
    return _from_report(fit_check(resolved, device=device, options=options, profile=profile, force=True))


def _from_report(report: "FitReport") -> Verdict:
    if report.failures:
        return Verdict("no", "; ".join(f"{i.what}: {i.detail}" for i in report.failures), report)
    if report.warnings:
        return Verdict("caveats", "; ".join(f"{i.what}: {i.detail}" for i in report.warnings), report)
    if any(i.status == "unknown" for i in report.items):
        return Verdict("unknown", "; ".join(i.detail for i in report.items if i.status == "unknown"), report)
    return Verdict("yes", f"fits ({report.device})", report)
