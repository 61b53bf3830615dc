"""Issue 19, item 6: what the screen shows is true: ctx after a new chat, an opened conversation and an error;
the sampling dialog's defaults; the system prompt in force; notifications clear of the status bar and prompt."""
from __future__ import annotations

import pytest

from qwenlocal.app.chat.fake import ScriptedBackend, ScriptedReply, split_tokens
from qwenlocal.app.chat.modals import SamplingModal
from qwenlocal.app.chat.testing import make_app, send, wait_for, wait_ready, wait_turn

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


def ctx(app) -> str:
    return next(f for f in str(app.status.render()).split(" │ ") if f.startswith("ctx"))


async def test_ctx_is_true_after_new_chat_open_and_error(tmp_path):
    backend = ScriptedBackend([ScriptedReply(answer="one two three"),
                               ScriptedReply(answer="x y", error_after=1, error="failed on purpose")])
    app = make_app(tmp_path, backend)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_ready(pilot)
        await send(pilot, "hello there")
        await wait_turn(pilot)
        assert ctx(app) == f"ctx {2 + 4 + 3}/4096"  # the prompt sent (2 words + 4) and the reply
        first_id = app.conv.id
        await send(pilot, "again")
        await wait_turn(pilot)
        # After the error: what the next turn sends (the failed reply is not sent back; its message is).
        sent_next = sum(len(split_tokens(m["content"])) + 4 for m in app.conv.engine_messages())
        assert ctx(app) == f"ctx {sent_next}/4096"
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert ctx(app) == "ctx 0/4096"
        await app._open(first_id)
        await pilot.pause()
        opened = sum(len(split_tokens(m["content"])) + 4 for m in app.conv.engine_messages())
        assert opened > 0 and ctx(app) == f"ctx {opened}/4096"


async def test_sampling_dialog_shows_the_values_in_force(tmp_path):
    app = make_app(tmp_path, ScriptedBackend(), sampling={"temperature": 0.3})
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_ready(pilot)
        await pilot.press("f5")
        await wait_for(pilot, lambda: isinstance(app.screen, SamplingModal), what="the dialog")
        fields = {k: app.screen.query_one(f"#{k}") for k in ("temperature", "top_p", "max_tokens", "seed")}
        assert fields["temperature"].value == "0.3"  # set in this session
        assert fields["top_p"].placeholder == "model default: 0.95"  # the backend's own value
        assert fields["max_tokens"].placeholder == "model default: 4096"
        assert fields["seed"].placeholder == "model default"  # none: said so


async def test_the_system_prompt_in_force_is_shown(tmp_path):
    app = make_app(tmp_path, ScriptedBackend(), system="You are terse.")
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_ready(pilot)
        assert "System prompt: You are terse." in str(app.banner.render())
        await send(pilot, "/system Answer in French.")
        assert "System prompt: Answer in French." in str(app.banner.render())


async def test_notifications_do_not_cover_the_status_bar_or_the_prompt(tmp_path):
    app = make_app(tmp_path, ScriptedBackend())
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        await wait_ready(pilot)
        app.notify("a notification", timeout=5)
        await wait_for(pilot, lambda: list(app.query("Toast")), what="the toast")
        await pilot.pause(0.1)
        [toast] = list(app.query("Toast"))
        bottom = toast.region.y + toast.region.height
        assert bottom <= app.prompt.region.y and bottom <= app.status.region.y
