"""A local fake of the Hugging Face hub for download and resolution tests (no network).

`FakeHub` stands in for `huggingface_hub.snapshot_download` and keeps the hub's on-disk contract: the cache
layout (models--owner--name/{refs/main, blobs/<hash>, snapshots/<commit>/<file> -> blob}), `local_dir`
downloads with `.cache/huggingface/download/<file>.incomplete`, each file written to an `.incomplete` first
and resumed from its length, and `dry_run` listings. `fail_after_bytes` cuts the connection mid-download.
"""
from __future__ import annotations

import fnmatch
import hashlib
import os
from pathlib import Path
from types import SimpleNamespace

COMMIT = "0123456789abcdef0123456789abcdef01234567"
CHUNK = 4096


class FakeHub:
    def __init__(self, repos: dict[str, Path], cache: Path):
        self.repos = repos  # repo_id -> folder with the repo's files
        self.cache = cache
        self.online = True
        self.fail_after_bytes: int | None = None  # raise ConnectionError once this many bytes went over the wire
        self.transferred = 0  # bytes sent by the "server" (resumed bytes are not sent again)
        self.calls: list[dict] = []

    def __call__(self, repo_id, *, revision=None, cache_dir=None, local_dir=None, allow_patterns=None,
                 local_files_only=False, dry_run=False, **_):
        from huggingface_hub.errors import LocalEntryNotFoundError

        self.calls.append({"repo_id": repo_id, "local_dir": local_dir, "local_files_only": local_files_only,
                           "dry_run": dry_run, "allow_patterns": allow_patterns})
        storage = Path(cache_dir or self.cache) / ("models--" + repo_id.replace("/", "--"))
        if local_files_only or not self.online:
            ref = storage / "refs" / "main"
            if local_dir is None and ref.is_file() and (storage / "snapshots" / ref.read_text()).is_dir():
                return str(storage / "snapshots" / ref.read_text())
            raise LocalEntryNotFoundError("Cannot find an appropriate cached snapshot folder (fake hub)")
        if repo_id not in self.repos:
            from huggingface_hub.errors import RepositoryNotFoundError

            exc = RepositoryNotFoundError.__new__(RepositoryNotFoundError)
            Exception.__init__(exc, f"404: {repo_id}")
            raise exc
        remote = self.repos[repo_id]
        names = [str(p.relative_to(remote)) for p in sorted(remote.rglob("*")) if p.is_file()]
        if allow_patterns:
            names = [n for n in names if any(fnmatch.fnmatch(n, pat) for pat in allow_patterns)]
        if local_dir is not None:
            root = Path(local_dir)
            dest = {n: root / n for n in names}
        else:
            root = storage / "snapshots" / COMMIT
            dest = {n: root / n for n in names}
        if dry_run:
            return [SimpleNamespace(filename=n, file_size=(remote / n).stat().st_size, is_cached=dest[n].is_file(),
                                    will_download=not dest[n].is_file(), commit_hash=COMMIT, local_path=str(dest[n]))
                    for n in names]
        if local_dir is None:
            (storage / "refs").mkdir(parents=True, exist_ok=True)
            (storage / "refs" / "main").write_text(COMMIT)  # the hub records the ref before fetching files
        for n in names:
            if dest[n].is_file():
                continue
            data = (remote / n).read_bytes()
            if local_dir is not None:
                partial = root / ".cache" / "huggingface" / "download" / (n + ".incomplete")
                final = dest[n]
            else:
                partial = storage / "blobs" / (hashlib.sha256(data).hexdigest() + ".incomplete")
                final = partial.with_suffix("")
            partial.parent.mkdir(parents=True, exist_ok=True)
            if not final.is_file():
                self._fetch(data, partial)
                os.replace(partial, final)
            if local_dir is None:
                dest[n].parent.mkdir(parents=True, exist_ok=True)
                os.symlink(os.path.relpath(final, dest[n].parent), dest[n])
        return str(root)

    def _fetch(self, data: bytes, partial: Path) -> None:
        start = partial.stat().st_size if partial.is_file() else 0  # resume: only the missing tail is sent
        with partial.open("ab") as fh:
            for off in range(start, len(data), CHUNK):
                piece = data[off:off + CHUNK]
                if self.fail_after_bytes is not None and self.transferred + len(piece) > self.fail_after_bytes:
                    raise ConnectionError("connection reset by peer (fake hub)")
                fh.write(piece)
                fh.flush()
                self.transferred += len(piece)


def install(monkeypatch, repos: dict[str, Path], cache: Path) -> FakeHub:
    """Replace huggingface_hub.snapshot_download with a FakeHub and point the HF cache at `cache`."""
    import huggingface_hub
    from huggingface_hub import constants

    hub = FakeHub(repos, cache)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", hub)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return hub


def make_cached_snapshot(cache: Path, repo_id: str, files_from: Path, skip: tuple[str, ...] = ()) -> Path:
    """Lay out a snapshot in the HF cache by hand, as the real hub leaves it (for the real snapshot_download)."""
    storage = cache / ("models--" + repo_id.replace("/", "--"))
    snap = storage / "snapshots" / COMMIT
    snap.mkdir(parents=True, exist_ok=True)
    (storage / "refs").mkdir(parents=True, exist_ok=True)
    (storage / "refs" / "main").write_text(COMMIT)
    (storage / "blobs").mkdir(exist_ok=True)
    for p in sorted(files_from.iterdir()):
        if p.is_file() and p.name not in skip:
            data = p.read_bytes()
            blob = storage / "blobs" / hashlib.sha256(data).hexdigest()
            blob.write_bytes(data)
            os.symlink(os.path.relpath(blob, snap), snap / p.name)
    return snap
