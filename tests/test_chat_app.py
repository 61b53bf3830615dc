"""Pilot tests of `qwenlocal chat` on the scripted backend: streaming, thinking, stop, regenerate, edit, errors,
status. Each asserts on the typed messages that flowed (message_hook) and on what the screen holds."""
from __future__ import annotations

import pytest

from qwenlocal.app.chat import messages as msg
from qwenlocal.app.chat.fake import ScriptedBackend, ScriptedReply, failing_backend, split_tokens
from qwenlocal.app.chat.modals import ErrorModal, TextEditModal
from qwenlocal.app.chat.widgets import UserMessage
from qwenlocal.app.chat.testing import (CODE_ANSWER, REASONING, make_app, press_nowait, replies, send,
                                       wait_for, wait_ready, wait_turn)

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"  # Textual runs on asyncio

LONG = " ".join(f"word{i}" for i in range(400))


def kinds(seen, cls):
    return [m for m in seen if isinstance(m, cls)]


async def test_streams_a_reply_as_markdown(tmp_path):
    backend = ScriptedBackend([ScriptedReply(answer=CODE_ANSWER, reasoning=REASONING)])
    app, seen = make_app(tmp_path, backend), []
    async with app.run_test(size=(100, 30), message_hook=seen.append) as pilot:
        await wait_ready(pilot)
        await send(pilot, "write add", typed=True)
        await wait_turn(pilot)
        deltas = kinds(seen, msg.ReplyDelta)
        assert "".join(d.text for d in deltas if not d.reasoning) == CODE_ANSWER  # vs the script
        assert len(deltas) == len(split_tokens(CODE_ANSWER)) + len(split_tokens(REASONING))
        [done] = kinds(seen, msg.ReplyDone)
        assert done.finish_reason == "stop" and done.text == CODE_ANSWER
        assert [type(w) for w in app.view.query(".message")] == [UserMessage, type(replies(app)[0])]
        reply = replies(app)[0]
        assert reply.answer.source == CODE_ANSWER  # the Markdown document equals the streamed text
        assert 0 < reply.flushes < len(deltas)  # coalesced: fewer Markdown writes than deltas
        assert app.prompt.text == ""  # sent and cleared
        assert [m.role for m in app.conv.messages] == ["user", "assistant"]
        assert backend.calls[0]["messages"] == [{"role": "user", "content": "write add"}]


async def test_thinking_block_collapses_when_the_answer_starts(tmp_path):
    reasoning_pieces = len(split_tokens(REASONING))
    backend = ScriptedBackend([ScriptedReply(answer=CODE_ANSWER, reasoning=REASONING)], hold_after=3)
    app, seen = make_app(tmp_path, backend), []
    async with app.run_test(size=(100, 30), message_hook=seen.append) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hi")
        await wait_for(pilot, backend.holding.is_set, what="the hold inside the reasoning")
        await wait_for(pilot, lambda: len(kinds(seen, msg.ReplyDelta)) == 3)
        reply = replies(app)[0]
        assert reply.thinking.display and not reply.thinking.collapsed  # open while thinking
        assert reply.thinking.title == "Thinking…" and reply.text == ""
        backend.release.set()
        await wait_turn(pilot)
        assert reply.thinking.collapsed  # folded once the answer began
        assert reply.thinking.title == f"Thought ({len(REASONING.split())} words)"
        first_answer = next(i for i, d in enumerate(kinds(seen, msg.ReplyDelta)) if not d.reasoning)
        assert first_answer == reasoning_pieces


async def test_thinking_off_sends_enable_thinking_false(tmp_path):
    backend = ScriptedBackend([ScriptedReply(answer="plain", reasoning=REASONING)])
    app = make_app(tmp_path, backend)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_ready(pilot)
        await pilot.press("ctrl+t")
        assert "think off" in str(app.status.render())
        await send(pilot, "hi")
        await wait_turn(pilot)
        assert backend.calls[-1]["enable_thinking"] is False
        assert not replies(app)[0].thinking.display and replies(app)[0].reasoning == ""


async def test_escape_stops_within_one_step(tmp_path):
    backend = ScriptedBackend([ScriptedReply(answer=LONG)], tokens_per_s=200)
    app, seen = make_app(tmp_path, backend), []
    async with app.run_test(size=(100, 30), message_hook=seen.append) as pilot:
        await wait_ready(pilot)
        await send(pilot, "go")
        await wait_for(pilot, lambda: len(kinds(seen, msg.ReplyDelta)) >= 10)
        await press_nowait(pilot, "escape")
        await wait_for(pilot, app._cancel.is_set, 1.0, "Esc")  # the engine's cancel event, set on the UI thread at once
        await wait_turn(pilot)
        [done] = kinds(seen, msg.ReplyDone)
        assert done.finish_reason == "cancelled"
        assert backend.after_cancel == [0] or backend.after_cancel == [1]  # at most the token in flight
        reply = replies(app)[0]
        assert 10 <= len(reply.text.split()) < 400 and reply.text == done.text
        assert app.conv.messages[-1].finish_reason == "cancelled"
        assert "stopped" in str(app.status.render())
        assert "stopped" in str(reply.query_one(".meta").render())


async def test_regenerate_replaces_the_last_reply(tmp_path):
    backend = ScriptedBackend([ScriptedReply(answer="first answer"), ScriptedReply(answer="second answer")])
    app = make_app(tmp_path, backend)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "question")
        await wait_turn(pilot)
        await pilot.press("ctrl+r")
        await wait_turn(pilot)
        assert backend.calls[1]["messages"] == backend.calls[0]["messages"]  # same history re-run
        assert backend.calls[1]["reuse_prefix"] == 1  # the snapshot seam: the user turn is unchanged
        assert [m.content for m in app.conv.messages] == ["question", "second answer"]
        assert [r.text for r in replies(app)] == ["second answer"]


async def test_regenerate_while_streaming_drops_the_old_turn(tmp_path):
    backend = ScriptedBackend([ScriptedReply(answer=LONG), ScriptedReply(answer="fresh")], hold_after=5)
    app, seen = make_app(tmp_path, backend), []
    async with app.run_test(size=(100, 30), message_hook=seen.append) as pilot:
        await wait_ready(pilot)
        await send(pilot, "q")
        await wait_for(pilot, backend.holding.is_set)
        backend.hold_after = None
        await pilot.press("ctrl+r")
        await wait_turn(pilot)
        # The stopped turn still reports (cancelled), under its old turn id, and the app drops it.
        dones = kinds(seen, msg.ReplyDone)
        assert [d.finish_reason for d in dones] == ["cancelled", "stop"]
        assert dones[0].turn_id < dones[1].turn_id == app._turn_id
        assert [r.text for r in replies(app)] == ["fresh"]
        assert [m.content for m in app.conv.messages] == ["q", "fresh"]


async def test_edit_last_message_reruns_with_the_edited_history(tmp_path):
    backend = ScriptedBackend([ScriptedReply(answer="a1"), ScriptedReply(answer="a2"), ScriptedReply(answer="a3")])
    app = make_app(tmp_path, backend)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "one")
        await wait_turn(pilot)
        await send(pilot, "two")
        await wait_turn(pilot)
        await pilot.press("ctrl+g")
        await wait_for(pilot, lambda: isinstance(app.screen, TextEditModal))
        assert app.screen.query_one("#edit-text").text == "two"
        app.screen.query_one("#edit-text").load_text("two, edited")
        await pilot.press("ctrl+s")
        await wait_turn(pilot)
        assert backend.calls[-1]["messages"] == [{"role": "user", "content": "one"},
                                                 {"role": "assistant", "content": "a1"},
                                                 {"role": "user", "content": "two, edited"}]
        assert [m.content for m in app.conv.messages] == ["one", "a1", "two, edited", "a3"]
        assert [str(w.render()) for w in app.view.query(UserMessage)] == ["one", "two, edited"]


async def test_engine_error_mid_reply_is_shown_and_not_sent_back(tmp_path):
    backend = ScriptedBackend([ScriptedReply(answer=LONG, error_after=4), ScriptedReply(answer="recovered")])
    app, seen = make_app(tmp_path, backend), []
    async with app.run_test(size=(100, 30), message_hook=seen.append) as pilot:
        await wait_ready(pilot)
        await send(pilot, "q")
        await wait_turn(pilot)
        [failed] = kinds(seen, msg.ReplyFailed)
        assert "failed on purpose" in failed.message
        reply = replies(app)[0]
        assert reply.has_class("message") and "failed on purpose" in str(reply.query_one(".meta").render())
        assert any("failed on purpose" in n.message for n in app._notifications)
        assert "error" in str(app.status.render())
        await pilot.press("ctrl+r")  # retry works and the failed partial reply never reaches the backend
        await wait_turn(pilot)
        assert backend.calls[-1]["messages"] == [{"role": "user", "content": "q"}]
        assert [m.content for m in app.conv.messages] == ["q", "recovered"]


async def test_load_error_shows_a_modal_then_exits_cleanly(tmp_path):
    app, seen = make_app(tmp_path, failing_backend("no config.json in /nowhere")), []
    async with app.run_test(size=(80, 24), message_hook=seen.append) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ErrorModal))
        text = " ".join(str(w.render()) for w in app.screen.query("Static"))
        assert "no config.json in /nowhere" in text and "--model" in text  # what happened, what to do
        assert kinds(seen, msg.LoadFailed) and not kinds(seen, msg.BackendReady)
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.return_code is not None)
    assert app.return_code == 1 and "no config.json" in app.load_error


async def test_loading_screen_shows_real_progress(tmp_path):
    backend = ScriptedBackend(hold_load_at=("weights", 2))
    app, seen = make_app(tmp_path, backend), []
    async with app.run_test(size=(80, 24), message_hook=seen.append) as pilot:
        await wait_for(pilot, backend.holding.is_set)
        stage = app.screen.query_one("#loading-stage")
        await wait_for(pilot, lambda: "Reading weights (2/4)" in str(stage.render()), what="the latest progress")
        assert app.screen.query_one("#loading-bar").percentage == 0.5
        assert "✓ Finding the model" in str(app.screen.query_one("#loading-done").render())
        assert kinds(seen, msg.LoadProgress) and len(kinds(seen, msg.LoadProgress)) <= 10  # coalesced
        backend.release.set()
        await wait_ready(pilot)
        assert app.screen.id != "loading" and app.sub_title == backend.label


async def test_status_bar_updates_live(tmp_path):
    backend = ScriptedBackend([ScriptedReply(answer=LONG)], hold_after=20)
    app = make_app(tmp_path, backend)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "q")
        await wait_for(pilot, backend.holding.is_set)
        await wait_for(pilot, lambda: "tok/s" in str(app.status.render()))
        line = str(app.status.render())
        assert line.startswith("generating") and "TTFT 42 ms" in line and "hit 87%" in line
        assert "ctx 21/4096" in line  # 5 prompt + 16 completion tokens at the second Stats event
        backend.release.set()
        await wait_turn(pilot)
        assert str(app.status.render()).startswith("ready")
        assert "ctx 405/4096" in str(app.status.render())  # the final TurnDone figures
