"""Modal screens that ask or tell: an error, a text to edit, sampling settings, a past conversation to open."""
from __future__ import annotations

import time

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, OptionList, Static, TextArea
from textual.widgets.option_list import Option

from .conversation import Conversation
from .settings import SAMPLING_KEYS, parse_value


class ErrorModal(ModalScreen[None]):
    """What went wrong and what to do; never a traceback (harlequin's ErrorModal)."""

    BINDINGS = [Binding("escape,enter", "dismiss", "Close", id="modal.close")]

    def __init__(self, title: str, message: str, hint: str = "", button: str = "OK"):
        super().__init__(classes="modal error-modal")
        self.title_text, self.message, self.hint, self.button = title, message, hint, button

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog") as box:
            box.border_title = self.title_text
            yield Static(self.message, classes="error-message", markup=False)
            if self.hint:
                yield Static(self.hint, classes="hint", markup=False)
            yield Button(self.button, variant="error", id="close", compact=True)

    def on_mount(self) -> None:
        self.query_one("#close", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(None)

    async def action_dismiss(self, result=None) -> None:
        self.dismiss(None)


class TextEditModal(ModalScreen[str | None]):
    """Edit a piece of text (the last message, the system prompt). Ctrl+S saves, Esc cancels."""

    BINDINGS = [Binding("ctrl+s", "save", "Save", id="modal.save"),
                Binding("escape", "cancel", "Cancel", id="modal.cancel")]

    def __init__(self, title: str, text: str, hint: str = ""):
        super().__init__(classes="modal")
        self.title_text, self.text, self.hint = title, text, hint

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog") as box:
            box.border_title = self.title_text
            yield TextArea(self.text, soft_wrap=True, id="edit-text")
            yield Static(self.hint or "Ctrl+S save · Esc cancel", classes="hint", markup=False)
            with Horizontal(classes="buttons"):
                yield Button("Save", variant="primary", id="save", compact=True)
                yield Button("Cancel", id="cancel", compact=True)

    def on_mount(self) -> None:
        self.query_one(TextArea).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.action_save() if event.button.id == "save" else self.action_cancel()

    def action_save(self) -> None:
        self.dismiss(self.query_one(TextArea).text)

    def action_cancel(self) -> None:
        self.dismiss(None)


class SamplingModal(ModalScreen[dict | None]):
    """Temperature, top-p, top-k, max tokens, seed; empty = the model's default."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="modal.cancel")]

    def __init__(self, current: dict, defaults: dict | None = None):
        super().__init__(classes="modal")
        self.current = current
        self.defaults = defaults or {}  # the model's own values, shown where nothing is set

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog") as box:
            box.border_title = "Sampling settings"
            for key in SAMPLING_KEYS:
                value = self.current.get(key)
                with Horizontal(classes="field"):
                    yield Label(key, classes="field-label")
                    default = self.defaults.get(key)
                    hint = "model default" + ("" if default is None else f": {default}")
                    yield Input("" if value is None else str(value), placeholder=hint, id=key, compact=True)
            yield Static("", id="sampling-error", classes="error-message", markup=False)
            with Horizontal(classes="buttons"):
                yield Button("Apply", variant="primary", id="apply", compact=True)
                yield Button("Cancel", id="cancel", compact=True)

    def on_input_submitted(self) -> None:
        self._apply()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self._apply() if event.button.id == "apply" else self.action_cancel()

    def _apply(self) -> None:
        try:
            values = {key: parse_value(key, self.query_one(f"#{key}", Input).value) for key in SAMPLING_KEYS}
        except ValueError as exc:
            self.query_one("#sampling-error", Static).update(str(exc))
            return
        self.dismiss(values)

    def action_cancel(self) -> None:
        self.dismiss(None)


class ConversationPicker(ModalScreen[str | None]):
    """Pick a saved conversation (newest first); Enter opens it, Esc cancels."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="modal.cancel")]

    def __init__(self, conversations: list[Conversation]):
        super().__init__(classes="modal")
        self.conversations = conversations

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog") as box:
            box.border_title = "Open a conversation"
            if not self.conversations:
                yield Static("No saved conversations yet.", classes="hint")
            options = [Option(f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(c.updated))}  "
                              f"{c.title or '(untitled)'}  · {len(c.messages)} msgs", id=c.id)
                       for c in self.conversations]
            yield OptionList(*options, id="conversations")

    def on_mount(self) -> None:
        self.query_one(OptionList).focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        self.dismiss(None)
