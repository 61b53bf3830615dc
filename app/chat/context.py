"""Fitting a conversation into the model's context: drop (or fold into a summary) the oldest turns of what is
*sent*, never of what is saved, until the prompt fits. No Textual here.

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


# The summary rides in the system message: Qwen chat templates refuse a system message anywhere but first.
SUMMARY_PREFIX = "Summary of earlier turns: "
SUMMARY_MAX_TOKENS = 256  # the summary's reply length at most (an eighth of a small context)
_SUMMARY_OVERHEAD = 16  # the prefix and the joining newlines, in tokens, kept free beside the summary itself


def summary_budget(limit: int) -> int:
    """How long a summary may be for this context (its reply's max_tokens)."""
    return max(16, min(SUMMARY_MAX_TOKENS, limit // 8))


def with_summary(messages: Sequence[dict], text: str) -> list[dict]:
    """The messages with the summary of earlier turns added to the system prompt (or as the system prompt)."""
    msgs = [dict(m) for m in messages]
    note = SUMMARY_PREFIX + text.strip()
    if msgs and msgs[0]["role"] == "system":
        msgs[0]["content"] = f"{msgs[0]['content']}\n\n{note}" if msgs[0]["content"] else note
        return msgs
    return [{"role": "system", "content": note}, *msgs]


def turns_to_fold(messages: Sequence[dict], count: Callable[[list[dict]], int], limit: int,
                  reply_room: int = REPLY_ROOM) -> int:
    """How many oldest turns must go so that the rest, plus a summary as long as `summary_budget` allows,
    fits (at least one: this is asked when the prompt does not fit). Raises ContextTooLong when no turn can
    make room for one."""
    budget = summary_budget(limit) + _SUMMARY_OVERHEAD
    fitted = fit_to_context(messages, count, limit - budget, reply_room=min(reply_room, limit // 4))
    head = 1 if messages and messages[0]["role"] == "system" else 0
    turns = len(_turn_starts(messages, head)) - 1  # the new message is not a turn that can be folded
    if turns < 1:
        raise ContextTooLong(count(list(messages)), limit)
    return max(1, min(fitted.dropped_turns, turns))


def split_turns(messages: Sequence[dict], n: int) -> tuple[list[dict], list[dict], int]:
    """(the oldest n turns after the system prompt, the rest with the system prompt, the index where the rest's
    history starts in `messages`)."""
    head = 1 if messages and messages[0]["role"] == "system" else 0
    starts = _turn_starts(messages, head) + [len(messages)]
    cut = starts[min(n, len(starts) - 1)]
    return [dict(m) for m in messages[head:cut]], [dict(m) for m in messages[:head] + list(messages[cut:])], cut


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
