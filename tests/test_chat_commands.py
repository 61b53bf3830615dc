"""Pilot tests of the chat's commands: slash commands, the palette, prompt keys and history, settings, saved
conversations, transcripts, help/details/theme and key remapping."""
from __future__ import annotations

import json

import pytest

from qwenlocal.app.chat.fake import ScriptedBackend, ScriptedReply
from qwenlocal.app.chat.modals import SamplingModal
from qwenlocal.app.chat.picker import ConversationPicker
from qwenlocal.app.chat.panels import DetailsScreen, HelpScreen
from qwenlocal.app.chat.widgets import AssistantMessage, UserMessage
from qwenlocal.app.chat.testing import make_app, press_nowait, send, wait_for, wait_ready, wait_turn

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"  # Textual runs on asyncio


def notes(app) -> list[str]:
    return [n.message for n in app._notifications]


async def test_slash_commands_change_what_is_sent(tmp_path):
    backend = ScriptedBackend([ScriptedReply(answer="ok", reasoning="hm")])
    app = make_app(tmp_path, backend)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_ready(pilot)
        for line in ("/set temperature=0.5 top_k=7 max=64", "/think off", "/system Be brief."):
            await send(pilot, line)
        await send(pilot, "/bogus")
        assert any("unknown command /bogus" in n for n in notes(app))
        assert backend.calls == []  # commands are never sent as messages
        await send(pilot, "//literal slash")
        await wait_turn(pilot)
        call = backend.calls[-1]
        assert call["sampling"] == {"temperature": 0.5, "top_k": 7, "max_tokens": 64}
        assert call["enable_thinking"] is False
        assert call["messages"] == [{"role": "system", "content": "Be brief."},
                                    {"role": "user", "content": "/literal slash"}]
        await send(pilot, "/set top_p=2")
        assert any("top_p must be in (0, 1]" in n for n in notes(app)) and "top_p" not in app.sampling


async def test_command_palette_runs_chat_commands(tmp_path):
    app = make_app(tmp_path, ScriptedBackend())
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hello")
        await wait_turn(pilot)
        assert len(app.view.query(".message")) == 2
        await pilot.press("ctrl+p")
        await pilot.press(*"new chat")

        def first_hit() -> str:
            lists = app.screen.query("CommandList")
            return str(lists.first().get_option_at_index(0).prompt) if lists and lists.first().option_count else ""

        await wait_for(pilot, lambda: "New chat" in first_hit(), what="the palette hit")
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(app.view.query(".message")) == 0, what="the new chat")
        assert app.conv.messages == []


async def test_prompt_enter_newline_and_history(tmp_path):
    backend = ScriptedBackend()
    app = make_app(tmp_path, backend)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_ready(pilot)
        await pilot.press("x", "ctrl+j", "y")
        assert app.prompt.text == "x\ny" and backend.calls == []  # Ctrl+J is a newline, not a send
        await pilot.press("enter")
        await wait_turn(pilot)
        assert backend.calls[-1]["messages"][-1]["content"] == "x\ny"
        await send(pilot, "second")
        await wait_turn(pilot)
        await pilot.press(*"draft")
        await pilot.press("up")
        assert app.prompt.text == "second"
        await pilot.press("up")
        assert app.prompt.text == "x\ny" and app.prompt.cursor_location == (1, 1)  # recalled, cursor at the end
        await pilot.press("up")  # inside a multi-line prompt, up moves the cursor first
        assert app.prompt.text == "x\ny" and app.prompt.cursor_location[0] == 0
        await pilot.press("down", "down")  # to the last line, then on to the next entry
        assert app.prompt.text == "second"
        await pilot.press("down")
        assert app.prompt.text == "draft"


async def test_enter_right_after_fast_typing_sends_all_of_it(tmp_path):
    # Regression (found by scripts/tui_smoke.sh): a priority Enter binding ran on the app's queue and overtook
    # the characters typed just before it, sending an empty prompt.
    backend = ScriptedBackend()
    app = make_app(tmp_path, backend)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_ready(pilot)
        await press_nowait(pilot, *"fast typist", "enter")
        await wait_for(pilot, lambda: backend.calls, what="the message to be sent")
        assert backend.calls[-1]["messages"][-1]["content"] == "fast typist"


async def test_sampling_modal_validates(tmp_path):
    app = make_app(tmp_path, ScriptedBackend(), sampling={"top_k": 5})
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_ready(pilot)
        await pilot.press("f5")
        await wait_for(pilot, lambda: isinstance(app.screen, SamplingModal))
        assert app.screen.query_one("#top_k").value == "5"
        app.screen.query_one("#temperature").value = "hot"
        await pilot.click("#apply")
        assert "temperature must be a number" in str(app.screen.query_one("#sampling-error").render())
        app.screen.query_one("#temperature").value = "0.3"
        app.screen.query_one("#top_k").value = ""
        app.screen.query_one("#top_k").focus()
        await pilot.press("enter")  # Enter in any field applies
        await wait_for(pilot, lambda: not isinstance(app.screen, SamplingModal))
        assert app.sampling == {"temperature": 0.3}  # emptied top_k = back to the model default


async def test_conversations_persist_and_reopen_skipping_corrupt_files(tmp_path):
    backend = ScriptedBackend([ScriptedReply(answer="first reply", reasoning="thought")])
    app = make_app(tmp_path, backend)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "remember me")
        await wait_turn(pilot)
        saved = list((tmp_path / "conversations").glob("*.json"))
        assert len(saved) == 1 and not list((tmp_path / "conversations").glob(".*"))  # no temp files left
        data = json.loads(saved[0].read_text())
        assert [m["content"] for m in data["messages"]] == ["remember me", "first reply"]
        (tmp_path / "conversations" / "broken.json").write_text("{not json")
        await pilot.press("ctrl+n")
        assert len(app.view.query(".message")) == 0
        await pilot.press("ctrl+o")
        await wait_for(pilot, lambda: isinstance(app.screen, ConversationPicker))
        assert any("Skipped 1 unreadable" in n and "broken.json" in n for n in notes(app))
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(app.view.query(".message")) == 2, what="the reopened conversation")
        assert str(app.view.query_one(UserMessage).render()) == "remember me"
        reply = app.view.query_one(AssistantMessage)
        assert reply.text == "first reply" and reply.thinking.collapsed and reply.thinking.display
        assert app.conv.id == data["id"]


async def test_save_transcript_and_copy_reply(tmp_path, monkeypatch):
    monkeypatch.setattr("qwenlocal.app.chat.clipboard.TOOLS", ())  # never the developer's real clipboard
    app = make_app(tmp_path, ScriptedBackend([ScriptedReply(answer="the **answer**")]))
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "q")
        await wait_turn(pilot)
        await send(pilot, f"/save {tmp_path / 'out' / 'chat'}")
        md, js = tmp_path / "out" / "chat.md", tmp_path / "out" / "chat.json"
        assert "## You\n\nq" in md.read_text() and "the **answer**" in md.read_text()
        assert json.loads(js.read_text())["messages"][1]["content"] == "the **answer**"
        await pilot.press("ctrl+s")  # the default place: export_dir/<conversation id>.md/.json
        assert (tmp_path / "exports" / f"{app.conv.id}.md").is_file()
        await pilot.press("ctrl+b")
        await wait_for(pilot, lambda: (tmp_path / "clipboard.txt").is_file(), what="the copy's fallback file")
        assert app.clipboard == "the **answer**" == (tmp_path / "clipboard.txt").read_text()


async def test_help_details_theme_and_keymap(tmp_path):
    app = make_app(tmp_path, ScriptedBackend(), keymap={"chat.new": "f9"})
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_ready(pilot)
        await pilot.press("f1")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
        help_text = app.screen.query_one("Markdown").source
        assert "`f9` — Start a new conversation *(chat.new)*" in help_text and "/regen" in help_text
        await pilot.press("escape")
        await pilot.press("f2")
        await wait_for(pilot, lambda: isinstance(app.screen, DetailsScreen))
        details = app.screen.query_one("Markdown").source
        assert "layer-major" in details and "prompts over 2048 tokens" in details  # the plan with its reason
        await pilot.press("escape")
        assert app.current_theme.dark
        await pilot.press("f3")
        assert not app.current_theme.dark
        await send(pilot, "hi")
        await wait_turn(pilot)
        await pilot.press("f9")  # remapped by binding id
        assert app.conv.messages == []


async def test_the_send_key_is_remappable(tmp_path):
    """Enter sends by default; the keymap id `prompt.send` moves it (Enter then types a line break)."""
    app = make_app(tmp_path, ScriptedBackend(), keymap={"prompt.send": "ctrl+s"})
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_ready(pilot)
        app.prompt.focus()
        for key in ("h", "i", "enter", "x"):
            await pilot.press(key)
        assert app.prompt.text == "hi\nx" and app.conv.messages == []
        await pilot.press("ctrl+s")
        await wait_turn(pilot)
        assert app.conv.messages[0].content == "hi\nx"
        assert ("ctrl+s", "Send the prompt", "prompt.send") in app.binding_table()
