"""The prompt: a multi-line TextArea where Enter sends, Shift+Enter / Ctrl+J inserts a newline, and Up/Down on
the first/last line walk the history of sent prompts."""
from __future__ import annotations

from dataclasses import dataclass

from textual import events
from textual.binding import Binding
from textual.message import Message
from textual.widgets import TextArea


SEND_ID, SEND_DEFAULT = "prompt.send", "enter"  # handled in _on_key (see there), remappable like a binding


class PromptInput(TextArea):
    BINDING_GROUP_TITLE = "Prompt"
    BINDINGS = [
        # Terminals without the kitty keyboard protocol cannot tell Shift+Enter from Enter; Ctrl+J always works.
        Binding("shift+enter,ctrl+j,alt+enter", "newline", "Newline", id="prompt.newline", show=False,
                tooltip="Insert a line break instead of sending"),
    ]

    @dataclass
    class Submitted(Message):
        prompt: "PromptInput"
        text: str

    def __init__(self, send_keys: str = SEND_DEFAULT, **kwargs):
        """send_keys: the key(s) that send, comma-separated (keymap id `prompt.send`)."""
        super().__init__(soft_wrap=True, show_line_numbers=False, tab_behavior="focus", **kwargs)
        self.send_keys = frozenset(k.strip() for k in send_keys.split(",") if k.strip()) or frozenset({SEND_DEFAULT})
        self.sent: list[str] = []
        self._pos: int | None = None  # index into history while recalling; None = editing a fresh draft
        self._draft = ""

    async def _on_key(self, event: events.Key) -> None:
        # Enter (or the keymap's `prompt.send`) sends. Handled here, in the prompt's own queue, so it runs after the keys typed before it: a
        # priority binding would run on the app's queue and could overtake them (a fast typist, tmux send-keys
        # or a terminal's paste-as-keys would send before the text arrived).
        if event.key in self.send_keys:
            event.stop()
            event.prevent_default()
            self.action_submit()
            return
        await super()._on_key(event)

    def action_submit(self) -> None:
        if self.text.strip():
            self.post_message(self.Submitted(self, self.text))

    def action_newline(self) -> None:
        self.insert("\n")

    def remember(self, text: str) -> None:
        if text.strip() and (not self.sent or self.sent[-1] != text):
            self.sent.append(text)
        self._pos = None

    def set_text(self, text: str) -> None:
        self.load_text(text)
        last = self.document.line_count - 1
        self.move_cursor((last, len(self.document.get_line(last))))

    def action_cursor_up(self, select: bool = False) -> None:
        if select or self.cursor_location[0] > 0 or not self.sent or self._pos == 0:
            super().action_cursor_up(select)
            return
        if self._pos is None:
            self._draft, self._pos = self.text, len(self.sent)
        self._pos -= 1
        self.set_text(self.sent[self._pos])

    def action_cursor_down(self, select: bool = False) -> None:
        if select or self._pos is None or self.cursor_location[0] < self.document.line_count - 1:
            super().action_cursor_down(select)
            return
        self._pos += 1
        if self._pos >= len(self.sent):
            self._pos = None
            self.set_text(self._draft)
        else:
            self.set_text(self.sent[self._pos])
