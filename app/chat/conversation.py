"""One conversation as data: messages, system prompt, settings; JSON and Markdown forms. No Textual here."""
from __future__ import annotations

import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

FORMAT_VERSION = 1
_ROLES = ("user", "assistant")
TITLE_MAX = 120  # characters: a title is one line of the picker, not a note


class ConversationFormatError(ValueError):
    """A saved conversation is not in the format this version writes."""


@dataclass
class ChatMessage:
    role: str  # "user" | "assistant"
    content: str
    reasoning: str = ""
    finish_reason: str = ""  # assistant only: stop | length | cancelled | error | context | refused
    stats: dict = field(default_factory=dict)


@dataclass
class Conversation:
    id: str = field(default_factory=lambda: time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6])
    title: str = ""
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    model: str = ""
    system: str = ""
    messages: list[ChatMessage] = field(default_factory=list)
    # The oldest turns folded into a summary for what is sent (the messages above keep them whole):
    # {"upto": index of the first message it does not cover, "text": ..., "tokens": ..., "turns": ...}; {} if none.
    summary: dict = field(default_factory=dict)

    def add(self, role: str, content: str, **extra: Any) -> ChatMessage:
        msg = ChatMessage(role, content, **extra)
        self.messages.append(msg)
        if role == "user" and not self.title:
            self.title = title_from(content)
        self.updated = time.time()
        return msg

    def engine_messages(self, upto: int | None = None, start: int = 0) -> list[dict]:
        """The history the backend sees: system prompt first; past reasoning and failed replies are not sent.
        `start`: leave out the messages before it (those a summary covers)."""
        out = [{"role": "system", "content": self.system}] if self.system else []
        return out + [m for _, m in self.sent_messages(upto, start)]

    def sent_messages(self, upto: int | None = None, start: int = 0) -> list[tuple[int, dict]]:
        """(index in `messages`, message as sent) of the history from `start` that is sent."""
        msgs = self.messages[:upto]
        out = []
        for i in range(start, len(msgs)):
            m = msgs[i]
            refused = i + 1 < len(msgs) and msgs[i + 1].finish_reason == "refused"  # too long: never sent
            if m.finish_reason not in ("error", "refused") and not refused:
                out.append((i, {"role": m.role, "content": m.content}))
        return out

    def last_index(self, role: str) -> int | None:
        for i in range(len(self.messages) - 1, -1, -1):
            if self.messages[i].role == role:
                return i
        return None

    @property
    def turns(self) -> int:
        """The user's messages: each one is a turn (its reply, stopped or failed, belongs to it)."""
        return sum(m.role == "user" for m in self.messages)

    def matches(self, query: str) -> bool:
        """Every word of the query appears (case-insensitively) in the title or in some message's text."""
        words = query.casefold().split()
        if not words:
            return True
        haystack = "\n".join([self.title, *(m.content for m in self.messages)]).casefold()
        return all(w in haystack for w in words)

    def to_json(self) -> dict:
        return {"format": FORMAT_VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, raw: Any) -> "Conversation":
        if not isinstance(raw, dict) or raw.get("format") != FORMAT_VERSION:
            raise ConversationFormatError("not a qwenlocal conversation (format 1)")
        try:
            msgs = [ChatMessage(**m) for m in raw["messages"]]
            conv = cls(id=str(raw["id"]), title=str(raw.get("title", "")), created=float(raw["created"]),
                       updated=float(raw["updated"]), model=str(raw.get("model", "")),
                       system=str(raw.get("system", "")), messages=msgs, summary=_summary(raw.get("summary"), msgs))
        except (KeyError, TypeError, ValueError) as exc:
            raise ConversationFormatError(f"missing or malformed field: {exc}") from exc
        bad = [m.role for m in msgs if m.role not in _ROLES or not isinstance(m.content, str)]
        if bad:
            raise ConversationFormatError(f"unexpected message role(s) {bad}")
        return conv

    def to_markdown(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(self.created))
        lines = [f"# {self.title or 'Conversation'}", "", f"*{when} · model: {self.model or 'unknown'}*", ""]
        if self.system:
            lines += ["## System", "", self.system, ""]
        for m in self.messages:
            lines += [f"## {'You' if m.role == 'user' else 'Assistant'}", ""]
            if m.reasoning:
                quoted = "\n".join("> " + line for line in m.reasoning.strip().splitlines())
                lines += ["<details><summary>Thinking</summary>", "", quoted, "", "</details>", ""]
            lines += [m.content, ""]
            if m.finish_reason and m.finish_reason != "stop":
                lines += [f"*({m.finish_reason})*", ""]
        return "\n".join(lines).rstrip() + "\n"


def _summary(raw: Any, msgs: list[ChatMessage]) -> dict:
    """A saved summary, or {} if it is missing or malformed: then the whole history is sent (or folded again),
    nothing is lost (the messages are kept whole)."""
    kinds = {"upto": int, "text": str, "tokens": int, "turns": int}
    if not isinstance(raw, dict) or any(not isinstance(raw.get(k), t) for k, t in kinds.items()):
        return {}
    return {k: raw[k] for k in kinds} if 0 < raw["upto"] <= len(msgs) else {}


def clean_title(text: str) -> str:
    """A title the user typed, on one line; ValueError (saying what to type) if it is empty or too long."""
    title = " ".join(text.split())
    if not title:
        raise ValueError("a title cannot be empty: type a few words, or press Esc to keep the old one")
    if len(title) > TITLE_MAX:
        raise ValueError(f"a title is at most {TITLE_MAX} characters (this one has {len(title)})")
    return title


def title_from(text: str, width: int = 48) -> str:
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1].rstrip() + "…"
