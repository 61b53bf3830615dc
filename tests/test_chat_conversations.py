"""Managing saved conversations: the store's delete and rename, filtering, and the picker (Ctrl+O) driven with
Pilot on the scripted backend: delete (confirmed and cancelled, the open one too), rename (persisted), search,
and what each entry shows (when, turns, model; "model unknown" for files from before the model was saved)."""
from __future__ import annotations

import json
import os
import time

import pytest
from textual.widgets import Input, OptionList

from qwenlocal.app.chat.conversation import Conversation, clean_title
from qwenlocal.app.chat.fake import ScriptedBackend, ScriptedReply
from qwenlocal.app.chat.keymap import validate_keymap
from qwenlocal.app.chat.modals import ConfirmModal, LineEditModal
from qwenlocal.app.chat.panels import HelpScreen
from qwenlocal.app.chat.picker import ConversationPicker, describe, when_label
from qwenlocal.app.chat.store import ConversationStore
from qwenlocal.app.chat.testing import make_app, send, wait_for, wait_ready, wait_turn

LABEL = "scripted (fake backend)"  # ScriptedBackend's label: the model name new conversations record


def conv_with(title: str, *texts: str, updated: float, model: str = "Qwen3.6-35B-A3B") -> Conversation:
    conv = Conversation(title=title, model=model)
    for i, text in enumerate(texts):
        conv.add("user" if i % 2 == 0 else "assistant", text)
    conv.updated = updated
    return conv


def seed(tmp_path, *convs: Conversation) -> ConversationStore:
    store = ConversationStore(tmp_path / "conversations")
    for conv in convs:
        store.save(conv)
    return store


# ----- the store and the data (no Textual) -----

def test_delete_removes_the_file_and_the_listing(tmp_path):
    a, b = conv_with("a", "hi", updated=1.0), conv_with("b", "yo", updated=2.0)
    store = seed(tmp_path, a, b)
    assert store.delete(a.id) is True
    assert not store.path_for(a.id).exists() and store.path_for(b.id).exists()
    assert [c.id for c in store.list()[0]] == [b.id]
    assert store.delete(a.id) is False  # already gone: nothing to do, no error


def test_rename_is_atomic_checked_first_and_keeps_updated(tmp_path, monkeypatch):
    conv = conv_with("old title", "question", "answer", updated=123.0)
    store = seed(tmp_path, conv)
    renamed = store.rename(conv.id, "  Trip   to Lisbon ")
    assert renamed.title == "Trip to Lisbon"
    again = ConversationStore(store.root).load(conv.id)  # a fresh store: what a restart reads
    assert again.title == "Trip to Lisbon" and again.updated == 123.0 and again.messages == conv.messages
    before = store.path_for(conv.id).read_bytes()
    for bad in ("", "   ", "x" * 121):
        with pytest.raises(ValueError):
            store.rename(conv.id, bad)
    with pytest.raises(FileNotFoundError):
        store.rename("20260101-000000-nope00", "fine")

    def boom(*args):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        store.rename(conv.id, "never written")
    assert store.path_for(conv.id).read_bytes() == before
    assert [p.name for p in store.root.iterdir()] == [f"{conv.id}.json"]  # no temp file left


def test_ids_that_would_name_other_files_are_refused(tmp_path):
    store = ConversationStore(tmp_path / "conversations")
    (tmp_path / "precious.json").write_text("{}")
    for bad in ("../precious", "a/b", ".hidden", "", "a\\b"):
        with pytest.raises(ValueError, match="not a conversation id"):
            store.delete(bad)
    assert (tmp_path / "precious.json").exists()


def test_matches_title_and_message_text_case_insensitively():
    conv = conv_with("Python decorators", "How do I deploy on Kubernetes?", "Use a Deployment.", updated=1.0)
    assert conv.matches("") and conv.matches("  ")
    assert conv.matches("PYTHON") and conv.matches("kubernetes") and conv.matches("deployment")
    assert conv.matches("python kubernetes")  # every word, anywhere
    assert not conv.matches("python rust")
    conv.messages[1].reasoning = "secret thought"
    assert not conv.matches("secret")  # the thinking is not searched: it is not shown in the list


def test_turns_titles_and_the_when_label():
    conv = conv_with("t", "q1", "a1", "q2", updated=1.0)
    assert conv.turns == 2
    assert clean_title(" a\n b ") == "a b"
    now = time.mktime((2026, 12, 1, 14, 0, 0, 0, 0, -1))
    assert when_label(now - 3600, now) == "today 13:00"
    assert when_label(now - 86400, now) == "yesterday 14:00"
    assert when_label(now - 3 * 86400, now) == "2026-11-28 14:00"


def test_an_old_file_without_a_model_reads_as_model_unknown(tmp_path):
    conv = conv_with("old one", "q", "a", updated=time.time())
    store = seed(tmp_path, conv)
    raw = json.loads(store.path_for(conv.id).read_text())
    del raw["model"]
    store.path_for(conv.id).write_text(json.dumps(raw))
    loaded = store.load(conv.id)
    assert loaded.model == ""
    assert "1 turn · model unknown" in str(describe(loaded))
    assert "model Qwen3.6-35B-A3B" in str(describe(conv))


def test_the_picker_keys_are_remappable_ids():
    assert validate_keymap({"picker.delete": "f8", "picker.rename": "ctrl+e"}, "keymap.json")


# ----- the picker, driven through the app -----


@pytest.fixture
def anyio_backend():
    return "asyncio"  # Textual runs on asyncio


def shown(app) -> list[str]:
    """The picker's entries as plain text, in order."""
    options = app.screen.query_one(OptionList)
    if not options.display:
        return []
    return [str(options.get_option_at_index(i).prompt) for i in range(options.option_count)]


def titles(app) -> list[str]:
    return [entry.split("\n")[0].removesuffix("  · open now") for entry in shown(app)]


async def open_picker(pilot) -> ConversationPicker:
    await pilot.press("ctrl+o")
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, ConversationPicker), what="the picker")
    await pilot.pause()
    return pilot.app.screen


async def highlight(pilot, title: str) -> None:
    """Move the highlight with the picker's own keys (from the filter field) onto the entry with this title."""
    app = pilot.app
    await pilot.press(*["up"] * len(shown(app)))
    for _ in range(len(shown(app))):
        if app.screen.highlighted().title == title:
            return
        await pilot.press("down")
    raise AssertionError(f"no entry titled {title!r} in {titles(app)}")


@pytest.mark.anyio
async def test_delete_asks_first_and_cancel_keeps_the_file(tmp_path):
    older = conv_with("Paris trip", "Where to eat?", "Le Marais.", updated=time.time() - 7200)
    store = seed(tmp_path, older)
    app = make_app(tmp_path, ScriptedBackend([ScriptedReply(answer="sure")]))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hello there")
        await wait_turn(pilot)
        current = app.conv.id
        await open_picker(pilot)
        assert titles(app) == ["hello there", "Paris trip"]  # newest first
        await highlight(pilot, "Paris trip")
        await pilot.press("ctrl+d")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmModal), what="the confirmation")
        assert "Paris trip" in str(app.screen.query_one("#confirm-message").render())
        await pilot.press("escape")  # cancel
        await wait_for(pilot, lambda: isinstance(app.screen, ConversationPicker))
        assert store.path_for(older.id).exists() and titles(app) == ["hello there", "Paris trip"]
        await pilot.press("ctrl+d")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmModal))
        await pilot.press("enter")  # Cancel has the focus: Enter alone keeps it
        await wait_for(pilot, lambda: isinstance(app.screen, ConversationPicker))
        assert store.path_for(older.id).exists()
        await pilot.press("ctrl+d")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmModal))
        await pilot.press("y")
        await wait_for(pilot, lambda: titles(app) == ["hello there"], what="the list without the deleted one")
        assert not store.path_for(older.id).exists()
        assert app.conv.id == current and len(app.view.query(".message")) == 2  # the open one is untouched
        assert [c.id for c in ConversationStore(store.root).list()[0]] == [current]


@pytest.mark.anyio
async def test_deleting_the_open_conversation_starts_a_new_one_even_mid_reply(tmp_path):
    backend = ScriptedBackend([ScriptedReply(answer="one two three four five six seven")], hold_after=3)
    app = make_app(tmp_path, backend)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "first question")
        old = app.conv.id
        await wait_for(pilot, backend.holding.is_set, what="the reply to be streaming")
        assert app.store.path_for(old).exists()  # saved with the user's message
        await open_picker(pilot)
        assert shown(app)[0].startswith("first question  · open now")
        await pilot.press("ctrl+d")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmModal))
        assert "open now" in str(app.screen.query_one("#confirm-message").render())
        await pilot.press("y")
        await wait_for(pilot, lambda: shown(app) == [], what="an empty list")
        assert "No saved conversations yet." in str(app.screen.query_one("#picker-empty").render())
        await pilot.press("escape")
        await wait_turn(pilot)  # the stopped reply is dropped, not saved back
        assert app.conv.id != old and app.conv.messages == [] and len(app.view.query(".message")) == 0
        assert not app.store.path_for(old).exists()
        backend.hold_after = None
        await send(pilot, "a fresh start")
        await wait_turn(pilot)
        assert [c.title for c in app.store.list()[0]] == ["a fresh start"]
        assert not app.store.path_for(old).exists()


@pytest.mark.anyio
async def test_rename_persists_and_survives_a_restart(tmp_path):
    other = conv_with("untitled idea", "Name my cat", "Miso.", updated=time.time() - 60)
    store = seed(tmp_path, other)
    app = make_app(tmp_path, ScriptedBackend([ScriptedReply(answer="ok")]))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "current chat")
        await wait_turn(pilot)
        await open_picker(pilot)
        await highlight(pilot, "untitled idea")
        await pilot.press("f2")
        await wait_for(pilot, lambda: isinstance(app.screen, LineEditModal), what="the rename dialog")
        assert app.screen.query_one(Input).value == "untitled idea"
        await pilot.press("ctrl+u", "enter")  # an empty title is refused, and the dialog stays
        assert isinstance(app.screen, LineEditModal)
        assert "cannot be empty" in str(app.screen.query_one("#edit-line-error").render())
        await pilot.press(*"Cat names", "enter")
        await wait_for(pilot, lambda: "Cat names" in titles(app), what="the new title in the list")
        assert app.screen.highlighted().id == other.id  # the highlight stays on it
        assert ConversationStore(store.root).load(other.id).title == "Cat names"
        # The open conversation: renamed in memory too, so its next save keeps the new title.
        await highlight(pilot, "current chat")
        await pilot.press("f2")
        await wait_for(pilot, lambda: isinstance(app.screen, LineEditModal))
        await pilot.press("ctrl+u", *"Work notes", "enter")
        await wait_for(pilot, lambda: "Work notes" in titles(app))
        await pilot.press("escape")
        await send(pilot, "one more")
        await wait_turn(pilot)
        assert app.conv.title == "Work notes"
        assert ConversationStore(store.root).load(app.conv.id).title == "Work notes"
    restarted = make_app(tmp_path, ScriptedBackend())
    async with restarted.run_test(size=(80, 24)) as pilot:
        await wait_ready(pilot)
        await open_picker(pilot)
        assert titles(restarted) == ["Work notes", "Cat names"]


@pytest.mark.anyio
async def test_typing_filters_by_title_and_message_text(tmp_path):
    now = time.time()
    seed(tmp_path, conv_with("Python decorators", "explain @wraps", "It copies metadata.", updated=now - 10),
         conv_with("Misc", "How do I deploy on KUBERNETES?", "Use a Deployment.", updated=now - 20),
         conv_with("Paris trip", "Where to eat?", "Le Marais.", updated=now - 30))
    app = make_app(tmp_path, ScriptedBackend())
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_ready(pilot)
        await open_picker(pilot)
        assert titles(app) == ["Python decorators", "Misc", "Paris trip"]
        await pilot.press(*"PYTHON")
        assert titles(app) == ["Python decorators"]
        await pilot.press("ctrl+u", *"kubernetes")  # message text, case-insensitive
        assert titles(app) == ["Misc"]
        await pilot.press("ctrl+u", *"zzz")
        assert titles(app) == []
        assert "No conversation matches “zzz”" in str(app.screen.query_one("#picker-empty").render())
        await pilot.press("ctrl+u", *"marais")
        assert titles(app) == ["Paris trip"]
        await pilot.press("enter")  # opens the one the filter left
        await wait_for(pilot, lambda: len(app.view.query(".message")) == 2, what="the opened conversation")
        assert app.conv.title == "Paris trip"


@pytest.mark.anyio
async def test_entries_show_when_turns_and_model(tmp_path):
    old = conv_with("From last year", "q1", "a1", "q2", "a2", updated=time.mktime((2025, 6, 2, 9, 30, 0, 0, 0, -1)))
    store = seed(tmp_path, old)
    raw = json.loads(store.path_for(old.id).read_text())
    del raw["model"]  # a file written before the model was recorded
    store.path_for(old.id).write_text(json.dumps(raw))
    app = make_app(tmp_path, ScriptedBackend([ScriptedReply(answer="hi")]))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "new one")
        await wait_turn(pilot)
        assert json.loads(store.path_for(app.conv.id).read_text())["model"] == LABEL
        await open_picker(pilot)
        first, second = shown(app)
        clock = time.strftime("%H:%M", time.localtime(app.conv.updated))
        assert first == f"new one  · open now\n  today {clock} · 1 turn · model {LABEL}"
        assert second == "From last year\n  2025-06-02 09:30 · 2 turns · model unknown"


@pytest.mark.anyio
async def test_remapped_picker_keys_work_and_f1_lists_them(tmp_path):
    seed(tmp_path, conv_with("Keep me?", "q", "a", updated=time.time()))
    app = make_app(tmp_path, ScriptedBackend(), keymap={"picker.delete": "f8"})
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_ready(pilot)
        await pilot.press("f1")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
        help_text = app.screen.query_one("Markdown").source
        assert "## Saved conversations (`ctrl+o`)" in help_text
        assert "`f8` — Delete the highlighted conversation (asks first) *(picker.delete)*" in help_text
        assert "`f2` — Rename the highlighted conversation *(picker.rename)*" in help_text
        await pilot.press("escape")
        picker = await open_picker(pilot)
        assert "f8 delete · f2 rename" in str(picker.query(".hint").last().render())
        await pilot.press("f8")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmModal), what="f8 to ask about deleting")
        await pilot.press("n")
        await wait_for(pilot, lambda: isinstance(app.screen, ConversationPicker))
        assert titles(app) == ["Keep me?"]
