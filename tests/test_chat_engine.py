"""`qwenlocal chat` on the real engine: the built-in demo model (a tiny qwen3_5_moe checkpoint) on the CPU, made
under a temporary QWENLOCAL_HOME. Loading with progress, a streamed reply, Esc mid-reply, and a second turn."""
from __future__ import annotations

import pytest

from qwenlocal.app.chat import messages as msg
from qwenlocal.app.chat.backend import EngineBackend
from qwenlocal.app.chat.testing import make_app, press_nowait, replies, send, wait_for, wait_ready, wait_turn

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"  # Textual runs on asyncio


async def test_chat_with_the_demo_model_on_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("QWENLOCAL_HOME", str(tmp_path / "home"))
    backend = EngineBackend(None, device="cpu")
    app, seen = make_app(tmp_path, backend, sampling={"seed": 1, "max_tokens": 4000}), []

    def of(cls):
        return [m for m in seen if isinstance(m, cls)]

    async with app.run_test(size=(100, 30), message_hook=seen.append) as pilot:
        await wait_ready(pilot, timeout=120)
        assert "built-in demo model" in app.sub_title  # the header says which model, and that it is the demo
        assert of(msg.LoadProgress) and app._load_state[0][-3:] == ("engine", "weights", "ready")

        # Count decode steps that start after the cancel was set: the engine checks it before every step.
        runner, decode = backend._engine.runner, backend._engine.runner.decode
        late: list[bool] = []

        def counted_decode(*args, **kwargs):
            late.append(app._cancel.is_set())
            return decode(*args, **kwargs)

        monkeypatch.setattr(runner, "decode", counted_decode)
        await send(pilot, "hello")
        await wait_for(pilot, lambda: len(of(msg.ReplyDelta)) >= 5, 60, "the first tokens")
        await press_nowait(pilot, "escape")
        await wait_turn(pilot, timeout=30)
        [done] = of(msg.ReplyDone)
        assert done.finish_reason == "cancelled"
        assert sum(late) <= 1, f"{sum(late)} decode steps ran after Esc"  # at most the one already in flight
        assert done.stats["completion_tokens"] < 4000
        assert replies(app)[0].text == done.text and app.conv.messages[-1].finish_reason == "cancelled"

        await send(pilot, "/set max_tokens=6")
        await send(pilot, "again")
        await wait_turn(pilot, timeout=60)
        last = of(msg.ReplyDone)[-1]
        assert last.finish_reason in ("length", "stop") and last.stats["completion_tokens"] <= 6
        assert replies(app)[-1].text == last.text
        line = str(app.status.render())
        assert line.startswith("ready") and "tok/s" in line and f"/{backend._engine.max_context}" in line


async def test_context_overflow_on_the_demo_model(tmp_path, monkeypatch):
    """The real engine and tokenizer: a conversation past a small context keeps working, trimmed by the engine's
    own count; a message longer than the context is refused and the next one works."""
    monkeypatch.setenv("QWENLOCAL_HOME", str(tmp_path / "home"))
    (tmp_path / "chat-settings.json").write_text('{"context_full": "drop"}')  # remembered: no question
    backend = EngineBackend(None, device="cpu", options={"max_context": 256})
    app, seen = make_app(tmp_path, backend, sampling={"seed": 1, "max_tokens": 8}, thinking=False), []
    async with app.run_test(size=(100, 30), message_hook=seen.append) as pilot:
        await wait_ready(pilot, timeout=120)
        assert backend.context_limit == 256
        for turn in range(5):
            await send(pilot, " ".join(f"word{turn}x{i}" for i in range(12)))
            await wait_turn(pilot, timeout=60)
            assert app.conv.messages[-1].finish_reason in ("stop", "length"), app.conv.messages[-1]
        trims = [m for m in seen if isinstance(m, msg.ContextTrimmed)]
        assert trims and trims[-1].tokens + 64 <= 256
        assert list(app.view.query(".context-note"))
        assert len(app.conv.messages) == 10  # the saved conversation keeps every turn
        await send(pilot, " ".join(f"long{i}" for i in range(300)))
        await wait_turn(pilot, timeout=60)
        assert app.conv.messages[-1].finish_reason == "refused"
        failed = [m for m in seen if isinstance(m, msg.ReplyFailed)][-1]
        assert "context limit is 256 tokens" in failed.message
        await send(pilot, "short")
        await wait_turn(pilot, timeout=60)
        assert app.conv.messages[-1].finish_reason in ("stop", "length")


async def test_summarising_the_oldest_turns_on_the_demo_model(tmp_path, monkeypatch):
    """The summary request runs on the real engine (thinking off, bounded), and what is sent stays in the
    context. The demo model's weights are random: its summary is arbitrary text, or empty (then dropped)."""
    monkeypatch.setenv("QWENLOCAL_HOME", str(tmp_path / "home"))
    (tmp_path / "chat-settings.json").write_text('{"context_full": "summarise"}')
    # 512: the demo tokenizer spends ~7 tokens a word, and the request must hold a turn beside its instructions.
    backend = EngineBackend(None, device="cpu", options={"max_context": 512})
    app, seen = make_app(tmp_path, backend, sampling={"seed": 1, "max_tokens": 8}, thinking=False), []
    async with app.run_test(size=(100, 30), message_hook=seen.append) as pilot:
        await wait_ready(pilot, timeout=120)
        for turn in range(7):
            await send(pilot, " ".join(f"word{turn}x{i}" for i in range(12)))
            await wait_turn(pilot, timeout=90)
            assert app.conv.messages[-1].finish_reason in ("stop", "length"), app.conv.messages[-1]
        assert [m for m in seen if isinstance(m, msg.SummaryStarted)]
        done = [m for m in seen if isinstance(m, (msg.Summarised, msg.ContextTrimmed))]
        assert done and all(m.tokens + 64 <= 512 for m in done)
        summarised = [m for m in done if isinstance(m, msg.Summarised)]
        if summarised:  # the summary the engine wrote is what the conversation keeps and shows
            assert app.conv.summary == summarised[-1].summary and app.conv.summary["text"]
            assert any("summarised" in str(n.render()) for n in app.view.query(".context-note"))
        else:
            assert all(m.reason.startswith("summarising failed") for m in done)
        assert len(app.conv.messages) == 14
