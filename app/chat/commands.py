"""The chat's commands, one table for both slash commands and the command palette (Ctrl+P)."""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider


@dataclass(frozen=True)
class ChatCommand:
    name: str  # typed as /name
    action: str  # the App action it runs
    title: str  # shown in the palette
    help: str
    args: str = ""  # usage of the optional argument, for /help

    @property
    def usage(self) -> str:
        return f"/{self.name}" + (f" {self.args}" if self.args else "")


COMMANDS: tuple[ChatCommand, ...] = (
    ChatCommand("new", "new_chat", "New chat", "Start a new conversation"),
    ChatCommand("regen", "regenerate", "Regenerate last reply", "Run the last turn again"),
    ChatCommand("edit", "edit_last", "Edit last message", "Change your last message and re-run it"),
    ChatCommand("system", "system_prompt", "System prompt", "Set the system prompt", "[TEXT]"),
    ChatCommand("set", "sampling", "Sampling settings", "Temperature, top-p, top-k, max tokens, seed",
                "[key=value ...]"),
    ChatCommand("think", "toggle_thinking", "Thinking on/off", "Let the model think before answering", "[on|off]"),
    ChatCommand("copy", "copy_reply", "Copy last reply", "Copy the last reply to the clipboard"),
    ChatCommand("code", "copy_code", "Copy code block", "Copy the highlighted code block (none: the newest)"),
    ChatCommand("save", "save_transcript", "Save transcript", "Write the conversation as Markdown and JSON",
                "[PATH]"),
    ChatCommand("open", "open_conversation", "Open a past conversation",
                "Saved conversations: open, search, rename, delete"),
    ChatCommand("details", "details", "Plan and counters", "The engine's plan (with reasons) and counters"),
    ChatCommand("theme", "toggle_theme", "Light/dark theme", "Switch between the light and dark theme"),
    ChatCommand("help", "help", "Help", "Keys and commands"),
    ChatCommand("stop", "stop", "Stop generating", "Stop the reply being generated"),
    ChatCommand("quit", "quit", "Quit", "Leave qwenlocal chat"),
)
BY_NAME = {c.name: c for c in COMMANDS}
_ALIASES = {"regenerate": "regen", "clear": "new", "sampling": "set", "thinking": "think", "q": "quit",
            "exit": "quit", "load": "open", "export": "save", "?": "help"}


class SlashError(ValueError):
    pass


def parse_slash(text: str) -> tuple[ChatCommand, str] | None:
    """"/set temperature=0.5" -> (the set command, "temperature=0.5"); None if the text is not a command.
    A leading "//" sends a literal "/..." message."""
    stripped = text.strip()
    if not stripped.startswith("/") or stripped.startswith("//"):
        return None
    name, _, arg = stripped[1:].partition(" ")
    name = _ALIASES.get(name.lower(), name.lower())
    if name not in BY_NAME:
        raise SlashError(f"unknown command /{name}: type /help for the list")
    return BY_NAME[name], arg.strip()


class ChatCommandsProvider(Provider):
    """Palette entries for every chat command (posting's commands.py pattern)."""

    async def discover(self) -> Hits:
        for cmd in COMMANDS:
            yield DiscoveryHit(cmd.title, partial(self.app.run_action, cmd.action), help=cmd.help)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for cmd in COMMANDS:
            score = max(matcher.match(cmd.title), matcher.match("/" + cmd.name))
            if score > 0:
                yield Hit(score, matcher.highlight(cmd.title), partial(self.app.run_action, cmd.action),
                          help=cmd.help)
