"""Issue 19, items 2-4: a conversation that outgrows the context, Ctrl+Q mid-reply, replies that end while
thinking. Pilot tests on the scripted backend (its token count: words + 4 per message), and the trimming rule."""
from __future__ import annotations

import json

import pytest

from qwenlocal.app.chat import messages as msg
from qwenlocal.app.chat.context import ContextTooLong, fit_to_context
from qwenlocal.app.chat.modals import ContextFullModal
from qwenlocal.app.chat.fake import ScriptedBackend, ScriptedReply, split_tokens
from qwenlocal.app.chat.testing import make_app, press_nowait, replies, send, wait_for, wait_ready, wait_turn

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


def words(n: int, tag: str = "w") -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


def count(messages) -> int:  # the scripted backend's measure
    return sum(len(split_tokens(m["content"])) + 4 for m in messages)


def saved(app) -> dict:
    return json.loads((app.store.root / f"{app.conv.id}.json").read_text())


# --- the rule ------------------------------------------------------------------------------------------------------

def test_fit_keeps_everything_that_fits():
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    fitted = fit_to_context(msgs, count, 100, reply_room=10)
    assert fitted.messages == msgs and fitted.dropped_turns == 0 and fitted.tokens == count(msgs)


def test_fit_drops_the_oldest_turns_never_the_system_prompt_or_the_new_message():
    msgs = [{"role": "system", "content": "be brief"}]
    for t in range(4):
        msgs += [{"role": "user", "content": words(20, f"u{t}_")}, {"role": "assistant", "content": words(20)}]
    msgs += [{"role": "user", "content": "last question"}]
    fitted = fit_to_context(msgs, count, 130, reply_room=20)  # 24 a message: system + 2 turns + new = 108
    assert fitted.dropped_turns == 2
    assert fitted.messages == [msgs[0], *msgs[5:]]
    assert fitted.tokens == count(fitted.messages) and fitted.tokens + 20 <= 130


def test_fit_refuses_a_message_longer_than_the_context_naming_sizes():
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "a b"},
            {"role": "assistant", "content": "c"}, {"role": "user", "content": words(300)}]
    with pytest.raises(ContextTooLong) as err:
        fit_to_context(msgs, count, 256)
    assert "304 tokens" in str(err.value) and "310 with the system prompt" in str(err.value)
    assert "256" in str(err.value)


def test_fit_sends_a_long_message_alone_when_it_fits_without_the_reply_room():
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
            {"role": "user", "content": words(200)}]
    fitted = fit_to_context(msgs, count, 256)  # 204 tokens: fits, though under the 64 of reply room
    assert fitted.messages == msgs[-1:] and fitted.dropped_turns == 1


# --- the app -------------------------------------------------------------------------------------------------------

async def test_a_conversation_that_outgrows_the_context_keeps_working(tmp_path):
    backend = ScriptedBackend([ScriptedReply(answer=words(30, "a"))], context_limit=256)
    app, seen = make_app(tmp_path, backend, system="be brief"), []
    async with app.run_test(size=(100, 30), message_hook=seen.append) as pilot:
        await wait_ready(pilot)
        asked = 0
        for turn in range(6):
            await send(pilot, words(30, f"q{turn}_"))
            await wait_for(pilot, lambda: isinstance(app.screen, ContextFullModal) or not app.generating,
                           what="the reply or the question")
            if isinstance(app.screen, ContextFullModal):  # asked the first time only: drop, for this conversation
                asked += 1
                await pilot.press("d")
            await wait_turn(pilot)
            assert app.conv.messages[-1].finish_reason == "stop"  # every turn answered
        assert asked == 1
        sent = backend.calls[-1]["messages"]
        assert sent[0] == {"role": "system", "content": "be brief"}  # never dropped
        assert sent[-1]["content"] == words(30, "q5_")  # the new message, whole
        assert count(sent) + 64 <= 256 and len(sent) < 1 + 11
        trims = [m for m in seen if isinstance(m, msg.ContextTrimmed)]
        assert trims and trims[-1].dropped_turns == (12 - len(sent) + 1) // 2
        notes = list(app.view.query(".context-note"))
        assert notes and f"{trims[-1].dropped_turns} oldest turns dropped to fit" in str(notes[-1].render())
        assert len(notes) == len({t.dropped_turns for t in trims})  # one note per new count, not one per turn
        # The saved conversation keeps every turn; the status bar counts what was sent.
        assert [m["content"] for m in saved(app)["messages"][::2]] == [words(30, f"q{t}_") for t in range(6)]
        assert f"ctx {count(sent) + 30}/256" in str(app.status.render())


async def test_a_message_longer_than_the_context_is_refused_and_does_not_lock_the_chat(tmp_path):
    backend = ScriptedBackend([ScriptedReply(answer="short answer")], context_limit=256)
    app, seen = make_app(tmp_path, backend), []
    async with app.run_test(size=(100, 30), message_hook=seen.append) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hello")
        await wait_turn(pilot)
        await send(pilot, words(400))
        await wait_turn(pilot)
        [failed] = [m for m in seen if isinstance(m, msg.ReplyFailed)]
        assert "404 tokens" in failed.message and "256" in failed.message
        assert len(backend.calls) == 1  # never reached the backend
        assert app.conv.messages[-1].finish_reason == "refused"
        assert "404 tokens" in str(replies(app)[-1].query_one(".meta").render())
        before = count([{"role": "user", "content": "hello"}, {"role": "assistant", "content": "short answer"}])
        assert f"ctx {before}/256" in str(app.status.render())  # what the next turn sends, not 0
        await send(pilot, "and now?")
        await wait_turn(pilot)
        assert app.conv.messages[-1].finish_reason == "stop"
        assert [m["content"] for m in backend.calls[-1]["messages"]] == ["hello", "short answer", "and now?"]
        assert [m["finish_reason"] for m in saved(app)["messages"]] == ["", "stop", "", "refused", "", "stop"]


async def test_ctrl_q_during_a_reply_saves_it_as_cancelled(tmp_path):
    backend = ScriptedBackend([ScriptedReply(answer=words(400), reasoning="let me think")], hold_after=6)
    app = make_app(tmp_path, backend)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "go")
        await wait_for(pilot, backend.holding.is_set, what="the reply to be mid-stream")
        await press_nowait(pilot, "ctrl+q")
        await wait_for(pilot, lambda: not app.is_running, 5.0, "the app to quit")
    [conv] = [json.loads(p.read_text()) for p in (tmp_path / "conversations").glob("*.json")]
    assert [m["role"] for m in conv["messages"]] == ["user", "assistant"]
    reply = conv["messages"][-1]
    assert reply["finish_reason"] == "cancelled"
    assert reply["reasoning"] == "let me think" and reply["content"] == words(3)


async def test_quit_while_the_backend_is_stuck_saves_what_was_shown(tmp_path, monkeypatch):
    monkeypatch.setattr("qwenlocal.app.chat.actions.QUIT_WAIT_S", 0.2)
    backend = ScriptedBackend([ScriptedReply(answer=words(50))], hold_after=4)
    app = make_app(tmp_path, backend)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "go")
        await wait_for(pilot, backend.holding.is_set, what="the hold")
        await wait_for(pilot, lambda: len(replies(app)[0].text.split()) == 4, what="the deltas")
        app._cancel.set = lambda: None  # a backend that does not see the cancel in time
        await press_nowait(pilot, "ctrl+q")
        await wait_for(pilot, lambda: not app.is_running, 5.0, "the app to quit")
    [conv] = [json.loads(p.read_text()) for p in (tmp_path / "conversations").glob("*.json")]
    assert conv["messages"][-1]["finish_reason"] == "cancelled" and conv["messages"][-1]["content"] == words(4)
    backend.release.set()


@pytest.mark.parametrize("finish, cancel, note", [
    ("length", False, "stopped while thinking: reached the token limit"),
    ("stop", False, "ended its reply while thinking"),
    ("stop", True, "cancelled while thinking"),
])
async def test_a_reply_that_ends_inside_its_thinking_says_why(tmp_path, finish, cancel, note):
    backend = ScriptedBackend([ScriptedReply(answer="", reasoning=words(12), finish_reason=finish)],
                              hold_after=5 if cancel else None)
    app = make_app(tmp_path, backend)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hard question")
        if cancel:
            await wait_for(pilot, backend.holding.is_set, what="the hold inside the thinking")
            await press_nowait(pilot, "escape")
        await wait_turn(pilot)
        meta = replies(app)[0].query_one(".meta")
        assert meta.display and note in str(meta.render())
        assert app.conv.messages[-1].content == "" and app.conv.messages[-1].reasoning
