"""Helpers for driving the chat app in tests (Pilot): build an app on a backend, send, wait for states.

Polling helpers replace sleeps: they wait for a state, with a timeout that names what was awaited. Shipped in
the package (like textual.pilot) so every test layout can import them.
"""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

from textual import events

from .app import ChatApp
from .store import ConversationStore
from .widgets import AssistantMessage

CODE_ANSWER = ("Here is a function:\n\n```python\ndef add(a, b):\n    return a + b\n```\n\n"
               "It adds **two** numbers.\n")
REASONING = "The user wants a small function. I will write add() and explain it."


def make_app(tmp_path: Path, backend, **kwargs) -> ChatApp:
    """A ChatApp whose files all live under tmp_path (its settings file too: a second app there sees them)."""
    kwargs.setdefault("settings_path", tmp_path / "chat-settings.json")
    return ChatApp(backend, store=ConversationStore(tmp_path / "conversations"), export_dir=tmp_path / "exports",
                   **kwargs)


async def wait_for(pilot, condition, timeout: float = 10.0, what: str = "condition") -> float:
    """Let the app run until condition() is true; returns the seconds it took. (Not pilot.pause: that waits for
    the screen's queues to drain, which never happens while a reply streams.)"""
    t0 = time.perf_counter()
    while not condition():
        if time.perf_counter() - t0 > timeout:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.01)
    return time.perf_counter() - t0


async def wait_ready(pilot, timeout: float = 10.0) -> None:
    await wait_for(pilot, lambda: pilot.app.ready, timeout, "the backend to load")
    await pilot.pause()


async def wait_turn(pilot, timeout: float = 10.0) -> None:
    """Until the current reply has finished (done, stopped or failed) and the worker thread left the backend."""
    app = pilot.app
    await wait_for(pilot, lambda: not app.generating and app._turn_done.is_set(), timeout, "the reply to finish")
    await pilot.pause()


_CHARS = {"enter": "\r", "escape": "\x1b", "space": " "}


async def press_nowait(pilot, *keys: str) -> None:
    """Post key events the way the terminal's input thread does: all at once, like the keys parsed from one read
    (so their order is tested), and without Pilot.press's wait for the app to be idle (which, while a reply
    streams, lasts until the reply ends)."""
    app = pilot.app
    for key in keys:
        event = events.Key(key, _CHARS.get(key, key if len(key) == 1 else None))
        event.set_sender(app)
        app.post_message(event)
    await asyncio.sleep(0)


async def send(pilot, text: str, typed: bool = False) -> None:
    """Put text in the prompt (typed key by key, or loaded at once) and press Enter."""
    if typed:
        await pilot.press(*text)
    else:
        pilot.app.prompt.load_text(text)
    app, turn = pilot.app, pilot.app._turn_id
    await press_nowait(pilot, "enter")
    if text.startswith("/") and not text.startswith("//"):
        await wait_for(pilot, lambda: not app.prompt.text, 5.0, "the command to run")
    else:  # the turn has started (so wait_turn cannot see the previous turn's state)
        await wait_for(pilot, lambda: app._turn_id != turn, 5.0, "the turn to start")


def replies(app) -> list[AssistantMessage]:
    return list(app.view.query(AssistantMessage))


async def settle_stream(pilot) -> None:
    """Until every buffered delta has reached the Markdown widgets (for screenshots of a held stream)."""
    def flushed() -> bool:
        return all(not r._pending_answer and not r._pending_reasoning for r in replies(pilot.app))

    await wait_for(pilot, flushed, 5.0, "the stream to flush")
    await pilot.pause(0.15)
