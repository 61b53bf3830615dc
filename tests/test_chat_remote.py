"""`qwenlocal chat --endpoint`: the chat app driven through RemoteBackend by a real `qwenlocal serve` on
loopback (not a mock): a streamed reply that matches the server's own answer, and a stop with Esc."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from qwenlocal.app.chat import messages as msg
from qwenlocal.app.chat.testing import make_app, press_nowait, replies, send, wait_for, wait_ready, wait_turn
from qwenlocal.app.serve.remote_client import RemoteBackend

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_support import openai_client, serve  # noqa: E402

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="module")
def served(tiny_ckpt):
    s = serve(tiny_ckpt)
    yield s
    s.stop()


async def test_chat_app_over_a_real_server(served, tmp_path):
    backend = RemoteBackend(served.url)
    app, seen = make_app(tmp_path, backend, sampling={"seed": 3, "max_tokens": 12, "temperature": 1.0}), []
    async with app.run_test(size=(100, 30), message_hook=seen.append) as pilot:
        await wait_ready(pilot, timeout=60)
        await send(pilot, "hello")
        await wait_turn(pilot, timeout=60)
        done = [m for m in seen if isinstance(m, msg.ReplyDone)][-1]
        assert done.finish_reason in ("length", "stop") and replies(app)[-1].text == done.text
        # The server's own answer to the same request, through the official client.
        direct = openai_client(served.url).chat.completions.create(
            model=backend.client.model, messages=[{"role": "user", "content": "hello"}], seed=3, max_tokens=12,
            temperature=1.0)
        assert direct.choices[0].message.content == done.text

        await send(pilot, "/set max_tokens=4000")
        await send(pilot, "tell me more")
        await wait_for(pilot, lambda: len([m for m in seen if isinstance(m, msg.ReplyDelta)]) > 3, 60, "tokens")
        await press_nowait(pilot, "escape")
        await wait_turn(pilot, timeout=30)
        assert [m for m in seen if isinstance(m, msg.ReplyDone)][-1].finish_reason == "cancelled"
