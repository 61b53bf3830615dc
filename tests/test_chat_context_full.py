"""Issue 19, chat: a conversation that outgrows the context asks once (drop / summarise / cancel, remembered in
the settings file, shown and changed in F5), and a summary replaces the oldest turns of what is sent.

The scripted backend counts words + 4 a message. With a 256-token context, the system prompt "be brief" (6) and
turns of 30 + 30 words (68), the fourth message (244 tokens, 64 kept for the reply) is the first that does not fit.
"""
from __future__ import annotations

import json

import pytest
from textual.widgets import Select

from qwenlocal.app.chat import messages as msg
from qwenlocal.app.chat.context import (SUMMARY_PREFIX, ContextTooLong, fit_to_context, split_turns,
                                        summary_budget, turns_to_fold, with_summary)
from qwenlocal.app.chat.fake import ScriptedBackend, ScriptedReply, split_tokens
from qwenlocal.app.chat.modals import ContextFullModal, SamplingModal
from qwenlocal.app.chat.settings import ChatSettings, load_chat_settings, save_chat_settings
from qwenlocal.app.chat.summary import SummaryFailed, summary_request, write_summary
from qwenlocal.app.chat.testing import make_app, press_nowait, replies, send, wait_for, wait_ready, wait_turn

pytestmark = pytest.mark.anyio

SUMMARY = " ".join(f"sum{i}" for i in range(10))


@pytest.fixture
def anyio_backend():
    return "asyncio"


def words(n: int, tag: str = "w") -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


def count(messages) -> int:  # the scripted backend's measure
    return sum(len(split_tokens(m["content"])) + 4 for m in messages)


def history(turns: int) -> list[dict]:
    msgs = [{"role": "system", "content": "be brief"}]
    for t in range(turns):
        msgs += [{"role": "user", "content": words(30, f"q{t}_")}, {"role": "assistant", "content": words(30, "a")}]
    return msgs


def saved(app) -> dict:
    return json.loads((app.store.root / f"{app.conv.id}.json").read_text())


def notes(app) -> list[str]:
    return [str(n.render()) for n in app.view.query(".context-note")]


# --- the rule with a summary -------------------------------------------------------------------------------------

def test_with_summary_rides_in_the_system_prompt_or_is_one():
    msgs = history(1)
    out = with_summary(msgs, " s1 s2 ")
    assert out[0] == {"role": "system", "content": f"be brief\n\n{SUMMARY_PREFIX}s1 s2"} and out[1:] == msgs[1:]
    assert msgs[0]["content"] == "be brief"  # the input is not changed
    assert with_summary(msgs[1:], "s")[0] == {"role": "system", "content": SUMMARY_PREFIX + "s"}


def test_turns_to_fold_leaves_room_for_the_summary_and_the_reply():
    msgs = history(3) + [{"role": "user", "content": words(30, "new")}]  # 244 tokens
    n = turns_to_fold(msgs, count, 256)
    folded, rest, cut = split_turns(msgs, n)
    assert n == 2 and cut == 5 and len(folded) == 4 and rest == [msgs[0], *msgs[5:]]
    # Whatever the summary (up to its budget), the prompt fits with room for the reply: never over the limit.
    summary = " ".join(["x"] * summary_budget(256))
    sent = with_summary(rest, summary)
    assert count(sent) + 64 <= 256
    fitted = fit_to_context(sent, count, 256)
    assert fitted.dropped_turns == 0 and fitted.tokens == count(sent)


def test_a_summary_over_its_budget_makes_the_fit_drop_more_but_never_exceed_the_limit():
    msgs = history(3) + [{"role": "user", "content": words(30, "new")}]
    _, rest, _ = split_turns(msgs, 1)
    fitted = fit_to_context(with_summary(rest, words(120, "long")), count, 256)
    assert fitted.dropped_turns >= 1 and fitted.tokens <= 256 - 1
    assert SUMMARY_PREFIX in fitted.messages[0]["content"]  # kept: it is part of the system prompt


def test_turns_to_fold_with_nothing_to_fold_is_refused():
    with pytest.raises(ContextTooLong):
        turns_to_fold([{"role": "user", "content": words(240)}], count, 256)


def test_the_summary_request_is_bounded():
    turns = history(3)[1:]
    turns[0]["content"] = words(3000, "huge")
    request = summary_request("the earlier summary", turns, 32, count, 512)
    assert count(request) + 32 <= 512
    [ask] = request  # one user message: no system prompt to pay for
    assert ask["role"] == "user" and "at most 21 words" in ask["content"]
    assert "(Earlier summary) the earlier summary" in ask["content"]
    assert "[…]" in ask["content"] and "Assistant: a0" in ask["content"]
    with pytest.raises(SummaryFailed, match="do not fit"):
        summary_request("", turns, 32, count, 100)


def test_write_summary_uses_the_backend_with_thinking_off_and_a_bounded_reply():
    import threading

    backend = ScriptedBackend([ScriptedReply(answer=f"  {SUMMARY}\n", reasoning="hmm")])
    s = write_summary(backend, [{"role": "user", "content": "x"}], 32, threading.Event())
    assert s.text == SUMMARY and s.tokens == 11  # as produced: the trailing newline was a token too
    [call] = backend.calls
    assert call["enable_thinking"] is False and call["sampling"]["max_tokens"] == 32
    failing = ScriptedBackend([ScriptedReply(answer="a b c", error_after=0)])
    with pytest.raises(SummaryFailed, match="the engine failed"):
        write_summary(failing, [{"role": "user", "content": "x"}], 32, threading.Event())
    cancelled = threading.Event()
    cancelled.set()
    with pytest.raises(SummaryFailed, match="cancelled"):
        write_summary(ScriptedBackend(), [{"role": "user", "content": "x"}], 32, cancelled)


def test_the_settings_file_round_trips_and_bad_files_fall_back_to_ask(tmp_path):
    path = tmp_path / "chat-settings.json"
    assert load_chat_settings(path) == (ChatSettings("ask"), None)
    save_chat_settings(path, ChatSettings("summarise"))
    assert load_chat_settings(path) == (ChatSettings("summarise"), None)
    path.write_text('{"context_full": "forget"}')
    settings, warning = load_chat_settings(path)
    assert settings.context_full == "ask" and "context_full must be one of ask, drop, summarise" in warning
    path.write_text("{not json")
    assert "could not be read" in load_chat_settings(path)[1]


# --- the app -------------------------------------------------------------------------------------------------------

def backend_for(*replies_: ScriptedReply) -> ScriptedBackend:
    answer = ScriptedReply(answer=words(30, "a"))
    return ScriptedBackend(list(replies_) or [answer], context_limit=256)


async def fill(pilot, turns: int = 3) -> None:
    for t in range(turns):
        await send(pilot, words(30, f"q{t}_"))
        await wait_turn(pilot)


async def send_until_asked(pilot, text: str) -> ContextFullModal:
    app = pilot.app
    await send(pilot, text)
    await wait_for(pilot, lambda: isinstance(app.screen, ContextFullModal), what="the context-full question")
    await pilot.pause()
    return app.screen


def asked(seen) -> int:
    return sum(isinstance(m, msg.ContextFull) for m in seen)


async def test_the_question_comes_once_and_drop_drops(tmp_path):
    backend = backend_for()
    app, seen = make_app(tmp_path, backend, system="be brief"), []
    async with app.run_test(size=(100, 30), message_hook=seen.append) as pilot:
        await wait_ready(pilot)
        await fill(pilot)
        modal = await send_until_asked(pilot, words(30, "q3_"))
        assert "244 tokens" in str(modal.query_one("#context-full-message").render())
        assert len(backend.calls) == 3  # nothing sent while it asks
        await pilot.press("d")
        await wait_turn(pilot)
        assert [m["content"] for m in backend.calls[-1]["messages"][1:3]] == [words(30, "q1_"), words(30, "a")]
        assert notes(app) == ["1 oldest turn dropped to fit (176 tokens sent; the saved conversation keeps "
                              "everything)."]
        await send(pilot, words(30, "q4_"))  # outgrows again: dropped without asking
        await wait_turn(pilot)
        assert asked(seen) == 1 and len(backend.calls) == 5
        assert "2 oldest turns dropped to fit" in notes(app)[-1]
        assert len(saved(app)["messages"]) == 10  # the saved conversation keeps every turn
        assert not (tmp_path / "chat-settings.json").exists()  # not remembered: not written


async def test_summarise_sends_a_summary_in_place_of_the_oldest_turns_and_reuses_it(tmp_path):
    answer = ScriptedReply(answer=words(30, "a"))
    backend = backend_for(answer, answer, answer, ScriptedReply(answer=SUMMARY), answer, answer,
                          ScriptedReply(answer="sum2 " + SUMMARY), answer)
    app, seen = make_app(tmp_path, backend, system="be brief"), []
    async with app.run_test(size=(100, 30), message_hook=seen.append) as pilot:
        await wait_ready(pilot)
        await fill(pilot)
        await send_until_asked(pilot, words(30, "q3_"))
        await pilot.press("s")
        await wait_turn(pilot)
        # The summary request, as the backend saw it: the two oldest turns, thinking off, a bounded reply.
        request = backend.calls[3]
        assert request["enable_thinking"] is False and request["sampling"]["max_tokens"] == summary_budget(256)
        asked_text = request["messages"][-1]["content"]
        assert words(30, "q0_") in asked_text and words(30, "q1_") in asked_text and "q2_" not in asked_text
        assert count(request["messages"]) + summary_budget(256) <= 256
        # The turn sent the summary in their place, within the limit.
        sent = backend.calls[4]["messages"]
        assert sent[0]["content"] == f"be brief\n\n{SUMMARY_PREFIX}{SUMMARY}"
        assert [m["content"] for m in sent[1:]] == [words(30, "q2_"), words(30, "a"), words(30, "q3_")]
        assert count(sent) + 64 <= 256
        assert notes(app) == [f"2 oldest turns summarised (10 tokens). Summary of earlier turns: {SUMMARY}"]
        on_disk = saved(app)
        assert on_disk["summary"] == {"upto": 4, "text": SUMMARY, "tokens": 10, "turns": 2}
        assert [m["content"] for m in on_disk["messages"][::2]] == [words(30, f"q{t}_") for t in range(4)]
        # The next message reuses the summary (no new request), the one after folds it again, without asking.
        await send(pilot, words(30, "q4_"))
        await wait_turn(pilot)
        assert len(backend.calls) == 6 and backend.calls[5]["messages"][0] == sent[0]
        await send(pilot, words(30, "q5_"))
        await wait_turn(pilot)
        refold = backend.calls[6]
        assert refold["enable_thinking"] is False
        assert f"(Earlier summary) {SUMMARY}" in refold["messages"][-1]["content"]
        assert backend.calls[7]["messages"][0]["content"].endswith(f"{SUMMARY_PREFIX}sum2 {SUMMARY}")
        assert asked(seen) == 1 and saved(app)["summary"]["turns"] == 4
        assert "4 oldest turns summarised (11 tokens)" in notes(app)[-1]
        conv_id = app.conv.id
    # Opened again (a restart), the summary is shown and sent again.
    again = ScriptedBackend([ScriptedReply(answer="ok")], context_limit=256)
    app2 = make_app(tmp_path, again, system="be brief")
    async with app2.run_test(size=(100, 30)) as pilot:
        await wait_ready(pilot)
        await app2._open(conv_id)
        await pilot.pause()
        assert "4 oldest turns summarised (11 tokens)" in notes(app2)[0]
        await send(pilot, "and?")
        await wait_turn(pilot)
        assert again.calls[0]["messages"][0]["content"].endswith(f"{SUMMARY_PREFIX}sum2 {SUMMARY}")


async def test_cancel_sends_nothing_and_gives_the_message_back(tmp_path):
    backend = backend_for()
    app = make_app(tmp_path, backend, system="be brief")
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_ready(pilot)
        await fill(pilot)
        await send_until_asked(pilot, words(30, "q3_"))
        await pilot.press("escape")
        await wait_for(pilot, lambda: not app.generating and app._turn_done.is_set(), what="the cancel")
        await pilot.pause()
        assert app.prompt.text == words(30, "q3_") and len(backend.calls) == 3
        assert len(app.conv.messages) == 6 and len(saved(app)["messages"]) == 6 and len(replies(app)) == 3
        assert not notes(app)
        # Cancel is no choice: the next message that does not fit asks again; answered, the chat goes on.
        await send_until_asked(pilot, "short one")
        await pilot.press("d")
        await wait_turn(pilot)
        assert len(backend.calls) == 4 and app.conv.messages[-1].finish_reason == "stop"
        assert backend.calls[-1]["messages"][-1]["content"] == "short one"


async def test_a_remembered_choice_survives_a_restart_and_f5_shows_and_changes_it(tmp_path):
    app = make_app(tmp_path, backend_for(), system="be brief")
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_ready(pilot)
        await fill(pilot)
        modal = await send_until_asked(pilot, words(30, "q3_"))
        await pilot.press("m")
        assert modal.query_one("#remember").value is True
        await pilot.press("d")
        await wait_turn(pilot)
    assert json.loads((tmp_path / "chat-settings.json").read_text()) == {"context_full": "drop"}
    backend, seen = backend_for(), []
    app = make_app(tmp_path, backend, system="be brief")
    async with app.run_test(size=(100, 30), message_hook=seen.append) as pilot:
        await wait_ready(pilot)
        await fill(pilot, 4)  # a new conversation outgrows the context: dropped, not asked
        assert asked(seen) == 0 and "1 oldest turn dropped to fit" in notes(app)[0]
        await pilot.press("f5")
        await wait_for(pilot, lambda: isinstance(app.screen, SamplingModal), what="the settings dialog")
        await pilot.pause()
        select = app.screen.query_one("#context_full", Select)
        assert select.value == "drop"
        select.value = "summarise"
        await pilot.click("#apply")
        await wait_for(pilot, lambda: not isinstance(app.screen, SamplingModal), what="the dialog to close")
        assert app.chat_settings.context_full == "summarise"
        assert json.loads((tmp_path / "chat-settings.json").read_text()) == {"context_full": "summarise"}
        await pilot.press("f5")
        await wait_for(pilot, lambda: isinstance(app.screen, SamplingModal), what="the settings dialog")
        await pilot.pause()
        assert app.screen.query_one("#context_full", Select).value == "summarise"


async def test_esc_while_summarising_drops_instead_with_a_note_saying_so(tmp_path):
    answer = ScriptedReply(answer=words(30, "a"))
    backend = backend_for(answer, answer, answer, ScriptedReply(answer=SUMMARY), answer)
    (tmp_path / "chat-settings.json").write_text('{"context_full": "summarise"}')
    app = make_app(tmp_path, backend, system="be brief")
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_ready(pilot)
        await fill(pilot)
        backend.hold_after = 3  # the summary stops mid-way, until Esc
        await send(pilot, words(30, "q3_"))
        await wait_for(pilot, lambda: backend.holding.is_set() and app._summarising, what="the summary to run")
        assert "summarising 2 oldest turns" in app.status.state
        await press_nowait(pilot, "escape")
        await wait_for(pilot, lambda: bool(notes(app)), what="the note")
        backend.release.set()
        await wait_turn(pilot)
        assert notes(app) == ["Summarising failed: cancelled: 1 oldest turn dropped to fit (176 tokens sent; the "
                              "saved conversation keeps everything)."]
        assert app.conv.messages[-1].finish_reason == "stop" and not app.conv.summary
        assert SUMMARY_PREFIX not in backend.calls[-1]["messages"][0]["content"]
        assert "summary" not in saved(app) or not saved(app)["summary"]


async def test_a_failing_summary_drops_instead(tmp_path):
    answer = ScriptedReply(answer=words(30, "a"))
    backend = backend_for(answer, answer, answer, ScriptedReply(answer=SUMMARY, error_after=2), answer)
    (tmp_path / "chat-settings.json").write_text('{"context_full": "summarise"}')
    app = make_app(tmp_path, backend, system="be brief")
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_ready(pilot)
        await fill(pilot, 4)
        assert notes(app)[0].startswith("Summarising failed: the engine failed: the scripted engine failed on "
                                        "purpose: 1 oldest turn dropped to fit")
        assert app.conv.messages[-1].finish_reason == "stop"


async def test_the_question_keys_are_remappable_and_f1_lists_them(tmp_path):
    keymap = {"context_full.drop": "x"}
    app = make_app(tmp_path, backend_for(), system="be brief", keymap=keymap)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_ready(pilot)
        await pilot.press("f1")
        await pilot.pause()
        from textual.widgets import Markdown

        text = app.screen.query_one(Markdown).source
        assert "- `x` — Drop the oldest turns from what is sent *(context_full.drop)*" in text
        assert "- `m` — Remember my choice (for every conversation) *(context_full.remember)*" in text
        await pilot.press("escape")
        await fill(pilot)
        modal = await send_until_asked(pilot, words(30, "q3_"))
        assert str(modal.query_one(".hint").render()).startswith("x drop · s summarise · m remember · Esc cancel")
        await pilot.press("x")
        await wait_turn(pilot)
        assert "1 oldest turn dropped to fit" in notes(app)[0]


def test_a_malformed_saved_summary_is_ignored_not_fatal():
    from qwenlocal.app.chat.conversation import Conversation

    conv = Conversation(system="s")
    for t in range(2):
        conv.add("user", f"q{t}")
        conv.add("assistant", f"a{t}")
    good = {"upto": 2, "text": "t", "tokens": 1, "turns": 1}
    assert Conversation.from_json({**conv.to_json(), "summary": good}).summary == good
    for bad in ({"upto": 9, "text": "t", "tokens": 1, "turns": 1}, {"text": "t"}, "nonsense", None):
        loaded = Conversation.from_json({**conv.to_json(), "summary": bad})
        assert loaded.summary == {} and len(loaded.messages) == 4
    conv.summary = good
    assert [m["content"] for m in conv.engine_messages(start=conv.summary["upto"])] == ["s", "q1", "a1"]
