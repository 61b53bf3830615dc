"""Stop strings over streamed text: cut at the first stop, even when it spans several token pieces.

A piece is released only when no stop can start inside it, so a stream never shows a stop string's first
half: the tail that could still grow into a stop is held back until the next piece settles it.
In chat completions the stops apply to the answer (`content`), not to the reasoning: a stop word meant for the
reply should not end the thinking that precedes it.
"""
from __future__ import annotations

from typing import Sequence


class StopMatcher:
    def __init__(self, stops: Sequence[str]):
        self.stops = tuple(s for s in stops if s)
        self.stopped = False
        self._held = ""

    def push(self, text: str) -> str:
        """Text that is now safe to emit. After a stop is found, `stopped` is True and nothing more comes out."""
        if self.stopped or not text:
            return ""
        if not self.stops:
            return text
        buf = self._held + text
        hits = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.stopped, self._held = True, ""
            return buf[:min(hits)]
        hold = max((self._partial(buf, s) for s in self.stops), default=0)
        self._held = buf[len(buf) - hold:] if hold else ""
        return buf[:len(buf) - hold]

    def flush(self) -> str:
        """At the end of generation: what was held back is just text (no stop completed it)."""
        out, self._held = ("" if self.stopped else self._held), ""
        return out

    @staticmethod
    def _partial(buf: str, stop: str) -> int:
        """Length of the longest suffix of buf that is a proper prefix of stop."""
        for k in range(min(len(stop) - 1, len(buf)), 0, -1):
            if buf.endswith(stop[:k]):
                return k
        return 0
