"""Typed messages the worker threads post to the app (post_message is thread-safe; widgets are not).

Every reply message carries the turn id it belongs to, so a late message from a stopped or replaced turn is
recognised and dropped instead of landing in the wrong reply.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from textual.message import Message


@dataclass
class LoadProgress(Message):
    stage: str
    done: int
    total: int


@dataclass
class BackendReady(Message):
    label: str
    plan: dict = field(default_factory=dict)


@dataclass
class LoadFailed(Message):
    title: str
    message: str
    hint: str


@dataclass
class ReplyDelta(Message):
    turn_id: int
    text: str
    reasoning: bool


@dataclass
class ReplyStats(Message):
    turn_id: int
    values: dict


@dataclass
class ReplyDone(Message):
    turn_id: int
    finish_reason: str
    text: str
    reasoning: str
    stats: dict


@dataclass
class ReplyFailed(Message):
    turn_id: int
    message: str
    kind: str


@dataclass
class ContextTrimmed(Message):
    """The oldest turns were left out of what this turn sends (the saved conversation keeps them)."""
    turn_id: int
    dropped_turns: int
    tokens: int
    reason: str = ""  # why they were dropped rather than summarised, when a summary was tried


@dataclass
class ContextFull(Message):
    """The conversation outgrew the context and no choice is made yet: the app asks (ContextFullModal)."""
    turn_id: int
    turns: int  # the oldest turns that must be left out at least
    tokens: int
    limit: int


@dataclass
class SummaryStarted(Message):
    turn_id: int
    turns: int


@dataclass
class Summarised(Message):
    """The oldest turns were folded into a summary (conversation.summary's form); `dropped`: turns left out
    besides, when even with the summary the prompt did not fit."""
    turn_id: int
    summary: dict
    dropped: int
    tokens: int
