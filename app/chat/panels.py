"""Read-only screens: the loading screen, the help screen and the details panel (plan and counters)."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Footer, Header, Markdown, ProgressBar, Static

from .backend import STAGE_LABELS
from .commands import COMMANDS


class LoadingScreen(Screen):
    """Real progress from the backend's load: one line per finished stage, a bar for the current one."""

    def __init__(self, label: str):
        super().__init__(id="loading")
        self.label = label
        self.finished: list[str] = []

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        with Vertical(classes="dialog", id="loading-box") as box:
            box.border_title = "Loading"
            yield Static(self.label, id="loading-model", markup=False)
            done_list = Static("", id="loading-done", markup=False)
            done_list.display = False
            yield done_list
            yield Static("Starting…", id="loading-stage", markup=False)
            yield ProgressBar(total=1, show_eta=False, id="loading-bar")
        yield Footer()

    def progress(self, stages: list[str], done: int, total: int) -> None:
        """stages: every stage seen so far, in order; the last one is running."""
        if not stages:
            return
        *finished, stage = stages
        finished = [f"✓ {STAGE_LABELS.get(s, s)}" for s in finished if s != "ready"]
        if finished != self.finished:
            self.finished = finished
            done_list = self.query_one("#loading-done", Static)
            done_list.update("\n".join(finished))
            done_list.display = True
        count = f" ({done}/{total})" if total > 1 else ""
        self.query_one("#loading-stage", Static).update(STAGE_LABELS.get(stage, stage) + count)
        self.query_one("#loading-bar", ProgressBar).update(total=max(total, 1), progress=done)

    def set_model_label(self, label: str) -> None:
        self.label = label
        self.query_one("#loading-model", Static).update(label)


def _key_list(bindings: list[tuple[str, str, str]]) -> str:
    return "\n".join(f"- `{key}` — {desc}" + (f" *({bid})*" if bid else "") for key, desc, bid in bindings)


def help_markdown(bindings: list[tuple[str, str, str]], picker: list[tuple[str, str, str]] = (),
                  open_key: str = "ctrl+o", context_full: list[tuple[str, str, str]] = ()) -> str:
    # Lists, not tables: they stay readable at 80 columns.
    keys = _key_list(bindings)
    cmds = "\n".join(f"- `{c.usage}` — {c.help}" for c in COMMANDS)
    saved = (f"## Saved conversations (`{open_key}`)\n\nType to filter by title or message text; `enter` opens "
             "the highlighted one.\n\n" + _key_list(picker) + "\n\n") if picker else ""
    full = ("## When a conversation outgrows the context\n\nAsked once per conversation (F5: \"context full\" "
            "remembers a choice).\n\n" + _key_list(context_full) + "\n\n") if context_full else ""
    return (
        "## Keys\n\n" + keys + "\n\n" + saved + full +
        "Remap a key by its binding id (in italics) in `keymap.json` in the data folder, or with "
        "`--keymap FILE`, e.g. `{\"chat.new\": \"ctrl+w\"}`.\n\n"
        "## Slash commands\n\n" + cmds + "\n\n"
        "`Ctrl+P` opens the command palette with the same commands. Start a message with `//` to send a "
        "literal `/`.\n"
    )


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,f1,q", "dismiss", "Close", id="help.close")]

    def __init__(self, bindings: list[tuple[str, str, str]], picker: list[tuple[str, str, str]] = (),
                 open_key: str = "ctrl+o", context_full: list[tuple[str, str, str]] = ()):
        super().__init__(classes="modal")
        self.bindings, self.picker, self.open_key, self.context_full = bindings, picker, open_key, context_full

    def compose(self) -> ComposeResult:
        with VerticalScroll(classes="dialog wide") as box:
            box.border_title = "Help · Esc to close"
            yield Markdown(help_markdown(self.bindings, self.picker, self.open_key, self.context_full))

    async def action_dismiss(self, result=None) -> None:
        self.dismiss(None)


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return ", ".join(f"{k}={_fmt(v)}" for k, v in value.items())
    return str(value)


def details_markdown(label: str, plan: dict, stats: dict, sampling: str) -> str:
    rows = []
    for name, entry in plan.items():
        value, reason = (entry.get("value"), entry.get("reason", "")) if isinstance(entry, dict) else (entry, "")
        rows.append(f"| {name} | `{_fmt(value)}` | {reason} |")
    counters = [f"| {k} | `{_fmt(v)}` |" for k, v in stats.items()]
    return (
        f"**Model:** {label}  \n**Sampling:** {sampling}\n\n"
        "## Plan\n\n| Choice | Value | Why |\n|---|---|---|\n" + ("\n".join(rows) or "| (none) | | |") + "\n\n"
        "## Counters\n\n| Counter | Value |\n|---|---|\n" + ("\n".join(counters) or "| (none yet) | |") + "\n"
    )


class DetailsScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,f2,q", "dismiss", "Close", id="details.close")]

    def __init__(self, text: str):
        super().__init__(classes="modal")
        self.text = text

    def compose(self) -> ComposeResult:
        with VerticalScroll(classes="dialog wide") as box:
            box.border_title = "Details · Esc to close"
            yield Markdown(self.text)

    async def action_dismiss(self, result=None) -> None:
        self.dismiss(None)
