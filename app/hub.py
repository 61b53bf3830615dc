"""The Hugging Face hub side of models: what to fetch, where it lands, whether a copy is complete. No torch.

huggingface_hub is looked up at call time (`huggingface_hub.snapshot_download`, ...), never bound at import,
so tests replace it with a fake hub by monkeypatching that module.

Downloads never leave a folder that looks like a model but is not one:
- into the HF cache, the hub writes each file to `blobs/<hash>.incomplete` and links it into the snapshot
  only when whole; a snapshot that still lacks shards is refused by `missing_files` (resolution says to run
  the download again, which resumes the `.incomplete` files);
- into `--dir`, files go to a hidden staging folder next to it (`.NAME.partial`, where the hub resumes) and
  the folder is renamed into place only after the checkpoint validates.
"""
from __future__ import annotations

import errno
import inspect
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from qwenlocal.engine.errors import CheckpointError, QwenlocalError

# What the engine reads (engine/config.py, checkpoint.py, tokenizer.py, runtime/sampler.py). The vision
# tower's processor configs are left out; its tensors share the safetensors shards and cannot be.
ENGINE_PATTERNS = (
    "config.json", "generation_config.json", "hf_quant_config.json",
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.json",
    "merges.txt", "chat_template.jinja", "chat_template.json",
    "model.safetensors.index.json", "*.safetensors",
    "LICENSE*", "NOTICE*",
)
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
INDEX = "model.safetensors.index.json"


class HubError(QwenlocalError):
    """The hub could not be reached or refused the download; the message says what to do instead."""


def split_revision(ref: str) -> tuple[str, str | None]:
    """'owner/name@rev' -> ('owner/name', 'rev')."""
    repo, _, rev = ref.partition("@")
    return repo, (rev or None)


def looks_like_repo_id(ref: str) -> bool:
    return bool(_REPO_ID.match(split_revision(ref)[0]))


def hub_cache_dir() -> Path:
    """The HF cache the hub itself uses (HF_HOME / HF_HUB_CACHE are read by huggingface_hub, not by us)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def missing_files(folder: Path) -> list[str]:
    """What a checkpoint folder still lacks for the engine: config, tokenizer, and every shard the index lists.

    A presence check only (cheap: runs on every resolution); `validate_checkpoint` also checks shard lengths."""
    missing = [n for n in ("config.json", "tokenizer.json") if not (folder / n).is_file()]
    index = folder / INDEX
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return missing + [f"{INDEX} (unreadable)"]
        missing += sorted(s for s in shards if not (folder / s).is_file())
    elif not (folder / "model.safetensors").is_file():
        missing.append("*.safetensors")
    return missing


def validate_checkpoint(folder: Path) -> None:
    """Raise CheckpointError unless the folder is complete and every shard holds the bytes its header declares."""
    from qwenlocal.engine.checkpoint import Checkpoint

    missing = missing_files(folder)
    if missing:
        raise CheckpointError(f"{folder} is incomplete: missing {', '.join(missing[:4])}"
                              + (f" and {len(missing) - 4} more" if len(missing) > 4 else ""))
    Checkpoint(folder)  # parses every header and checks each file's length (truncation shows here)


@dataclass(frozen=True)
class CachedSnapshot:
    path: Path
    missing: tuple[str, ...]  # empty when complete

    @property
    def complete(self) -> bool:
        return not self.missing


def find_cached(repo_id: str, revision: str | None = None) -> CachedSnapshot | None:
    """The repo's snapshot in the local HF cache, never touching the network; None when nothing is cached."""
    import huggingface_hub
    from huggingface_hub import errors

    incomplete = getattr(errors, "IncompleteSnapshotError", ())  # huggingface_hub >= 1.x checks completeness too
    try:
        path = huggingface_hub.snapshot_download(repo_id, revision=revision, cache_dir=str(hub_cache_dir()),
                                                 allow_patterns=list(ENGINE_PATTERNS), local_files_only=True)
    except incomplete as exc:  # type: ignore[misc]
        where = getattr(exc, "snapshot_path", None)
        if where:
            return CachedSnapshot(Path(where), tuple(missing_files(Path(where))) or ("some files",))
        return None
    except (OSError, ValueError):
        return None
    path = Path(path)
    return CachedSnapshot(path, tuple(missing_files(path)))


@dataclass(frozen=True)
class RemoteListing:
    files: tuple[tuple[str, int | None, bool], ...]  # (name, size, still to download)
    total_bytes: int
    remaining_bytes: int


def remote_listing(repo_id: str, revision: str | None = None, local_dir: Path | None = None) -> RemoteListing | None:
    """The files the download would fetch and how many bytes are still missing (a dry run: contacts the hub,
    downloads nothing). None when this huggingface_hub has no dry run. Hub errors are raised as HubError."""
    import huggingface_hub

    if "dry_run" not in inspect.signature(huggingface_hub.snapshot_download).parameters:
        return None
    try:
        infos = huggingface_hub.snapshot_download(repo_id, revision=revision, **_where(local_dir),
                                                  allow_patterns=list(ENGINE_PATTERNS), dry_run=True)
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # every hub/transport failure becomes one clear message
        raise explain_hub_error(exc, repo_id) from exc
    files = tuple((i.filename, i.file_size, bool(i.will_download)) for i in infos)
    total = sum(size or 0 for _, size, _ in files)
    remaining = sum(size or 0 for _, size, todo in files if todo)
    return RemoteListing(files, total, remaining)


def staging_dir(target: Path) -> Path:
    """Where a `--dir` download lives until it is complete (same filesystem, so the final rename is atomic)."""
    return target.parent / f".{target.name}.partial"


def download(repo_id: str, revision: str | None = None, local_dir: Path | None = None,
             progress: bool = True) -> Path:
    """Fetch the engine's files of a repo (resuming whatever an earlier run left) and return the complete folder."""
    import huggingface_hub

    if local_dir is not None:
        target = Path(local_dir).expanduser().resolve()
        if target.exists():
            if not target.is_dir():
                raise HubError(f"{target} is a file; pick a folder for --dir")
            if not missing_files(target):
                return target
            if any(target.iterdir()):
                raise HubError(f"{target} exists and is not a complete checkpoint; remove it or pick another --dir")
            target.rmdir()  # empty: the final rename needs the name free
        dest = staging_dir(target)
        dest.mkdir(parents=True, exist_ok=True)
    else:
        target = dest = None
    if not progress:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    try:
        path = Path(huggingface_hub.snapshot_download(repo_id, revision=revision, **_where(dest),
                                                      allow_patterns=list(ENGINE_PATTERNS)))
    except KeyboardInterrupt:
        raise
    except QwenlocalError:
        raise
    except Exception as exc:
        raise explain_hub_error(exc, repo_id) from exc
    try:
        validate_checkpoint(path)
    except CheckpointError as exc:
        raise HubError(f"the download of {repo_id} finished but the files are not a complete checkpoint ({exc}); "
                       "run the same command again to fetch what is missing") from exc
    if target is None:
        return path
    os.replace(path, target)  # the folder appears whole or not at all
    return target


def _where(local_dir: Path | None) -> dict:
    return {"local_dir": str(local_dir)} if local_dir is not None else {"cache_dir": str(hub_cache_dir())}


def free_disk_bytes(path: Path) -> int | None:
    """Free bytes on the filesystem that holds `path` (or its nearest existing parent)."""
    p = Path(path).expanduser().resolve()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def explain_hub_error(exc: BaseException, repo_id: str) -> QwenlocalError:
    """Map what huggingface_hub / the transport raised to one message that says what to do."""
    from huggingface_hub import errors as e

    if type(exc).__name__ == "DryRunError" and exc.__cause__ is not None:
        return explain_hub_error(exc.__cause__, repo_id)  # the dry run wraps what the hub really said
    local = ("If the checkpoint is on this machine already (copied from elsewhere), point --model at its folder "
             "(config.json, tokenizer.json and the *.safetensors files), e.g. --model /path/to/Qwen3.6-35B-A3B-NVFP4")
    detail = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": ")
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return HubError(f"the disk filled up while downloading {repo_id}: free some space and run the same command "
                        "again (it resumes), or download elsewhere with --dir")
    if isinstance(exc, getattr(e, "GatedRepoError", ())):
        return HubError(f"{repo_id} is gated: accept its terms at https://huggingface.co/{repo_id}, log in "
                        "(`hf auth login`, or set HF_TOKEN) and run again")
    if isinstance(exc, getattr(e, "RepositoryNotFoundError", ())):
        return HubError(f"the hub has no repo {repo_id!r} (or it is private): check the name; `qwenlocal download "
                        "--list` shows the known checkpoints")
    if isinstance(exc, getattr(e, "RevisionNotFoundError", ())):
        return HubError(f"{repo_id} has no such revision: check the part after '@'")
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if status in (401, 403):
        return HubError(f"the hub refused {repo_id} (HTTP {status}): log in (`hf auth login`, or set HF_TOKEN) "
                        "and run again")
    offline = _offline_mode()
    why = "HF_HUB_OFFLINE is set, so the hub is not contacted" if offline else f"the hub is unreachable ({detail})"
    return HubError(f"cannot download {repo_id}: {why}. {local}. Or run `qwenlocal download {repo_id}` again when "
                    "online: it resumes where it stopped.")


def _offline_mode() -> bool:
    try:
        from huggingface_hub import constants

        return bool(getattr(constants, "HF_HUB_OFFLINE", False))
    except ImportError:
        return False
