"""A scripted backend: the chat app's tests (and `qwenlocal chat --fake`) run without a model or torch.

It follows the backend protocol exactly, including the cancel contract (checked before every token, so at most
the token in flight is delivered after Esc) and the thread it runs on (the app's worker).
"""
from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

from qwenlocal.engine.errors import CheckpointError
from qwenlocal.engine.events import EngineError, Event, ReasoningDelta, Stats, TokenDelta, TurnDone

from .backend import ProgressFn

_PIECE = re.compile(r"\s*\S+|\s+")


def split_tokens(text: str) -> list[str]:
    """Word-ish pieces (leading space kept) stand in for tokens."""
    return _PIECE.findall(text)


@dataclass
class ScriptedReply:
    answer: str = "Hello! This is a **scripted** reply."
    reasoning: str = ""
    error_after: int | None = None  # emit an EngineError after this many answer tokens
    error: str = "the scripted engine failed on purpose"
    finish_reason: str = "stop"  # how it ends when not cancelled ("length": the token limit was reached)


@dataclass
class ScriptedBackend:
    replies: list[ScriptedReply] = field(default_factory=lambda: [ScriptedReply()])
    tokens_per_s: float | None = None  # None: as fast as the consumer takes them
    hold_after: int | None = None  # block after this many tokens until `release` is set (or cancel)
    load_delay_s: float = 0.0
    load_error: Exception | None = None
    hold_load_at: tuple[str, int] | None = None  # (stage, done): block there until `release` (loading snapshots)
    label: str = "scripted (fake backend)"
    context_limit: int = 4096
    calls: list[dict] = field(default_factory=list)  # what start_turn was asked, in order
    after_cancel: list[int] = field(default_factory=list)  # tokens delivered after cancel was seen, per turn
    release: threading.Event = field(default_factory=threading.Event)
    holding: threading.Event = field(default_factory=threading.Event)  # set while blocked at hold_after
    _turns: int = 0

    def load(self, progress: ProgressFn) -> None:
        stages = [("model", 1), ("weights", 4), ("bank", 2), ("graphs", 1)]
        for stage, total in stages:
            for done in range(total + 1):
                progress(stage, done, total)
                if self.hold_load_at == (stage, done):
                    self.holding.set()
                    self.release.wait()
                if self.load_delay_s:
                    time.sleep(self.load_delay_s / 8)
        if self.load_error is not None:
            raise self.load_error
        progress("ready", 1, 1)

    def start_turn(self, messages: Sequence[Mapping[str, str]], sampling: Mapping[str, Any],
                   enable_thinking: bool, cancel: threading.Event, reuse_prefix: int = 0) -> Iterator[Event]:
        reply = self.replies[min(self._turns, len(self.replies) - 1)]
        self._turns += 1
        self.calls.append({"messages": [dict(m) for m in messages], "sampling": dict(sampling),
                           "enable_thinking": enable_thinking, "reuse_prefix": reuse_prefix})
        prompt_tokens = self.count_tokens(messages, enable_thinking)
        return self._stream(reply, enable_thinking, cancel, prompt_tokens)

    def count_tokens(self, messages: Sequence[Mapping[str, str]], enable_thinking: bool) -> int:
        return sum(len(split_tokens(m["content"])) + 4 for m in messages)

    def _stats(self, prompt_tokens: int, produced: int) -> dict:
        # Fixed figures, so snapshots do not depend on the machine's speed.
        return {"prompt_tokens": prompt_tokens, "completion_tokens": produced, "context_limit": self.context_limit,
                "ttft_s": 0.042, "decode_tok_s": self.tokens_per_s or 123.4, "expert_hit_rate": 0.87,
                "h2d_gbps": 11.8, "vram_used": 9.5 * 2**30, "vram_total": 16 * 2**30}

    def _stream(self, reply: ScriptedReply, thinking: bool, cancel: threading.Event,
                prompt_tokens: int) -> Iterator[Event]:
        pieces = [(True, p) for p in split_tokens(reply.reasoning)] if thinking else []
        pieces += [(False, p) for p in split_tokens(reply.answer)]
        t0 = time.perf_counter()
        produced, delivered_after_cancel = 0, 0
        text, reasoning = [], []
        finish = reply.finish_reason
        for i, (is_reasoning, piece) in enumerate(pieces):
            if self.hold_after is not None and i == self.hold_after:
                self.holding.set()
                while not self.release.wait(0.005) and not cancel.is_set():
                    pass
                self.holding.clear()
            if cancel.is_set():  # the "decode step" boundary: nothing more after this
                finish = "cancelled"
                break
            if self.tokens_per_s:
                delay = t0 + i / self.tokens_per_s - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
            if reply.error_after is not None and not is_reasoning and len(text) == reply.error_after:
                yield EngineError(reply.error, "GenerationError")
                return
            produced += 1
            delivered_after_cancel += cancel.is_set()  # decoded while the cancel was already set
            (reasoning if is_reasoning else text).append(piece)
            yield ReasoningDelta(piece) if is_reasoning else TokenDelta(piece)
            if produced % 8 == 0:
                yield Stats(self._stats(prompt_tokens, produced))
        self.after_cancel.append(delivered_after_cancel)
        yield TurnDone(finish, prompt_tokens, produced, "".join(text), "".join(reasoning),
                       self._stats(prompt_tokens, produced))

    def stats(self) -> dict:
        return self._stats(0, 0)

    @property
    def sampling_defaults(self) -> dict:
        return {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_tokens": 4096, "seed": None}

    @property
    def plan(self) -> dict:
        return {"device": {"value": "fake", "reason": "scripted backend for tests"},
                "overlap": {"value": "copy-side", "reason": "scripted: PCIe copy overlaps the shared expert"},
                "prefill_mode": {"value": "layer-major", "reason": "scripted: prompts over 2048 tokens"}}

    def close(self) -> None:
        self.release.set()


def failing_backend(message: str = "no config.json in /nowhere") -> ScriptedBackend:
    """A backend whose load fails the way a missing checkpoint does."""
    return ScriptedBackend(load_error=CheckpointError(message))
