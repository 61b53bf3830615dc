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

A flush or `finish` never assumes the Markdown documents are there to write to: under load a reply can finish
before its widget is mounted (its children composed), or while it is being removed (a rewind, the app closing;
seen as NoMatches('.answer') in finish). Before the mount the deltas stay buffered and `on_mount` shows them
with how the reply ended; once the documents are gone there is nothing left to draw on, and the whole text stays
in `text`/`reasoning` (the conversation stores it from the engine's own ReplyDone).
"""
from __future__ import annotations

import asyncio
import time

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.events import Resize
from textual.geometry import Size
from textual.signal import Signal
from textual.timer import Timer
from textual.widget import MountError, Widget
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
                 "context": "stopped: the context is full",
                 "refused": "not sent: longer than the whole context"}
# A reply that ends inside its thinking has no answer to show: the note is then all it says.
_THINKING_ONLY = {"length": "stopped while thinking: reached the token limit, before any answer",
                  "cancelled": "cancelled while thinking, before any answer",
                  "context": "stopped while thinking: the context is full, before any answer",
                  "stop": "the model ended its reply while thinking, without an answer",
                  "error": "failed while thinking"}


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
        self.error = ""
        self._mounted = False  # on_mount ran: the children are composed and mounted, a flush can write
        self._finished = False  # finish() ran (maybe before the mount: on_mount then shows the end)
        self._timer: Timer | None = None
        self._layout_signal: Signal | None = None  # kept: unsubscribing must not need self.screen (removed)
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
        # The documents start from the whole text so far, so what was buffered before now is in them already
        # (deltas can arrive before the mount: see the module docstring).
        self._pending_answer.clear()
        self._pending_reasoning.clear()
        title = "Thinking…" if self.streaming and not self.text else _thought_title(self.reasoning)
        thinking = Collapsible(Markdown(self.reasoning, classes="thinking-text"), title=title,
                               collapsed=not self.streaming or bool(self.text), classes="thinking")
        thinking.display = bool(self.reasoning)
        yield thinking
        yield Markdown(self.text, classes="answer")
        meta = Static(self._note(), classes="meta", markup=False)
        meta.display = bool(self._note())
        meta.set_class(bool(self.error), "error")
        yield meta

    async def on_mount(self) -> None:
        self._mounted = True
        if self.streaming:
            self._timer = self.set_interval(FLUSH_S, self._flush)
            self._layout_signal = self.screen.screen_layout_refresh_signal
            self._layout_signal.subscribe(self, self._after_layout, immediate=True)
        elif self._finished:  # finish() came first: flush what arrived after compose, show the note
            await self._show_end()

    def _documents(self) -> tuple[Markdown, Markdown] | None:
        """The Markdown documents a flush writes to (thinking, answer), or None while they cannot take a write:
        before the mount (on_mount flushes then), or once this reply or the app is being closed."""
        if not self._mounted or self._closing or self._pruning or not self.is_attached:
            return None
        # query_one_optional is cached while the children stay the same.
        documents = (self.query_one_optional(".thinking-text", Markdown), self.query_one_optional(".answer", Markdown))
        for document in documents:
            if document is None or not document.is_running or document._closing or document._pruning:
                return None
        return documents

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
        documents = self._documents()
        if documents is None:  # being removed
            return
        settled: set[Widget] = set()
        for document in documents:
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
        # Not composed yet, the thinking block is not there: compose then builds it from the text so far.
        thinking = self.query_one_optional(".thinking", Collapsible)
        if reasoning:
            if not self.reasoning and thinking is not None:
                thinking.display = True
            self.reasoning += text
            self._pending_reasoning.append(text)
        else:
            if not self.text and self.reasoning and thinking is not None:
                # The answer started: fold the thinking away.
                thinking.collapsed = True
                thinking.title = _thought_title(self.reasoning)
            self.text += text
            self._pending_answer.append(text)

    def typed(self) -> None:
        """A key changed the prompt (the app calls this): redraw once its echo has been painted."""
        self._key_at = time.perf_counter()
        if self.streaming:
            self.call_after_refresh(self._flush_after_key)

    async def _flush_after_key(self) -> None:
        # The screen runs this after its next refresh, even if the reply ended or was removed meanwhile
        # (_flush checks the latter).
        if self.streaming:
            await self._flush(after_key=True)

    async def _flush(self, force: bool = False, after_key: bool = False) -> None:
        now = time.perf_counter()
        if not force:
            if now < self._next_flush:  # the previous redraw was slow: leave the UI thread to the keys
                return
            typing = now - self._key_at < TYPING_S
            if typing and not after_key and now - self._last_flush < TYPING_MAX_S:  # see typed()
                return
        documents = self._documents()
        if documents is None:  # before the mount, or while this reply is removed: the deltas stay buffered
            return
        thinking_text, answer = documents
        self._last_flush = now
        self._pin_settled()
        if self._pending_reasoning or self._pending_answer:
            self._flushed_at = now
        if self._pending_reasoning:
            chunk = "".join(self._pending_reasoning)
            self._pending_reasoning.clear()
            if self._reasoning_stream is None:
                self._reasoning_stream = Markdown.get_stream(thinking_text)
            await self._reasoning_stream.write(chunk)
            self.flushes += 1
        if self._pending_answer:
            chunk = "".join(self._pending_answer)
            self._pending_answer.clear()
            if self._answer_stream is None:
                self._answer_stream = Markdown.get_stream(answer)
            await self._answer_stream.write(chunk)
            self.flushes += 1

    async def finish(self, finish_reason: str, error: str = "") -> None:
        """Flush what is left, close the streams, show how the reply ended. Safe at any point of the widget's
        life: before its mount, on_mount does the showing (module docstring)."""
        if not self.streaming:
            return
        self.streaming = False
        self._finished = True
        self.finish_reason = "error" if error else finish_reason
        self.error = error
        if self._timer is not None:
            self._timer.stop()
        if self._layout_signal is not None:
            self._layout_signal.unsubscribe(self)
            self._layout_signal = None
        if self._mounted:
            await self._show_end()

    async def _show_end(self) -> None:
        await self._flush(force=True)
        # A stream whose task has not taken its first step yet (created by a flush on the timer's task just now)
        # would be cancelled by stop() before it ever ran: it would drop what it holds and raise CancelledError
        # here (seen in tests). Every task created so far runs its first step before this one resumes.
        await asyncio.sleep(0)
        for stream in (self._reasoning_stream, self._answer_stream):
            if stream is not None:
                try:
                    await stream.stop()  # appends what the stream still held
                except MountError:
                    # Only if its document was closed after the last write (the app exiting): nothing to draw on.
                    if self._documents() is not None:
                        raise
        if self._documents() is None:  # removed meanwhile: nothing on screen to update
            return
        thinking = self.query_one_optional(".thinking", Collapsible)
        if self.reasoning and thinking is not None:
            thinking.title = _thought_title(self.reasoning)
        meta = self.query_one_optional(".meta", Static)
        if meta is not None:
            note = self._note()
            meta.update(note)
            meta.display = bool(note)
            meta.set_class(bool(self.error), "error")

    def _note(self) -> str:
        if self.streaming:
            return ""
        if self.reasoning and not self.text.strip():  # it ended before any answer: say so, and why
            return _THINKING_ONLY.get(self.finish_reason, "ended while thinking, before any answer") + (
                f": {self.error}" if self.error else "")
        return f"error: {self.error}" if self.error else _FINISH_NOTES.get(self.finish_reason, "")
