"""Fitting a conversation into the model's context: drop the oldest turns of what is *sent* (never of what is
saved) until the prompt fits. No Textual here.

A turn is a user message and the replies that follow it. The system prompt and the new user message are never
dropped; if those two alone do not fit, the message is refused with its size and the limit (ContextTooLong).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

# Room kept for the reply when older turns are dropped anyway: a prompt that fills the context to the last
# token would leave the model one token to answer in. (A quarter of the context at most, for small contexts.)
REPLY_ROOM = 1024


class ContextTooLong(ValueError):
    """The system prompt plus the new message exceed the context by themselves."""

    def __init__(self, tokens: int, limit: int, message_tokens: int | None = None):
        self.tokens, self.limit = tokens, limit
        size = f"{message_tokens} tokens" if message_tokens is not None else f"{tokens} tokens"
        with_system = f" ({tokens} with the system prompt)" if message_tokens is not None else ""
        super().__init__(f"this message is {size}{with_system} and the context limit is {limit} tokens: "
                         "shorten it or split it into parts (it was not sent; later messages work as before)")


@dataclass
class Fitted:
    messages: list[dict]  # what to send
    dropped_turns: int  # the oldest turns left out
    tokens: int  # the prompt's size as sent


def _turn_starts(messages: Sequence[dict], first: int) -> list[int]:
    return [i for i in range(first, len(messages)) if messages[i]["role"] == "user"]


def fit_to_context(messages: Sequence[dict], count: Callable[[list[dict]], int], limit: int,
                   reply_room: int = REPLY_ROOM, tokens: int | None = None) -> Fitted:
    """Drop the oldest turns until `count(messages)` leaves room for a reply within `limit`.

    `count` gives the rendered prompt's size in tokens (`tokens`: that of `messages`, where known). The last message (the new user message) and a leading
    system message are always kept. Raises ContextTooLong when even those two need more than `limit - 1`.
    """
    msgs = [dict(m) for m in messages]
    head = 1 if msgs and msgs[0]["role"] == "system" else 0
    room = min(reply_room, limit // 4)
    tokens = count(msgs) if tokens is None else tokens
    if tokens + room <= limit:
        return Fitted(msgs, 0, tokens)
    starts = _turn_starts(msgs, head)
    # The candidates, shortest drop first: keep the system prompt, then history from the k-th turn start on.
    kept_from = starts[1:] + [len(msgs) - 1]
    best = None
    for n, start in enumerate(dict.fromkeys(kept_from), 1):
        trial = msgs[:head] + msgs[start:]
        tokens = count(trial)
        best = (trial, n, tokens)
        if tokens + room <= limit:
            return Fitted(trial, n, tokens)
    trial, dropped, tokens = best if best is not None else (msgs, 0, tokens)
    if tokens + 1 > limit:  # only the system prompt and the new message are left, and they do not fit
        alone = count(trial[-1:]) if head else None
        raise ContextTooLong(tokens, limit, alone)
    return Fitted(trial, dropped, tokens)  # fits, with less room for the reply than asked
