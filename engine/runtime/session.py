"""Conversation reuse: a Session keeps one conversation's sequence state between turns.

The next turn prefills only the tokens after the longest common prefix with what the state holds. The
hybrid model cannot roll a GatedDeltaNet state back, so the session keeps snapshots of the recurrent state
(with the logits of their last token) at turn boundaries: before the generation prompt of each turn, and at
the end of each prompt. Regenerate (same prompt) restores the end-of-prompt snapshot and prefills nothing;
an edit or a re-rendered history restores the latest snapshot inside the common prefix. KV entries below a
snapshot's length are never overwritten by later tokens of the same session, so restoring the recurrent part
is enough; snapshots past a restore point are dropped once newer tokens overwrite their KV.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from ..model.cache import SequenceState, StateSnapshot
from .runner import Runner

MAX_SNAPSHOTS = 8  # each holds the GDN states: ~61 MiB for Qwen3.6-35B-A3B


@dataclass(frozen=True)
class TurnSnapshot:
    length: int
    state: StateSnapshot
    logits: torch.Tensor  # float32 [1, V]: the next-token logits at `length`


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class Session:
    def __init__(self, runner: Runner):
        self.runner = runner
        self.state: SequenceState = runner.new_state()
        self._epoch = runner.epoch
        self.tokens: list[int] = []  # what self.state holds, in order
        self.snapshots: list[TurnSnapshot] = []
        self.last_reused = 0  # tokens of the last prompt served from the cache

    def sync(self) -> SequenceState:
        """The session's state, started over if another sequence used the runner's shared (graph) state."""
        if self.runner.shares_state and self._epoch != self.runner.epoch:
            self.state = self.runner.new_state()
            self._epoch = self.runner.epoch
            self.tokens, self.snapshots = [], []
        return self.state

    def prefill(self, prompt: list[int], boundary: int | None = None,
                cancel: threading.Event | None = None) -> torch.Tensor:
        """Bring the state to exactly `prompt`; returns the float32 logits [1, V] after its last token.

        boundary: a prompt length to snapshot on the way (the end of the history before the generation
        prompt), so that the next turn, whose template re-renders this turn's reply, restores there."""
        self.sync()
        keep = common_prefix(self.tokens, prompt)
        if keep < len(self.tokens) or keep == len(prompt):
            self._rewind(keep)
        start = len(self.tokens)
        self.last_reused = start
        if start == len(prompt):
            return self.snapshots[-1].logits.clone()
        device = self.runner.model.device
        logits = None
        for stop in sorted({b for b in (boundary,) if b is not None and start < b < len(prompt)} | {len(prompt)}):
            ids = torch.tensor(prompt[len(self.tokens):stop], dtype=torch.long, device=device)
            logits = self.runner.prefill(self.state, ids, cancel=cancel)
            self.tokens = list(prompt[:stop])
            self._snapshot(logits)
        return logits

    def _rewind(self, keep: int) -> None:
        """Restore the latest snapshot at or below `keep` tokens (or start empty)."""
        usable = [s for s in self.snapshots if s.length <= keep]
        self.snapshots = usable
        if not usable:
            self.state.reset()
            self.tokens = []
            return
        snap = usable[-1]
        self.state.restore(snap.state)
        self.tokens = self.tokens[:snap.length]

    def _snapshot(self, logits: torch.Tensor) -> None:
        self.snapshots = [s for s in self.snapshots if s.length < len(self.tokens)]
        self.snapshots.append(TurnSnapshot(len(self.tokens), self.state.snapshot(), logits.detach().clone()))
        del self.snapshots[:-MAX_SNAPSHOTS]

    def record_generated(self, generated: list[int]) -> None:
        """After a reply: the state also holds the generated tokens that were fed back (all but the last)."""
        fed = self.state.seq_len - len(self.tokens)
        self.tokens.extend(generated[:fed])
