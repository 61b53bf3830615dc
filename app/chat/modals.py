"""Modal screens that ask or tell: an error, a yes/no question, a text or a line to edit, sampling settings,
what to do with a conversation that outgrew the context.

The saved-conversations picker is in picker.py."""
from __future__ import annotations

from typing import Callable

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, Input, Label, Select, Static, TextArea

from .settings import CONTEXT_FULL_CHOICES, SAMPLING_KEYS, parse_value


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


class ConfirmModal(ModalScreen[bool]):
    """A yes/no question about something that cannot be undone. Cancel has the focus: Enter alone keeps."""

    BINDINGS = [Binding("y", "confirm", "Yes", id="confirm.yes"),
                Binding("n,escape", "cancel", "No", id="confirm.no")]

    def __init__(self, title: str, message: str, yes: str = "Delete", no: str = "Cancel"):
        super().__init__(classes="modal confirm-modal")
        self.title_text, self.message, self.yes, self.no = title, message, yes, no

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog") as box:
            box.border_title = self.title_text
            yield Static(self.message, id="confirm-message", markup=False)
            yield Static(f"y {self.yes.lower()} · n or Esc {self.no.lower()}", classes="hint", markup=False)
            with Horizontal(classes="buttons"):
                yield Button(self.yes, variant="error", id="yes", compact=True)
                yield Button(self.no, id="no", compact=True)

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_confirm(self) -> None:
        self.dismiss(True)

    def action_cancel(self) -> None:
        self.dismiss(False)


class LineEditModal(ModalScreen[str | None]):
    """Edit one line (a title). `check` turns the typed text into the value or raises ValueError, whose message
    is shown in the dialog (which stays open); Enter applies, Esc cancels."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="modal.cancel")]

    def __init__(self, title: str, text: str, check: Callable[[str], str] = str, hint: str = ""):
        super().__init__(classes="modal")
        self.title_text, self.text, self.check, self.hint = title, text, check, hint

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog") as box:
            box.border_title = self.title_text
            yield Input(self.text, id="edit-line", compact=True)
            yield Static("", id="edit-line-error", classes="error-message", markup=False)
            yield Static(self.hint or "Enter apply · Esc cancel", classes="hint", markup=False)

    def on_mount(self) -> None:
        self.query_one("#edit-line-error", Static).display = False
        self.query_one(Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        try:
            value = self.check(event.value)
        except ValueError as exc:
            error = self.query_one("#edit-line-error", Static)
            error.update(str(exc))
            error.display = True
            return
        self.dismiss(value)

    def action_cancel(self) -> None:
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

    def __init__(self, current: dict, defaults: dict | None = None, context_full: str = "ask"):
        super().__init__(classes="modal")
        self.current = current
        self.defaults = defaults or {}  # the model's own values, shown where nothing is set
        self.context_full = context_full  # the remembered choice for a conversation that outgrows the context

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
            with Horizontal(classes="field"):
                yield Label("context full", classes="field-label")
                yield Select([(label, key) for key, label in CONTEXT_FULL_CHOICES.items()], value=self.context_full,
                             allow_blank=False, id="context_full", compact=True)
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
        values["context_full"] = self.query_one("#context_full", Select).value  # not a sampling value: saved
        self.dismiss(values)

    def action_cancel(self) -> None:
        self.dismiss(None)


class ContextFullModal(ModalScreen[tuple[str, bool] | None]):
    """The conversation outgrew the context: drop or summarise the oldest turns, or cancel (the message goes
    back to the prompt). Dismissed with (choice, remember) or None."""

    BINDINGS = [Binding("d", "choose('drop')", "Drop", id="context_full.drop",
                        tooltip="Drop the oldest turns from what is sent"),
                Binding("s", "choose('summarise')", "Summarise", id="context_full.summarise",
                        tooltip="Summarise the oldest turns (the model writes the summary)"),
                Binding("m", "remember", "Remember", id="context_full.remember",
                        tooltip="Remember my choice (for every conversation)"),
                Binding("escape", "cancel", "Cancel", id="context_full.cancel",
                        tooltip="Cancel: the message is not sent, it goes back to the prompt")]

    def __init__(self, turns: int, tokens: int, limit: int, keymap: dict | None = None):
        super().__init__(classes="modal context-full-modal")
        self.turns, self.tokens, self.limit = turns, tokens, limit
        self.keymap = keymap or {}  # for the hint: the keys as remapped

    def _key(self, binding_id: str) -> str:
        default = next(b.key for b in self.BINDINGS if b.id == binding_id)
        return self.keymap.get(binding_id, default).replace("escape", "Esc")

    def compose(self) -> ComposeResult:
        oldest = f"at least the {self.turns} oldest turns" if self.turns != 1 else "at least the oldest turn"
        with Vertical(classes="dialog") as box:
            box.border_title = "The conversation outgrew the context"
            yield Static(f"This conversation is {self.tokens} tokens and the context holds {self.limit}. To send "
                         f"your message, {oldest} must be left out of what the model sees, or replaced by a "
                         "short summary. The saved conversation keeps every turn.", id="context-full-message",
                         markup=False)
            yield Checkbox("Remember my choice (F5 changes it)", id="remember", compact=True)
            keys = {name: self._key(f"context_full.{name}") for name in ("drop", "summarise", "remember", "cancel")}
            yield Static(f"{keys['drop']} drop · {keys['summarise']} summarise · {keys['remember']} remember · "
                         f"{keys['cancel']} cancel (the message is not sent)", classes="hint", markup=False)
            with Horizontal(classes="buttons"):
                yield Button("Drop oldest turns", id="drop", compact=True)
                yield Button("Summarise oldest turns", variant="primary", id="summarise", compact=True)
                yield Button("Cancel", id="cancel", compact=True)

    def on_mount(self) -> None:
        self.query_one("#summarise", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.action_cancel() if event.button.id == "cancel" else self.action_choose(event.button.id)

    def action_choose(self, choice: str) -> None:
        self.dismiss((choice, self.query_one("#remember", Checkbox).value))

    def action_remember(self) -> None:
        self.query_one("#remember", Checkbox).toggle()

    def action_cancel(self) -> None:
        self.dismiss(None)
