"""Snapshots of the chat's main states at fixed sizes (100x30 and the 80x24 minimum), on the scripted backend.

Textual is pinned for these (8.2.8): a Textual upgrade redraws them. Update with `--snapshot-update` only after
looking at the report. Stats come from the fake backend's fixed figures, so nothing depends on machine speed.
"""
from __future__ import annotations

from qwenlocal.app.chat.fake import ScriptedBackend, ScriptedReply, failing_backend
from qwenlocal.app.chat.testing import (CODE_ANSWER, REASONING, make_app, press_nowait, send, settle_stream,
                                       wait_for, wait_ready, wait_turn)

SMALL, LARGE = (80, 24), (100, 30)


def answered(tmp_path, **kwargs):
    return make_app(tmp_path, ScriptedBackend([ScriptedReply(answer=CODE_ANSWER, reasoning=REASONING)]), **kwargs)


async def steady(pilot) -> None:
    pilot.app.prompt.cursor_blink = False
    await wait_ready(pilot)


async def ask(pilot) -> None:
    await steady(pilot)
    await send(pilot, "Write a function that adds two numbers.")
    await wait_turn(pilot)
    await settle_stream(pilot)


def test_conversation_100x30(snap_compare, tmp_path):
    assert snap_compare(answered(tmp_path), terminal_size=LARGE, run_before=ask)


def test_conversation_80x24(snap_compare, tmp_path):
    assert snap_compare(answered(tmp_path), terminal_size=SMALL, run_before=ask)


def test_conversation_light_theme_80x24(snap_compare, tmp_path):
    assert snap_compare(answered(tmp_path, theme="textual-light"), terminal_size=SMALL, run_before=ask)


def test_thinking_while_streaming_80x24(snap_compare, tmp_path):
    backend = ScriptedBackend([ScriptedReply(answer=CODE_ANSWER, reasoning=(REASONING + " ") * 2)], hold_after=16)

    async def run_before(pilot):
        await steady(pilot)
        await send(pilot, "Write a function that adds two numbers.")
        await wait_for(pilot, backend.holding.is_set)
        await settle_stream(pilot)

    assert snap_compare(make_app(tmp_path, backend), terminal_size=SMALL, run_before=run_before)


def test_stopped_reply_80x24(snap_compare, tmp_path):
    backend = ScriptedBackend([ScriptedReply(answer=CODE_ANSWER, reasoning=REASONING)], hold_after=20)

    async def run_before(pilot):
        await steady(pilot)
        await send(pilot, "Write a function that adds two numbers.")
        await wait_for(pilot, backend.holding.is_set)
        await press_nowait(pilot, "escape")
        await wait_turn(pilot)
        await settle_stream(pilot)

    assert snap_compare(make_app(tmp_path, backend), terminal_size=SMALL, run_before=run_before)


def test_generation_error_80x24(snap_compare, tmp_path):
    backend = ScriptedBackend([ScriptedReply(answer=CODE_ANSWER, error_after=6,
                                             error="the GPU ran out of memory; lower --max-tokens")])
    assert snap_compare(make_app(tmp_path, backend), terminal_size=SMALL, run_before=ask)


def test_loading_80x24(snap_compare, tmp_path):
    backend = ScriptedBackend(hold_load_at=("weights", 3))

    async def run_before(pilot):
        await wait_for(pilot, backend.holding.is_set)
        await wait_for(pilot, lambda: "(3/4)" in str(pilot.app.screen.query_one("#loading-stage").render()))

    assert snap_compare(make_app(tmp_path, backend), terminal_size=SMALL, run_before=run_before)


def test_load_error_modal_80x24(snap_compare, tmp_path):
    async def run_before(pilot):
        await wait_for(pilot, lambda: pilot.app.screen.has_class("error-modal"))

    app = make_app(tmp_path, failing_backend("/models/qwen has no config.json"))
    assert snap_compare(app, terminal_size=SMALL, run_before=run_before)


def test_help_80x24(snap_compare, tmp_path):
    assert snap_compare(answered(tmp_path), terminal_size=SMALL, run_before=steady, press=["f1"])


def test_details_100x30(snap_compare, tmp_path):
    assert snap_compare(answered(tmp_path), terminal_size=LARGE, run_before=ask, press=["f2"])
