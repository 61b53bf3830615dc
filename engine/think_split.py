"""Splitting a streamed reply into reasoning and answer by token id: the tokenizer's own <think>/</think> tokens.

By id rather than by text, so that (a) a tokenizer that marks the tags special (as transformers-made ones can)
still has them seen, though special tokens are otherwise skipped when decoding, and (b) the text "<think>" that an
answer writes (spelled with ordinary tokens, or the tag token itself where no segment may open) stays answer text.

A reasoning segment exists only where thinking is on: the template opened it (the prompt ends with <think>), or,
with a template that leaves it to the model, the reply's first token is <think>. It ends at the first </think>;
after it, and with thinking off, both tags are answer text. The newlines the template puts around the tags
(`<think>\\n` reasoning `\\n</think>\\n\\n` answer) are dropped, as ThinkSplitter does for text.

Tokenizers without the tags as added tokens fall back to ThinkSplitter on the decoded text (`reply_splitter`).
"""
from __future__ import annotations

from .tokenizer import THINK_END, THINK_START, ChatTokenizer, StreamDecoder, ThinkSplitter

Pieces = list[tuple[str, str]]  # ("reasoning" | "answer", text)


class ThinkTokenSplitter:
    """push(token_id) -> pieces; flush() -> the rest. Other special tokens are skipped, the tags never."""

    def __init__(self, tokenizer: ChatTokenizer, *, thinking: bool, opened: bool, open_id: int, close_id: int,
                 after_open: int = 0) -> None:
        """opened: the prompt ended inside <think>; after_open: newlines still to drop at the reasoning's start
        (1 where the prompt ended right at the tag, 0 where it ended with the template's newline)."""
        self._open_id, self._close_id = open_id, close_id
        self._decoder = StreamDecoder(tokenizer, skip_special_tokens=True, keep={open_id, close_id})
        self._may_open = thinking and not opened  # the model may open the segment with its first token
        self._reasoning = opened
        self._separator = after_open if self._reasoning else 0  # newlines to drop next
        self._newline = False  # a reasoning "\n" held back: it is dropped if </think> follows
        self._first = True

    def push(self, token_id: int) -> Pieces:
        out: Pieces = []
        first, self._first = self._first, False
        if self._reasoning and token_id == self._close_id:
            self._emit(out, self._decoder.flush())
            self._newline, self._reasoning, self._separator = False, False, 2
            return out
        if first and self._may_open and token_id == self._open_id:
            self._reasoning, self._separator = True, 1
            return out
        self._emit(out, self._decoder.push(token_id))
        return out

    def flush(self) -> Pieces:
        out: Pieces = []
        self._emit(out, self._decoder.flush())
        if self._newline:  # the reply ended inside its thinking: the held newline is reasoning text after all
            self._newline = False
            self._add(out, "\n")
        return out

    def _emit(self, out: Pieces, text: str) -> None:
        while self._separator and text.startswith("\n"):
            text, self._separator = text[1:], self._separator - 1
        if text:
            self._separator = 0
        if not text:
            return
        if self._reasoning:
            if self._newline:
                text, self._newline = "\n" + text, False
            if text.endswith("\n"):
                text, self._newline = text[:-1], True
        self._add(out, text)

    def _add(self, out: Pieces, text: str) -> None:
        kind = "reasoning" if self._reasoning else "answer"
        if text and out and out[-1][0] == kind:
            out[-1] = (kind, out[-1][1] + text)
        elif text:
            out.append((kind, text))


class _TextSplit:
    """The fallback: decode, then find the tags in the text."""

    def __init__(self, tokenizer: ChatTokenizer, *, thinking: bool, opened: bool) -> None:
        self._decoder = StreamDecoder(tokenizer, skip_special_tokens=True)
        self._split = ThinkSplitter(in_thinking=opened, opens=thinking and not opened)

    def push(self, token_id: int) -> Pieces:
        return self._split.push(self._decoder.push(token_id))

    def flush(self) -> Pieces:
        return self._split.push(self._decoder.flush()) + self._split.flush()


def reply_splitter(tokenizer: ChatTokenizer, prompt_text: str, thinking: bool) -> ThinkTokenSplitter | _TextSplit:
    """The splitter for one chat reply, from the prompt the template rendered and whether thinking is on."""
    stripped = prompt_text.rstrip("\n")
    opened = stripped.endswith(THINK_START)  # the template is what opens the segment (thinking on)
    open_id, close_id = tokenizer.added_token_id(THINK_START), tokenizer.added_token_id(THINK_END)
    if open_id is None or close_id is None:
        return _TextSplit(tokenizer, thinking=thinking, opened=opened)
    return ThinkTokenSplitter(tokenizer, thinking=thinking, opened=opened, open_id=open_id, close_id=close_id,
                              after_open=1 if opened and stripped == prompt_text else 0)
