"""The saved-conversations picker (Ctrl+O): type to filter, Enter opens, and delete (asked first) or rename.

The picker only shows and asks; deleting and renaming are the app's (`delete`, `rename`): the open conversation
must be stopped and replaced before its file goes, and renamed in memory as well as on disk, or its next save
would write the old title back.
"""
from __future__ import annotations

import time
from functools import partial
from typing import Awaitable, Callable

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, OptionList, Static
from textual.widgets.option_list import Option

from .conversation import Conversation, clean_title
from .modals import ConfirmModal, LineEditModal

DeleteFn = Callable[[str], Awaitable[None]]
RenameFn = Callable[[str, str], Conversation]


def when_label(ts: float, now: float | None = None) -> str:
    """'today 14:05', 'yesterday 09:12', else the date: when a conversation last changed, in local time."""
    now = time.time() if now is None else now
    day, today = time.localtime(ts)[:3], time.localtime(now)[:3]
    clock = time.strftime("%H:%M", time.localtime(ts))
    if day == today:
        return f"today {clock}"
    if day == time.localtime(now - 86400)[:3]:
        return f"yesterday {clock}"
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))


def turns_label(conv: Conversation) -> str:
    return f"{conv.turns} turn" + ("" if conv.turns == 1 else "s")


def describe(conv: Conversation, is_open: bool = False, now: float | None = None) -> Text:
    """Two lines per conversation: its title, then when it changed, its turns and the model it was made with."""
    turns = turns_label(conv)
    model = f"model {conv.model}" if conv.model else "model unknown"  # files from before the model was recorded
    text = Text(conv.title or "(untitled)", style="bold")
    if is_open:
        text.append("  · open now", style="italic")
    text.append(f"\n  {when_label(conv.updated, now)} · {turns} · {model}", style="dim")
    return text


class ConversationPicker(ModalScreen[str | None]):
    """Saved conversations, newest first; dismissed with the id of the one to open, or None."""

    BINDINGS = [
        Binding("escape", "cancel", "Cancel", id="modal.cancel"),
        # priority: the filter field has the focus and binds ctrl+d itself (delete right; Delete still does that).
        Binding("ctrl+d", "delete", "Delete", id="picker.delete", priority=True,
                tooltip="Conversations list: delete the highlighted conversation (asks first)"),
        Binding("f2", "rename", "Rename", id="picker.rename",
                tooltip="Conversations list: rename the highlighted conversation"),
        Binding("down", "move(1)", "Down", id="picker.down", tooltip="Conversations list: next conversation"),
        Binding("up", "move(-1)", "Up", id="picker.up", tooltip="Conversations list: previous conversation"),
    ]

    def __init__(self, conversations: list[Conversation], open_id: str | None = None, *,
                 delete: DeleteFn | None = None, rename: RenameFn | None = None, keymap: dict | None = None):
        super().__init__(classes="modal")
        self.conversations = list(conversations)
        self.open_id = open_id
        self.delete, self.rename = delete, rename
        self.keymap = keymap or {}
        self.shown: list[Conversation] = []

    def key_for(self, binding_id: str) -> str:
        default = next(b.key for b in self.BINDINGS if b.id == binding_id)
        return self.keymap.get(binding_id, default)

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog", id="picker") as box:
            box.border_title = "Conversations"
            yield Input(placeholder="Type to filter (title or message text)", id="conversation-filter",
                        compact=True)
            yield Static("", id="picker-empty", classes="hint", markup=False)
            yield OptionList(id="conversations")
            yield Static("", id="picker-error", classes="error-message", markup=False)
            keys = []
            if self.delete is not None:
                keys.append(f"{self.key_for('picker.delete')} delete")
            if self.rename is not None:
                keys.append(f"{self.key_for('picker.rename')} rename")
            yield Static(" · ".join(["Enter open", *keys, "Esc close"]), classes="hint", markup=False)

    def on_mount(self) -> None:
        self._set_error("")
        self.refill()
        self.query_one(Input).focus()

    # ----- the list -----
    @property
    def query_text(self) -> str:
        return self.query_one(Input).value

    def refill(self, keep_id: str | None = None, keep_index: int = 0) -> None:
        """Show the conversations the filter matches; the highlight stays on keep_id, else near keep_index."""
        self.shown = [c for c in self.conversations if c.matches(self.query_text)]
        options = self.query_one(OptionList)
        now = time.time()
        options.set_options([Option(describe(c, c.id == self.open_id, now), id=c.id) for c in self.shown])
        ids = [c.id for c in self.shown]
        if ids:
            options.highlighted = ids.index(keep_id) if keep_id in ids else min(keep_index, len(ids) - 1)
        empty = self.query_one("#picker-empty", Static)
        if not self.conversations:
            empty.update("No saved conversations yet.")
        elif not self.shown:
            empty.update(f"No conversation matches “{self.query_text.strip()}”. Backspace widens the search.")
        empty.display = not self.shown
        options.display = bool(self.shown)

    def highlighted(self) -> Conversation | None:
        index = self.query_one(OptionList).highlighted
        return self.shown[index] if index is not None and 0 <= index < len(self.shown) else None

    def _set_error(self, text: str) -> None:
        error = self.query_one("#picker-error", Static)
        error.update(text)
        error.display = bool(text)

    def on_input_changed(self, event: Input.Changed) -> None:
        current = self.highlighted()
        self.refill(keep_id=current.id if current else None)

    def action_move(self, step: int) -> None:
        options = self.query_one(OptionList)
        options.action_cursor_down() if step > 0 else options.action_cursor_up()

    # ----- opening -----
    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        conv = self.highlighted()
        if conv is not None:
            self.dismiss(conv.id)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        self.dismiss(None)

    # ----- deleting and renaming -----
    def action_delete(self) -> None:
        conv = self.highlighted()
        if conv is None or self.delete is None:
            self._set_error("No conversation to delete here." if self.delete else "")
            return
        title = conv.title or "(untitled)"
        note = "\n\nIt is the conversation open now: the chat starts a new one." if conv.id == self.open_id else ""
        self.app.push_screen(
            ConfirmModal("Delete conversation", f"Delete “{title}” ({turns_label(conv)})? Its saved file is "
                         f"removed; this cannot be undone.{note}"),
            partial(self._delete_confirmed, conv))

    async def _delete_confirmed(self, conv: Conversation, yes: bool | None) -> None:
        if not yes:
            return
        index = self.shown.index(conv) if conv in self.shown else 0
        try:
            await self.delete(conv.id)
        except (OSError, ValueError) as exc:
            self._set_error(f"Could not delete “{conv.title}”: {exc}")
            return
        self._set_error("")
        self.conversations = [c for c in self.conversations if c.id != conv.id]
        if conv.id == self.open_id:
            self.open_id = None
        self.refill(keep_index=index)
        self.notify(f"Deleted “{conv.title or conv.id}”.")

    def action_rename(self) -> None:
        conv = self.highlighted()
        if conv is None or self.rename is None:
            self._set_error("No conversation to rename here." if self.rename else "")
            return
        self.app.push_screen(LineEditModal("Rename conversation", conv.title, clean_title,
                                           "Enter renames · Esc keeps the old title"),
                             partial(self._renamed, conv))

    def _renamed(self, conv: Conversation, title: str | None) -> None:
        if title is None:
            return
        try:
            renamed = self.rename(conv.id, title)
        except (OSError, ValueError) as exc:
            self._set_error(f"Could not rename “{conv.title}”: {exc}")
            return
        self._set_error("")
        self.conversations = [renamed if c.id == conv.id else c for c in self.conversations]
        self.refill(keep_id=conv.id)
