"""Resolve what `--model` names, for every command. No torch at import time.

A reference is, in this order:
  nothing                 the built-in demo model (generated on first use, atomically)
  synthetic:NAME          passed through to the engine (random weights in a known geometry, no download)
  a folder                a checkpoint folder (config.json, tokenizer.json, *.safetensors)
  an alias or hub id      a registry alias (qwen3.6-35b-a3b-nvfp4) or owner/name[@revision], found in the
                          local Hugging Face cache (never downloaded here: `qwenlocal download` does that)
Before loading a full-size model, `resolve_model` checks that it fits this machine (app/fit.py).
"""
from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qwenlocal.engine.errors import CheckpointError
from qwenlocal.engine.registry import (KNOWN_MODELS, find_known, smaller_alternatives, synthetic_facts, synthetic_name,
                                       synthetic_params)

from .paths import models_dir

if TYPE_CHECKING:
    from qwenlocal.engine.plan import ModelFacts
    from qwenlocal.engine.probe.profile import HardwareProfile
    from qwenlocal.engine.registry import KnownModel

DEMO_NAME = "demo-tiny"
# Below this many bytes of weights nothing on a machine that runs Python can fail to fit: skip the probe.
FIT_CHECK_MIN_BYTES = 2 * 2**30


@dataclass(frozen=True)
class ResolvedModel:
    path: Path | None  # the checkpoint folder; None for a synthetic model
    label: str  # for people
    is_demo: bool
    ref: str = ""  # what the engine loads: the folder as a string, or "synthetic:NAME"
    kind: str = "local"  # "demo" | "local" | "hub" | "synthetic"
    repo_id: str | None = None
    known: "KnownModel | None" = None

    def __post_init__(self) -> None:
        if not self.ref and self.path is not None:
            object.__setattr__(self, "ref", str(self.path))

    @property
    def target(self) -> Path | str:
        """The argument for Engine.from_pretrained."""
        return self.path if self.path is not None else self.ref

    def facts(self) -> "ModelFacts | None":
        """Sizes for the fit check: the registry's, else read from the checkpoint; None when unknown."""
        if self.known is not None:
            return self.known.facts
        if self.kind == "synthetic":
            return synthetic_facts(self.ref)
        if self.path is not None:
            from .fit import facts_from_checkpoint

            try:
                return facts_from_checkpoint(self.path, name=self.label)
            except CheckpointError:
                return None  # the engine's loader will say what is wrong, with more context
        return None

    def params(self) -> int | None:
        """Text-tower parameter count (what the CPU path holds in its compute dtype); None when unknown."""
        if self.known is not None:
            return self.known.params
        if self.kind == "synthetic":
            return synthetic_params(self.ref)
        if self.path is not None:
            from .fit import params_from_checkpoint

            try:
                return params_from_checkpoint(self.path)
            except CheckpointError:
                return None
        return None


def ensure_demo_model() -> Path:
    """The embedded default: a small qwen3_5_moe checkpoint with the real layout, written atomically."""
    target = models_dir() / DEMO_NAME
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    from qwenlocal.engine.tiny import make_tiny_checkpoint

    staging = Path(tempfile.mkdtemp(prefix=f".{DEMO_NAME}-", dir=target.parent))
    try:
        make_tiny_checkpoint(staging, "tiny", seed=0)
        try:
            os.replace(staging, target)
        except OSError:
            # Another process finished first: keep theirs.
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def resolve_model(ref: str | None, *, check_fit: bool = True, device: str | None = None,
                  options: Any = None, dtype: str | None = None,
                  profile: "HardwareProfile | None" = None) -> ResolvedModel:
    """Resolve `ref`; with check_fit, raise ResourceError (what does not fit, what to do) before any loading.

    device/options/dtype: as they will be passed to the engine (the VRAM budget, the context and the CPU
    dtype change the answer). profile: the machine (default: the probe's cached profile)."""
    resolved = _resolve(ref)
    if check_fit:
        fit_check(resolved, device=device, options=options, dtype=dtype, profile=profile)
    return resolved


def _resolve(ref: str | None) -> ResolvedModel:
    if ref is None or not str(ref).strip():
        return ResolvedModel(ensure_demo_model(), f"{DEMO_NAME} (built-in demo model, random weights)", True,
                             kind="demo")
    ref = str(ref).strip()
    name = synthetic_name(ref)
    if name is not None:
        if not name:
            raise CheckpointError("'synthetic:' needs a name, e.g. synthetic:qwen3.6-35b-a3b or synthetic:tiny")
        return ResolvedModel(None, f"{ref} (synthetic weights)", False, ref=f"synthetic:{name}", kind="synthetic")
    path = Path(ref).expanduser()
    if path.is_dir():
        return _local(path)
    from .hub import looks_like_repo_id, split_revision

    known = find_known(split_revision(ref)[0])
    if known is None and (_path_like(ref) or not looks_like_repo_id(ref)):
        raise CheckpointError(
            f"model {ref!r} is not a folder, a known model or a hub id. Use --model /path/to/checkpoint (a "
            f"downloaded qwen3_5_moe model), a known name ({', '.join(e.aliases[0] for e in KNOWN_MODELS)}), a hub "
            "id (owner/name, after `qwenlocal download owner/name`), synthetic:qwen3.6-35b-a3b, or leave --model "
            "out for the built-in demo model")
    repo_id = known.repo_id if known is not None else split_revision(ref)[0]
    return _from_cache(repo_id, split_revision(ref)[1], known)


def _path_like(ref: str) -> bool:
    return ref.startswith(("/", ".", "~", "\\")) or "\\" in ref or ref.count("/") > 1 or (len(ref) > 1 and ref[1] == ":")


def _local(path: Path) -> ResolvedModel:
    from .hub import missing_files

    if path.name.endswith(".partial") and path.name.startswith("."):
        raise CheckpointError(f"{path} is an unfinished download: run the download again to complete it "
                              f"(it becomes {path.parent / path.name[1:-len('.partial')]})")
    if not (path / "config.json").is_file():
        raise CheckpointError(f"{path} has no config.json: point --model at a checkpoint folder")
    missing = missing_files(path)
    if missing:
        raise CheckpointError(f"{path} is an incomplete checkpoint (missing {', '.join(missing[:3])}"
                              f"{' ...' if len(missing) > 3 else ''}); copy or download the rest")
    return ResolvedModel(path, str(path), False, kind="local")


def _from_cache(repo_id: str, revision: str | None, known: "KnownModel | None") -> ResolvedModel:
    from .hub import find_cached

    cached = find_cached(repo_id, revision)
    what = repo_id + (f"@{revision}" if revision else "")
    size = f" ({known.download_bytes / 1e9:.1f} GB)" if known else ""
    if cached is None:
        raise CheckpointError(
            f"{what} is not downloaded yet: run `qwenlocal download {what}`{size}, or point --model at a local "
            "checkpoint folder")
    if not cached.complete:
        raise CheckpointError(
            f"the download of {what} in {cached.path} is incomplete (missing {', '.join(cached.missing[:3])}"
            f"{' ...' if len(cached.missing) > 3 else ''}): run `qwenlocal download {what}` again, it resumes")
    label = what + (f" ({known.expert_format} experts)" if known else "")
    return ResolvedModel(cached.path, label, False, ref=str(cached.path), kind="hub", repo_id=repo_id, known=known)


def fit_check(resolved: ResolvedModel, *, device: str | None = None, options: Any = None, dtype: Any = None,
              profile: "HardwareProfile | None" = None, force: bool = False, force_hint: str = ""):
    """Raise ResourceError when a full-size model cannot run here; return the FitReport (None when skipped:
    the demo and small models, unknown sizes, or a machine the probe cannot read)."""
    if resolved.is_demo:
        return None
    facts = resolved.facts()
    if facts is None or facts.experts_total_bytes + facts.dense_bytes < FIT_CHECK_MIN_BYTES:
        return None
    if profile is None:
        profile = machine_profile()
        if profile is None:
            return None
    from .fit import check_fit

    narrow = any(k in str(dtype or "").lower() for k in ("bf16", "bfloat16", "fp16", "float16"))
    report = check_fit(facts, profile, device=device, options=options, alternatives=smaller_alternatives(facts),
                       params=resolved.params(), cpu_dtype_bytes=2 if narrow else 4, name=resolved.label)
    report.raise_if_unfit(force=force, force_hint=force_hint)
    return report


def machine_profile():
    """The probe's profile (cached per GPU; measured once, in seconds). None if the probe fails: the check is
    advice, and the engine still stops with its own error when memory runs out."""
    from qwenlocal.engine.errors import QwenlocalError
    from qwenlocal.engine.probe import get_profile

    try:
        return get_profile(depth="quick").profile
    except (QwenlocalError, OSError, RuntimeError, ImportError):
        return None
