"""Find and validate a checkpoint's safetensors files without loading any tensor data.

Reads `model.safetensors.index.json` (or the single `model.safetensors`), parses every shard's header,
checks that each file is as long as its header says (a truncated download fails here, before any long
work), and maps canonical tensor names (text prefix removed) to (file, header entry).
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from .errors import CheckpointError

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
# Text tower prefixes, longest first: the real checkpoint nests the text model under language_model.
TEXT_PREFIXES = ("model.language_model.", "model.")
# Parts of the multimodal checkpoint the text engine does not use.
SKIPPED_PREFIXES = ("model.visual.", "visual.", "mtp.", "model.mtp.")
_MAX_HEADER = 100 * 2**20


@dataclass(frozen=True)
class TensorEntry:
    file: Path
    key: str  # the name as stored in the file
    dtype: str  # safetensors dtype code: BF16, F32, U8, F8_E4M3, ...
    shape: tuple[int, ...]


def canonical_name(key: str) -> str | None:
    """Stored name -> name without the text prefix; None for tensors the text engine skips."""
    if key.startswith(SKIPPED_PREFIXES):
        return None
    if key == "lm_head.weight" or key.startswith("lm_head."):
        return key
    for prefix in TEXT_PREFIXES:
        if key.startswith(prefix):
            return key[len(prefix):]
    return key


def read_header(path: Path) -> dict:
    """Parse one safetensors header and verify the file holds all the bytes it declares."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(f"{path.name} is truncated (shorter than a safetensors header): re-download it")
            (length,) = struct.unpack("<Q", head)
            if length > _MAX_HEADER or 8 + length > size:
                raise CheckpointError(f"{path.name} is truncated or not a safetensors file: re-download it")
            header = json.loads(f.read(length))
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc.strerror}") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path.name} has a corrupt safetensors header: re-download it") from exc
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + length + end > size:
        raise CheckpointError(
            f"{path.name} is truncated: its header needs {8 + length + end:,} bytes, the file has {size:,}; "
            "re-download it (qwenlocal download resumes)"
        )
    return header


def _shard_map(model_dir: Path) -> dict[str, Path]:
    index = model_dir / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{index} is malformed (needs a 'weight_map' object): re-download it") from exc
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index}: 'weight_map' must map tensor names to shard files")
        files = {name: model_dir / shard for name, shard in weight_map.items()}
        missing = sorted({p.name for p in files.values() if not p.is_file()})
        if missing:
            some = [n for n, p in files.items() if p.name == missing[0]][:3]
            raise CheckpointError(
                f"shard file(s) {', '.join(missing)} listed in {INDEX_FILE} are missing from {model_dir} "
                f"(they hold e.g. {', '.join(some)}): download the checkpoint again"
            )
        return files
    single = model_dir / SINGLE_FILE
    if single.is_file():
        return {name: single for name in read_header(single) if name != "__metadata__"}
    raise CheckpointError(
        f"no {INDEX_FILE} or {SINGLE_FILE} in {model_dir}: point --model at a downloaded qwen3_5_moe checkpoint"
    )


class Checkpoint:
    """The validated tensor inventory of one checkpoint folder."""

    def __init__(self, model_dir: str | Path):
        self.model_dir = Path(model_dir)
        if not self.model_dir.is_dir():
            raise CheckpointError(f"{self.model_dir} is not a folder: point --model at a checkpoint folder")
        by_file: dict[Path, list[str]] = {}
        for name, path in _shard_map(self.model_dir).items():
            by_file.setdefault(path, []).append(name)
        self.entries: dict[str, TensorEntry] = {}
        for path, names in by_file.items():
            header = read_header(path)
            for key in names:
                meta = header.get(key)
                if meta is None:
                    raise CheckpointError(f"tensor {key} is listed for {path.name} but not stored in it: re-download it")
                canon = canonical_name(key)
                if canon is None:
                    continue
                if canon in self.entries:
                    raise CheckpointError(f"tensor {canon} is stored twice ({key} and {self.entries[canon].key})")
                self.entries[canon] = TensorEntry(path, key, meta["dtype"], tuple(meta["shape"]))

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def entry(self, name: str) -> TensorEntry:
        found = self.entries.get(name)
        if found is None:
            raise CheckpointError(f"tensor {name} is missing from the checkpoint in {self.model_dir}")
        return found

    def expect_shape(self, name: str, shape: tuple[int, ...]) -> TensorEntry:
        found = self.entry(name)
        if found.shape != tuple(shape):
            raise CheckpointError(
                f"tensor {found.key} in {found.file.name} has shape {list(found.shape)}, expected {list(shape)} "
                "from config.json: the weights do not match the config"
            )
        return found
