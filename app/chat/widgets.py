"""Conversation widgets: a user message, and an assistant reply that streams thinking and answer as Markdown.

Streaming: deltas are buffered and flushed every 50 ms into a `MarkdownStream` (Markdown.get_stream), which
appends to the document and re-parses only its last block. The whole reply is never re-rendered per token
(elia's O(n^2) mistake), and a 200 tok/s engine costs the UI at most ~20 appends per second.
"""
from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
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
