"""Summarising the oldest turns of a conversation that outgrew the context, through the chat's own backend.

Runs on the turn's worker thread. The request is bounded (it fits the context with room for the summary), the
reply is bounded (max_tokens) and thinking is off. Failure is an exception whose message says why; the caller
then drops the turns instead. No Textual here.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Sequence

from qwenlocal.engine.events import EngineError, TurnDone

# One user message, no system prompt: in a small context every token of the instructions is one less for the turns.
ASK = ("Summarise the conversation below in at most {words} words, for the assistant that continues it. Keep names, "
       "numbers, decisions and open questions; no preamble.\n\n")
_CAP_START = 4000  # characters a message keeps in the request before the request is found too long


class SummaryFailed(Exception):
    """The summary could not be written (the message says why: cancelled, an engine error, no room)."""


@dataclass
class Summary:
    text: str
    tokens: int  # the summary's length as the engine produced it


def _transcript(previous: str, turns: Sequence[dict], cap: int) -> str:
    parts = [f"(Earlier summary) {previous}"] if previous else []
    for m in turns:
        text = m["content"] if len(m["content"]) <= cap else m["content"][:cap] + " […]"
        parts.append(f"{'User' if m['role'] == 'user' else 'Assistant'}: {text}")
    return "\n\n".join(parts)


def summary_request(previous: str, turns: Sequence[dict], budget: int, count: Callable[[list[dict]], int],
                    limit: int) -> list[dict]:
    """The messages asking for the summary, shortened (each message cut shorter) until they fit with room for
    `budget` tokens of reply. Raises SummaryFailed when even cut short they do not."""
    words = max(10, budget * 2 // 3)
    cap = _CAP_START
    while cap >= 50:
        request = [{"role": "user", "content": ASK.format(words=words) + _transcript(previous, turns, cap)}]
        if count(request) + budget <= limit:
            return request
        cap //= 2
    raise SummaryFailed("the turns to summarise do not fit in a summary request")


def write_summary(backend, request: list[dict], budget: int, cancel: threading.Event) -> Summary:
    """Run the request on the backend; the summary, or SummaryFailed."""
    sampling = {"max_tokens": budget, "temperature": 0.3}
    try:
        for ev in backend.start_turn(request, sampling, False, cancel, 0):
            if isinstance(ev, EngineError):
                raise SummaryFailed(f"the engine failed: {ev.message}")
            if isinstance(ev, TurnDone):
                if ev.finish_reason == "cancelled":
                    raise SummaryFailed("cancelled")
                text = " ".join(ev.text.split())
                if not text:
                    raise SummaryFailed("the model wrote an empty summary")
                return Summary(text, ev.completion_tokens)
    except SummaryFailed:
        raise
    except Exception as exc:  # a backend's error (QwenlocalError or a bug): the turns are dropped instead
        raise SummaryFailed(f"{type(exc).__name__}: {exc}") from exc
    raise SummaryFailed("the backend ended the summary without finishing it")
