"""Conversation widgets: a user message, and an assistant reply that streams thinking and answer as Markdown.

Streaming: deltas are buffered and flushed every 50 ms into a `MarkdownStream` (Markdown.get_stream), which
appends to the document and re-parses only its last block. The whole reply is never re-rendered per token
(elia's O(n^2) mistake), and a 200 tok/s engine costs the UI at most ~20 appends per second.
"""
from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.events import Resize
from textual.geometry import Size
from textual.widget import Widget
from textual.widgets import Collapsible, Markdown, Static
from textual.widgets.markdown import MarkdownStream

FLUSH_S = 0.05
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
        # Settled-block height pinning while streaming (see _after_layout).
        self._settled: set[Widget] = set()  # blocks that were not the last one at the previous layout
        self._measured: dict[Widget, Size] = {}  # settled blocks and the size the latest layout gave them
        self._pinned: set[Widget] = set()
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
    # Every flush grows the last Markdown block, so the reply's height changes and Textual re-arranges the whole
    # reply: the box model of every block is keyed by its container's size, so each list and code fence (a
    # container of widgets) is re-measured, and the cost grows with the reply (measured: a layout+repaint of
    # 35-90 ms per flush at the end of an 865-token reply, one synchronous chunk a key press waits behind).
    # A block that is no longer the last one never changes again (MarkdownStream only re-parses the last block),
    # so once a layout has measured it, its height is pinned: Textual then takes its arrangement from the cache.
    # Pins are dropped when the width changes (resize) and when the reply finishes.
    def _markdowns(self) -> list[Markdown]:
        return list(self.query(Markdown))

    def _after_layout(self, _screen) -> None:
        """Runs synchronously after each screen layout: note the sizes of blocks that were already settled
        before this layout (so the layout saw their final text); _flush pins them."""
        if not self.streaming:
            return
        settled: set[Widget] = set()
        for md in self._markdowns():
            blocks = list(md.children)
            for block in blocks[:-1]:
                settled.add(block)
                if block in self._settled and block not in self._pinned and block.children:
                    self._measured[block] = block.outer_size
        self._settled = settled

    def _pin_settled(self) -> None:
        width = self.outer_size.width
        if self._pinned and width != self._pinned_width:
            self._unpin()
        for block, size in self._measured.items():
            # Only if nothing moved it since it was measured (a resize re-measures first).
            if block.is_attached and size.height > 0 and block.outer_size == size:
                block.styles.height = size.height
                self._pinned.add(block)
                self._pinned_width = width
        self._measured.clear()

    def _unpin(self) -> None:
        for block in self._pinned:
            block.styles.height = None  # back to the CSS (auto)
        self._pinned.clear()
        self._settled.clear()
        self._measured.clear()

    def on_resize(self, event: Resize) -> None:
        if self._pinned and event.size.width != self._pinned_width:
            self._unpin()

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

    async def _flush(self) -> None:
        self._pin_settled()
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
        await self._flush()
        for stream in (self._reasoning_stream, self._answer_stream):
            if stream is not None:
                await stream.stop()
        self.screen.screen_layout_refresh_signal.unsubscribe(self)
        self._unpin()  # a finished reply no longer grows: plain auto heights, as when loaded from history
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
