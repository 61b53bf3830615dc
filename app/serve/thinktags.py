"""`<think>...</think>` inside streamed `content`, for servers that do not fill `reasoning_content`.

vLLM and SGLang without a reasoning parser, and llama-server with `--reasoning-format none`, send Qwen's
thinking inline. With thinking on, Qwen3's chat template already ends the prompt with `<think>\\n`, so the reply
starts inside the thought and only `</think>` shows up; with it off, the template closes an empty think block.
So: thinking on -> text is reasoning until `</think>` (a leading `<think>` is dropped too, for templates that
leave it to the model); thinking off -> text is the answer unless it opens with `<think>`.
Tags split across chunks are held back until they are settled, so no half tag is ever shown.
"""
from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"


def _partial_suffix(buf: str, tag: str) -> int:
    for k in range(min(len(tag) - 1, len(buf)), 0, -1):
        if buf.endswith(tag[:k]):
            return k
    return 0


class InlineThinkSplitter:
    def __init__(self, enable_thinking: bool):
        self._after_open = "reasoning" if enable_thinking else "content"
        self.mode = "start"  # start -> reasoning -> content
        self._buf = ""

    def passthrough(self) -> None:
        """The server splits reasoning itself: content is only the answer from now on."""
        if self.mode == "start" and not self._buf:
            self.mode = "content"

    def push(self, text: str) -> list[tuple[str, str]]:
        """-> [(kind, text)], kind "reasoning" or "content"."""
        self._buf += text
        out: list[tuple[str, str]] = []
        while self._buf:
            if self.mode == "start":
                head = self._buf.lstrip()
                if head.startswith(OPEN):
                    self._buf, self.mode = head[len(OPEN):].lstrip("\n"), "reasoning"
                elif OPEN.startswith(head):  # only whitespace or a tag's beginning so far: wait
                    break
                else:
                    self.mode = "reasoning" if self._after_open == "reasoning" else "content"
            elif self.mode == "reasoning":
                i = self._buf.find(CLOSE)
                if i >= 0:
                    self._emit(out, "reasoning", self._buf[:i])
                    self._buf, self.mode = self._buf[i + len(CLOSE):].lstrip("\n"), "content"
                    continue
                keep = _partial_suffix(self._buf, CLOSE)
                self._emit(out, "reasoning", self._buf[:len(self._buf) - keep])
                self._buf = self._buf[len(self._buf) - keep:]
                break
            else:
                self._emit(out, "content", self._buf)
                self._buf = ""
        return out

    def flush(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        if self._buf:
            kind = "reasoning" if self.mode == "reasoning" else "content"
            self._emit(out, kind, self._buf.strip() if self.mode == "start" else self._buf)
        self._buf = ""
        return out

    @staticmethod
    def _emit(out: list[tuple[str, str]], kind: str, text: str) -> None:
        if text:
            out.append((kind, text))
