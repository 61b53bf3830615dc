"""The chat's remote backend (RemoteClient / RemoteBackend) against a real `qwenlocal serve` on loopback."""
from __future__ import annotations

from pathlib import Path
import sys
import threading
import time

import pytest

from qwenlocal.app.serve.remote_client import RemoteBackend, RemoteClient, RemoteError
from qwenlocal.engine.events import EngineError, ReasoningDelta, Stats, TokenDelta, TurnDone

sys.path.insert(0, str(Path(__file__).resolve().parent))  # serve_support sits beside this file
from serve_support import (  # noqa: E402
    FREE, HI, MODEL, extra_app, find_long_seed, find_split_seed, free_port, openai_client, serve, wait_for)


@pytest.fixture(scope="module")
def served(tiny_ckpt):
    s = serve(tiny_ckpt)
    yield s
    s.stop()


def test_events_match_the_servers_own_reply(served):
    seed, ref = find_split_seed(openai_client(served.url))
    rc = RemoteClient(served.url)  # no /v1: normalized
    assert rc.connect() == MODEL and rc.stats()["context_limit"] == 4096
    events = list(rc.chat(HI, {"max_tokens": 24, "seed": seed, "top_k": 0, **FREE}, enable_thinking=True))
    done = events[-1]
    assert isinstance(done, TurnDone) and not any(isinstance(e, EngineError) for e in events)
    kinds = [type(e) for e in events if isinstance(e, (ReasoningDelta, TokenDelta))]
    assert kinds.index(TokenDelta) > 0 and ReasoningDelta not in kinds[kinds.index(TokenDelta):]  # think, then answer
    msg = ref.choices[0].message
    assert (done.text, done.reasoning) == (msg.content, msg.reasoning_content)
    assert "".join(e.text for e in events if isinstance(e, TokenDelta)) == done.text
    assert (done.prompt_tokens, done.completion_tokens) == (ref.usage.prompt_tokens, ref.usage.completion_tokens)
    assert done.finish_reason == "length" and done.stats["ttft_s"] > 0
    assert rc.stats()["turns"] == 1 and rc.stats()["completion_tokens"] == 24
    rc.close()


def test_cancel_stops_the_reply_and_the_server(served):
    seed = find_long_seed(openai_client(served.url))  # a reply that does not end by itself before the cancel
    rc = RemoteClient(served.url + "/v1", model=MODEL)
    before = served.health()["counters"]["cancelled"]
    cancel = threading.Event()
    seen = 0
    t0 = time.perf_counter()
    for ev in rc.chat(HI, {"max_tokens": 3000, "seed": seed}, enable_thinking=False, cancel=cancel):
        if isinstance(ev, (TokenDelta, ReasoningDelta)):
            seen += 1
            if seen == 3:
                cancel.set()
        last = ev
    assert isinstance(last, TurnDone) and last.finish_reason == "cancelled"
    assert time.perf_counter() - t0 < 10
    assert wait_for(lambda: served.health()["counters"]["cancelled"] == before + 1)
    after = list(rc.chat(HI, {"max_tokens": 3, "temperature": 0}, enable_thinking=False))
    assert isinstance(after[-1], TurnDone) and after[-1].completion_tokens == 3
    rc.close()


def test_connection_errors_are_clear_and_recoverable(served):
    port = free_port()
    rc = RemoteClient(f"http://127.0.0.1:{port}", model=MODEL, connect_timeout=2)
    events = list(rc.chat(HI, {"max_tokens": 3}))
    assert len(events) == 1 and isinstance(events[0], EngineError) and events[0].kind == "ConnectionError"
    assert "cannot reach" in events[0].message and "--endpoint" in events[0].message
    with pytest.raises(RemoteError, match="cannot reach"):
        rc.connect()
    handle = extra_app(served, port=port)  # the server comes (back) up: the same client just works
    try:
        events = list(rc.chat(HI, {"max_tokens": 3, "temperature": 0}, enable_thinking=False))
        assert isinstance(events[-1], TurnDone) and events[-1].completion_tokens == 3
    finally:
        handle.stop()
    rc.close()


def test_server_errors_become_readable_events(served):
    keyed = extra_app(served, api_key="k")
    try:
        rc = RemoteClient(keyed.url, api_key="wrong", model=MODEL)
        with pytest.raises(RemoteError, match="refused the API key"):
            rc.connect()
        ev = list(rc.chat(HI, {"max_tokens": 3}))
        assert isinstance(ev[-1], EngineError) and "--api-key" in ev[-1].message
        rc.close()
    finally:
        keyed.stop()
    rc = RemoteClient(served.url, model="not-served")
    with pytest.raises(RemoteError, match="does not serve 'not-served'"):
        rc.connect()
    ev = list(rc.chat(HI, {"max_tokens": 3}))
    assert isinstance(ev[-1], EngineError) and "HTTP 400" in ev[-1].message and "not served here" in ev[-1].message
    rc.close()


def test_backend_shape_for_the_chat(served):
    backend = RemoteBackend(served.url)
    stages = []
    backend.load(lambda stage, done, total: stages.append(stage))
    assert stages == ["model", "ready"] and backend.label.startswith(f"{MODEL} @ ")
    assert backend.plan["max_context"]["value"] == 4096
    events = list(backend.start_turn(HI, {"max_tokens": 30, "temperature": None}, False, threading.Event()))
    assert isinstance(events[-1], TurnDone) and all(isinstance(e, (TokenDelta, ReasoningDelta, Stats, TurnDone))
                                                    for e in events)
    assert backend.stats()["last"]["completion_tokens"] == events[-1].completion_tokens
    backend.close()


def test_cancel_while_the_server_is_silent(served):
    """A long prefill sends nothing; cancel must still end the turn at once (the socket is shut down)."""
    rc = RemoteClient(served.url, model=MODEL)
    before = served.health()["counters"]["cancelled"]
    cancel = threading.Event()
    threading.Timer(0.2, cancel.set).start()
    t0 = time.perf_counter()
    events = list(rc.chat([{"role": "user", "content": "the " * 3500}], {"max_tokens": 1}, cancel=cancel))
    assert isinstance(events[-1], TurnDone) and events[-1].finish_reason == "cancelled"
    assert time.perf_counter() - t0 < 0.9  # the whole prefill takes about 1 s on this CPU
    assert wait_for(lambda: served.health()["counters"]["cancelled"] == before + 1)
    rc.close()
