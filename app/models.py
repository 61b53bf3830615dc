"""Resolve what `--model` names into a checkpoint folder. No torch at import time.

Today: a local folder, or nothing (the demo model, generated on first use). Hub ids, aliases and
`synthetic:` references arrive with the models/bench work.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from qwenlocal.engine.errors import CheckpointError

from .paths import models_dir

DEMO_NAME = "demo-tiny"


@dataclass(frozen=True)
class ResolvedModel:
    path: Path
    label: str
    is_demo: bool


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


def resolve_model(ref: str | None) -> ResolvedModel:
    if ref is None:
        return ResolvedModel(ensure_demo_model(), f"{DEMO_NAME} (built-in demo model, random weights)", True)
    path = Path(ref).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise CheckpointError(f"{path} has no config.json: point --model at a checkpoint folder")
        return ResolvedModel(path, str(path), False)
    raise CheckpointError(
        f"model {ref!r} is not a local folder; pass --model /path/to/checkpoint (a downloaded qwen3_5_moe model), "
        "or leave --model out to use the built-in demo model"
    )
