"""Events the engine streams to its callers (chat, serve, bench). Plain frozen dataclasses, no torch."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TokenDelta:
    """New answer text (after `</think>`, or all text when thinking is off)."""

    text: str


@dataclass(frozen=True)
class ReasoningDelta:
    """New text inside the `<think>` block."""

    text: str


@dataclass(frozen=True)
class Stats:
    """A snapshot of the running counters (sent periodically while generating)."""

    values: dict = field(default_factory=dict)


@dataclass(frozen=True)
class TurnDone:
    """The reply finished. `finish_reason` is "stop" (EOS), "length" (max tokens) or "cancelled"."""

    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    text: str
    reasoning: str
    stats: dict = field(default_factory=dict)


@dataclass(frozen=True)
class EngineError:
    """Generation failed; `message` is for the user, `kind` is the exception class name."""

    message: str
    kind: str


Event = TokenDelta | ReasoningDelta | Stats | TurnDone | EngineError
