"""Conversation widgets: a user message, and an assistant reply that streams thinking and answer as Markdown.

Streaming: deltas are buffered and flushed every 50 ms into a `MarkdownStream` (Markdown.get_stream), which
appends to the document and re-parses only its last block. The whole reply is never re-rendered per token
(elia's O(n^2) mistake), and a 200 tok/s engine costs the UI at most ~20 appends per second.

Each flush still costs a layout and repaint of the screen (15-60 ms on a slow machine): one synchronous chunk on
the UI thread that a key press arriving meanwhile waits behind. Three things keep keys ahead of it
(tests/test_chat_responsiveness.py): the blocks that can no longer change get their height pinned, so the layout
does not re-measure the whole reply on every flush; the flush interval stretches when those layouts are slow, so
they never take most of the UI thread; and while the user types, flushes follow each key's echo instead of
landing at random moments in front of the next key.
"""
from __future__ import annotations

import time

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.events import Resize
from textual.geometry import Size
from textual.widget import Widget
from textual.widgets import Collapsible, Markdown, Static
from textual.widgets.markdown import MarkdownStream

FLUSH_S = 0.05  # the flush timer's tick: the fastest a streaming reply is redrawn
# The share of the UI thread a streaming reply's redraws may take: after a flush, the next one waits for the
# time that flush took to reach the screen (its append, layout and repaint) divided by this. On a fast machine
# that is the next tick; on a slow or busy one the reply is redrawn less often instead of the layouts queueing
# up in front of the keys. Never longer than FLUSH_MAX_S. 0 turns the adaptation off.
FLUSH_SHARE = 0.3
FLUSH_MAX_S = 0.25
# While the user types (keys less than TYPING_S apart), the redraws move to right after each key's echo is on
# screen, the moment the next key is furthest away, instead of landing in front of it; at least every
# TYPING_MAX_S all the same.
TYPING_S = 0.4
TYPING_MAX_S = 0.5
_FINISH_NOTES = {"length": "stopped at the max-tokens limit", "cancelled": "stopped",
                 "context": "stopped: the context is full"}


class UserMessage(Static):
    def __init__(self, text: str, **kwargs):
        super().__init__(text, markup=False, classes="message user", **kwargs)
        self.text = text


def _thought_title(reasoning: str) -> str:
    return f"Thought ({len(reasoning.split())} words)"


class AssistantMessage(Vertical):
    """A reply. Built finished (from history) or streaming (fed by `append`, closed by `finish`)."""

    def __init__(self, text: str = "", reasoning: str = "", finish_reason: str = "", streaming: bool = False,
                 **kwargs):
        super().__init__(classes="message assistant", **kwargs)
        self.text, self.reasoning = text, reasoning
        self.finish_reason = finish_reason
        self.streaming = streaming
        self._pending_answer: list[str] = []
        self._pending_reasoning: list[str] = []
        self._answer_stream: MarkdownStream | None = None
        self._reasoning_stream: MarkdownStream | None = None
        self.flushes = 0  # how many coalesced writes reached the Markdown (tests check it stays small)
        self._flushed_at: float | None = None  # when the latest write went out, until the layout that showed it
        self._next_flush = 0.0
        self._key_at = -1.0  # when the latest key reached the prompt (see typed)
        self._last_flush = 0.0
        # Height pinning of settled Markdown blocks while streaming (see _after_layout).
        self._settled: set[Widget] = set()  # blocks that were not the last of their document at the last layout
        self._measured: dict[Widget, Size] = {}  # settled blocks and the size a layout gave them: pin these
        self.pinned: set[Widget] = set()
        self._pinned_width = 0

    def compose(self) -> ComposeResult:
        title = "Thinking…" if self.streaming else _thought_title(self.reasoning)
        thinking = Collapsible(Markdown(self.reasoning, classes="thinking-text"), title=title,
                               collapsed=not self.streaming or bool(self.text), classes="thinking")
        thinking.display = bool(self.reasoning)
        yield thinking
        yield Markdown(self.text, classes="answer")
        meta = Static(self._note(), classes="meta", markup=False)
        meta.display = bool(self._note())
        yield meta

    def on_mount(self) -> None:
        if self.streaming:
            self._timer = self.set_interval(FLUSH_S, self._flush)
            self.screen.screen_layout_refresh_signal.subscribe(self, self._after_layout, immediate=True)

    # ----- keeping a long streaming reply cheap to lay out -----
    # Each flush grows the last block, so the reply's height changes, and Textual re-arranges the whole reply:
    # a block's box model is cached per container size, so every list and code fence (each a container of
    # widgets) was measured again on every flush. Measured at the end of an 865-token reply: 35-90 ms of layout
    # and repaint per flush, up to ~45 ms of it layout, growing with the reply. MarkdownStream only ever
    # re-parses the last block, so the blocks before it are final: once a layout has measured one, its height is
    # pinned, and Textual takes its arrangement from the cache. Pins are dropped when the width changes.
    # A finished reply keeps them: it no longer grows, and unpinning would cost one more full measurement.
    def _after_layout(self, _screen) -> None:
        """Called synchronously at the end of every screen layout while streaming."""
        if not self.streaming:
            return
        if self._flushed_at is not None:
            took = time.perf_counter() - self._flushed_at  # the write's append, layout and repaint
            self._next_flush = self._flushed_at + min(took / FLUSH_SHARE, FLUSH_MAX_S) if FLUSH_SHARE else 0.0
            self._flushed_at = None
        settled: set[Widget] = set()
        for document in (self.query_one(".thinking-text", Markdown), self.answer):  # query_one is cached
            blocks = document.children
            for block in blocks[:-1]:
                settled.add(block)
                # Settled before this layout, so this layout measured its final text. Paragraphs are left alone:
                # Textual caches their height per width already; the containers (lists, fences) are the cost.
                if block in self._settled and block not in self.pinned and block.children:
                    self._measured[block] = block.outer_size
        self._settled = settled

    def _pin_settled(self) -> None:
        """Pin the measured blocks (done at a flush, whose layout follows anyway)."""
        width = self.outer_size.width
        for block, size in self._measured.items():
            # Only if no layout has changed it since (a resize unpins and measures again).
            if block.is_attached and size.height and block.outer_size == size and width:
                block.styles.height = size.height  # border-box: outer_size is what the height rule sets
                self.pinned.add(block)
                self._pinned_width = width
        self._measured.clear()

    def on_resize(self, event: Resize) -> None:
        if self.pinned and event.size.width != self._pinned_width:  # the text wraps differently: measure again
            for block in self.pinned:
                block.styles.height = None  # back to the stylesheet's auto
            self.pinned.clear()
            self._settled.clear()
            self._measured.clear()

    @property
    def thinking(self) -> Collapsible:
        return self.query_one(".thinking", Collapsible)

    @property
    def answer(self) -> Markdown:
        return self.query_one(".answer", Markdown)

    def append(self, text: str, reasoning: bool) -> None:
        """Called on the UI thread for every delta; cheap (a list append), the timer does the rendering."""
        if reasoning:
            if not self.reasoning:
                self.thinking.display = True
            self.reasoning += text
            self._pending_reasoning.append(text)
        else:
            if not self.text and self.reasoning:
                # The answer started: fold the thinking away.
                self.thinking.collapsed = True
                self.thinking.title = _thought_title(self.reasoning)
            self.text += text
            self._pending_answer.append(text)

    def typed(self) -> None:
        """A key changed the prompt (the app calls this): redraw once its echo has been painted."""
        self._key_at = time.perf_counter()
        if self.streaming:
            self.call_after_refresh(self._flush_after_key)

    async def _flush_after_key(self) -> None:
        # The screen runs this after its next refresh, even if the reply was removed meanwhile (regenerate).
        if self.is_attached and not (self._closing or self._pruning):
            await self._flush(after_key=True)

    async def _flush(self, force: bool = False, after_key: bool = False) -> None:
        now = time.perf_counter()
        if not force:
            if now < self._next_flush:  # the previous redraw was slow: leave the UI thread to the keys
                return
            typing = now - self._key_at < TYPING_S
            if typing and not after_key and now - self._last_flush < TYPING_MAX_S:  # see typed()
                return
        self._last_flush = now
        self._pin_settled()
        if self._pending_reasoning or self._pending_answer:
            self._flushed_at = now
        if self._pending_reasoning:
            chunk = "".join(self._pending_reasoning)
            self._pending_reasoning.clear()
            if self._reasoning_stream is None:
                self._reasoning_stream = Markdown.get_stream(self.query_one(".thinking-text", Markdown))
            await self._reasoning_stream.write(chunk)
            self.flushes += 1
        if self._pending_answer:
            chunk = "".join(self._pending_answer)
            self._pending_answer.clear()
            if self._answer_stream is None:
                self._answer_stream = Markdown.get_stream(self.answer)
            await self._answer_stream.write(chunk)
            self.flushes += 1

    async def finish(self, finish_reason: str, error: str = "") -> None:
        """Flush what is left, close the streams, show how the reply ended."""
        if not self.streaming:
            return
        self.streaming = False
        if getattr(self, "_timer", None) is not None:  # set in on_mount
            self._timer.stop()
        await self._flush(force=True)
        for stream in (self._reasoning_stream, self._answer_stream):
            if stream is not None:
                await stream.stop()
        self.screen.screen_layout_refresh_signal.unsubscribe(self)
        self.finish_reason = "error" if error else finish_reason
        if self.reasoning:
            self.thinking.title = _thought_title(self.reasoning)
        meta = self.query_one(".meta", Static)
        note = f"error: {error}" if error else self._note()
        meta.update(note)
        meta.display = bool(note)
        meta.set_class(bool(error), "error")

    def _note(self) -> str:
        return _FINISH_NOTES.get(self.finish_reason, "")
