"""Copying from the conversation: the last reply, or one code block picked with the code-block keys. A mixin of
ChatApp (like actions.py); clipboard.py does the copying and words the message.

The code blocks are the answers' MarkdownFence widgets, whose `code` is the block's text without the fence
lines and the language tag. The focused one carries the `code-focus` class: chat.tcss draws an outline, which
changes no size (the block heights pinned while a reply streamed stay right).
"""
from __future__ import annotations

import asyncio

from textual.widgets import Markdown
from textual.widgets.markdown import MarkdownFence

from .clipboard import copy_locally, line_count
from .widgets import AssistantMessage

FOCUS_CLASS = "code-focus"
COPY_CODE_ID = "chat.copy_code"


def code_blocks(view) -> list[MarkdownFence]:
    """The code blocks of the finished replies, newest first. A reply still streaming is left out: its last block
    may still grow, and copying it would take half a block."""
    blocks: list[MarkdownFence] = []
    for reply in view.query(AssistantMessage):
        answer = reply.query_one_optional(".answer", Markdown)
        if not reply.streaming and answer is not None:
            blocks.extend(answer.query(MarkdownFence))
    blocks.reverse()
    return blocks


def block_title(blocks: list[MarkdownFence], block: MarkdownFence) -> str:
    language = f"{block.lexer}, " if block.lexer else ""
    return f"Code block {blocks.index(block) + 1} of {len(blocks)} ({language}{line_count(block.code)}, newest first)"


class CopyActions:
    """Needs the ChatApp attributes: conv, view, store, keymap, BINDINGS."""

    _code_focus: MarkdownFence | None = None

    def _key_of(self, binding_id: str) -> str:
        default = next((b.key for b in self.BINDINGS if b.id == binding_id), "")
        return self.keymap.get(binding_id, default)

    def _focused_block(self, blocks: list[MarkdownFence]) -> MarkdownFence | None:
        block = self._code_focus
        return block if block is not None and block in blocks else None  # gone with a rewind or a new chat

    def clear_code_focus(self) -> bool:
        """Drop the highlight; False if no block was focused."""
        block, self._code_focus = self._code_focus, None
        if block is None:
            return False
        block.remove_class(FOCUS_CLASS)
        return True

    def _focus_block(self, block: MarkdownFence) -> None:
        self.clear_code_focus()
        self._code_focus = block
        block.add_class(FOCUS_CLASS)
        self.view.scroll_to_widget(block, animate=False, center=True)  # releases the anchor (End: it holds again)

    def _no_blocks(self) -> None:
        self.notify("No code block to copy: none of the finished replies has one.", severity="warning")

    def action_code_older(self) -> None:
        self._move_code_focus(+1)

    def action_code_newer(self) -> None:
        self._move_code_focus(-1)

    def _move_code_focus(self, step: int) -> None:
        blocks = code_blocks(self.view)
        if not blocks:
            self._no_blocks()
            return
        current = self._focused_block(blocks)
        if current is None:  # the first press: the newest block (or, going the other way, the oldest)
            index = 0 if step > 0 else len(blocks) - 1
        else:
            index = (blocks.index(current) + step) % len(blocks)
        self._focus_block(blocks[index])
        self.notify(f"{self._key_of(COPY_CODE_ID)} copies it · Esc clears the highlight",
                    title=block_title(blocks, blocks[index]))

    async def action_copy_code(self) -> None:
        """Copy the focused code block (with none focused: the newest, which is then focused)."""
        blocks = code_blocks(self.view)
        if not blocks:
            self._no_blocks()
            return
        block = self._focused_block(blocks) or blocks[0]
        self._focus_block(block)
        await self.copy_text(block.code, block_title(blocks, block))

    async def action_copy_reply(self) -> None:
        idx = self.conv.last_index("assistant")
        if idx is None:
            self.notify("No reply to copy yet.", severity="warning")
            return
        await self.copy_text(self.conv.messages[idx].content, "The last reply")

    async def copy_text(self, text: str, title: str) -> None:
        """Send OSC 52 (Textual; it also sets app.clipboard), try the local tools, and say what happened."""
        self.copy_to_clipboard(text)
        outcome = await asyncio.to_thread(copy_locally, text, self.store.root.parent)  # the data folder
        self.notify(outcome.message(), title=title, severity="information" if outcome.tool else "warning",
                    timeout=5 if outcome.tool else 12)
