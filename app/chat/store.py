"""Conversations on disk: one JSON file each under data_dir()/conversations, written atomically.

A crash mid-write leaves the old file (or none), never half a file: we write a temp file in the same folder,
fsync it, then os.replace it over the target. A file that does not parse is skipped and reported, never fatal.
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .conversation import Conversation, ConversationFormatError, clean_title


def atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


@dataclass(frozen=True)
class Skipped:
    path: Path
    reason: str


class ConversationStore:
    def __init__(self, root: Path):
        self.root = Path(root)

    @classmethod
    def default(cls) -> "ConversationStore":
        from qwenlocal.app.paths import data_dir

        return cls(data_dir() / "conversations")

    def path_for(self, conv_id: str) -> Path:
        # Ids come from the files we wrote; one that could name a file elsewhere is refused, not followed.
        if not conv_id or conv_id.startswith(".") or any(c in conv_id for c in "/\\\0"):
            raise ValueError(f"{conv_id!r} is not a conversation id")
        return self.root / f"{conv_id}.json"

    def save(self, conv: Conversation) -> Path:
        path = self.path_for(conv.id)
        atomic_write_text(path, json.dumps(conv.to_json(), ensure_ascii=False, indent=1))
        return path

    def load(self, conv_id: str) -> Conversation:
        return self._read(self.path_for(conv_id))

    def delete(self, conv_id: str) -> bool:
        """Remove a conversation's file; False if it was already gone (the goal is reached either way)."""
        try:
            self.path_for(conv_id).unlink()
        except FileNotFoundError:
            return False
        return True

    def rename(self, conv_id: str, title: str) -> Conversation:
        """Give a saved conversation a new title (checked before anything is read or written); the file is
        rewritten atomically. `updated` is kept: it says when the conversation last changed, and the picker's
        order stays put under the cursor."""
        title = clean_title(title)
        conv = self.load(conv_id)
        conv.title = title
        self.save(conv)
        return conv

    def list(self) -> tuple[list[Conversation], list[Skipped]]:
        """All readable conversations, newest first, and the files that could not be read."""
        convs, skipped = [], []
        if not self.root.is_dir():
            return convs, skipped
        for path in sorted(self.root.glob("*.json")):
            try:
                convs.append(self._read(path))
            except (OSError, ValueError) as exc:  # JSONDecodeError and ConversationFormatError are ValueErrors
                skipped.append(Skipped(path, str(exc)))
        convs.sort(key=lambda c: c.updated, reverse=True)
        return convs, skipped

    @staticmethod
    def _read(path: Path) -> Conversation:
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError as exc:
            raise ConversationFormatError(f"not UTF-8 text: {exc}") from exc
        return Conversation.from_json(raw)


def export_transcript(conv: Conversation, base: Path) -> tuple[Path, Path]:
    """Write BASE.md and BASE.json (atomically); returns both paths."""
    if base.suffix in (".md", ".json"):
        base = base.with_suffix("")
    md, js = base.parent / (base.name + ".md"), base.parent / (base.name + ".json")
    atomic_write_text(md, conv.to_markdown())
    atomic_write_text(js, json.dumps(conv.to_json(), ensure_ascii=False, indent=1))
    return md, js
