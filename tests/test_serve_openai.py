"""`qwenlocal serve` on loopback, driven by the official `openai` client (tiny model, CPU)."""
from __future__ import annotations

from pathlib import Path
import sys
import threading

import httpx
import openai
import pytest

from qwenlocal.engine.tokenizer import ChatTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))  # serve_support sits beside this file
from serve_support import FREE, HI, MODEL, extra_app, find_split_seed, openai_client, serve, wait_for  # noqa: E402


@pytest.fixture(scope="module")
def served(tiny_ckpt):
    s = serve(tiny_ckpt)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(served):
    return openai_client(served.url)


def stream_parts(client, **kw):
    content, reasoning, finish, usage = [], [], None, None
    for chunk in client.chat.completions.create(model=MODEL, stream=True, stream_options={"include_usage": True}, **kw):
        usage = chunk.usage or usage
        for ch in chunk.choices:
            if ch.delta.content:
                content.append(ch.delta.content)
            if getattr(ch.delta, "reasoning_content", None):
                reasoning.append(ch.delta.reasoning_content)
            finish = ch.finish_reason or finish
    return content, reasoning, finish, usage


def test_models_and_health(served, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert client.models.retrieve(MODEL).max_model_len == 4096
    h = served.health()
    assert h["status"] == "ok" and h["model"] == MODEL and h["running"] == 0


def test_non_streaming_and_streaming_agree(client):
    kw = dict(messages=HI, max_tokens=12, seed=7, extra_body={"chat_template_kwargs": {"enable_thinking": False}},
              **FREE)
    r = client.chat.completions.create(model=MODEL, **kw)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "length" and msg.content and msg.reasoning_content is None
    assert r.usage.completion_tokens == 12 and r.usage.total_tokens == r.usage.prompt_tokens + 12
    content, reasoning, finish, usage = stream_parts(client, **kw)
    assert "".join(content) == msg.content and not reasoning and finish == "length"
    assert usage.model_dump() == r.usage.model_dump()


def test_reasoning_split(client):
    seed, r = find_split_seed(client)
    msg = r.choices[0].message
    assert "<think>" not in msg.content + msg.reasoning_content and "</think>" not in msg.content
    content, reasoning, _, _ = stream_parts(client, messages=HI, max_tokens=24, seed=seed,
                                            extra_body={"top_k": 0}, **FREE)
    assert "".join(reasoning) == msg.reasoning_content and "".join(content) == msg.content


def test_stop_cuts_across_token_boundaries_and_ends_generation(client):
    kw = dict(messages=HI, seed=11, extra_body={"chat_template_kwargs": {"enable_thinking": False}}, **FREE)
    pieces, _, _, _ = stream_parts(client, max_tokens=40, **kw)
    full = "".join(pieces)
    k = next(i for i in range(3, len(pieces) - 1) if len(pieces[i]) >= 2 and len(pieces[i + 1]) >= 1)
    stop = pieces[k][-2:] + pieces[k + 1][:1]  # spans two tokens
    cut = full[:full.index(stop)]
    r = client.chat.completions.create(model=MODEL, max_tokens=40, stop=[stop, "never-appears"], **kw)
    assert r.choices[0].message.content == cut and r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens < 40  # the engine stopped, not just the text
    content, _, finish, _ = stream_parts(client, max_tokens=40, stop=stop, **kw)
    assert "".join(content) == cut and finish == "stop"
    assert all(stop not in c for c in content)


def test_completions_raw_prompt(client, tiny_ckpt):
    prompt = "Once upon a time"
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=10, seed=3, **FREE)
    assert r.usage.prompt_tokens == len(ChatTokenizer.from_dir(tiny_ckpt).encode(prompt))  # no template
    assert r.usage.completion_tokens == 10 and r.choices[0].finish_reason == "length"
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=10, seed=3, stream=True, **FREE) if c.choices)
    assert streamed == r.choices[0].text
    stop = r.choices[0].text[3:5]
    cut = client.completions.create(model=MODEL, prompt=prompt, max_tokens=10, seed=3, stop=stop, **FREE)
    assert cut.choices[0].text == r.choices[0].text[:r.choices[0].text.index(stop)]
    ids = client.completions.create(model=MODEL, prompt=[5, 6, 7], max_tokens=2, temperature=0)  # token ids as the prompt
    assert ids.usage.prompt_tokens == 3 and ids.usage.completion_tokens == 2
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt="the " * 5000, max_tokens=2)
    assert err.value.body["code"] == "context_length_exceeded"


def test_disconnect_cancels_and_the_next_request_works(served, client):
    before = served.health()["counters"]["cancelled"]
    stream = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=3000, stream=True, seed=1)
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    assert wait_for(lambda: served.health()["counters"]["cancelled"] == before + 1), served.health()
    last = served.health()["last"]
    assert last["engine_finish_reason"] == "cancelled" and last["completion_tokens"] < 3000
    r = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=4, temperature=0)
    assert r.usage.completion_tokens == 4


def test_queue_full_is_a_clear_429(served, client, monkeypatch):
    # Hold the running generation in its first decode step, so it cannot end (EOS) before the queue fills.
    gate = threading.Event()
    runner = served.worker.engine.runner
    real_decode = runner.decode

    def gated_decode(*args, **kwargs):
        gate.wait(60)
        return real_decode(*args, **kwargs)

    monkeypatch.setattr(runner, "decode", gated_decode)
    served.worker.max_waiting = 1
    try:
        # Greedy: a fixed first token (not EOS for this model), then the gate.
        running = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=3000, stream=True,
                                                 temperature=0)
        next(iter(running))  # generating now
        waited = {}
        t = threading.Thread(target=lambda: waited.update(
            r=client.chat.completions.create(model=MODEL, messages=HI, max_tokens=3, temperature=0)))
        t.start()
        assert wait_for(lambda: served.health()["waiting"] == 1)
        with pytest.raises(openai.RateLimitError) as err:
            client.chat.completions.create(model=MODEL, messages=HI, max_tokens=3)
        assert err.value.status_code == 429 and err.value.body["code"] == "queue_full"
        assert "queue" in err.value.body["message"] and err.value.response.headers["retry-after"] == "1"
        running.close()
        gate.set()
        t.join(30)
        assert waited["r"].usage.completion_tokens == 3  # the queued one was served after the cancel
    finally:
        gate.set()
        served.worker.max_waiting = 4


@pytest.mark.parametrize("kw,param,code", [
    ({"model": "gpt-4o"}, "model", "model_not_found"),
    ({"max_tokens": "ten"}, "max_tokens", None),
    ({"temperature": "hot"}, "temperature", None),
    ({"messages": [{"role": "user", "content": 42}]}, "messages[0].content", None),
    ({"messages": [{"role": "user", "content": "word " * 5000}]}, None, "context_length_exceeded"),
])
def test_bad_requests_are_400s(client, kw, param, code):
    args = {"model": MODEL, "messages": HI, "max_tokens": 4, **kw}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(**args)
    body = err.value.body
    assert err.value.status_code == 400 and body["type"] == "invalid_request_error" and body["message"]
    assert body["param"] == param and body["code"] == code


def test_bad_json_and_unknown_routes_use_openai_error_shape(served):
    r = httpx.post(served.url + "/v1/chat/completions", content=b"{nope", timeout=10)
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = httpx.get(served.url + "/v1/nothing", timeout=10)
    assert r.status_code == 404 and r.json()["error"]["message"] == "no route GET /v1/nothing"


def test_auth_off_and_on(served):
    # Off (the default server): any key, or none, is fine.
    assert httpx.get(served.url + "/v1/models", timeout=10).status_code == 200
    keyed = extra_app(served, api_key="s3cret")
    try:
        url = keyed.url
        with pytest.raises(openai.AuthenticationError) as err:
            openai_client(url, "wrong").models.list()
        assert err.value.status_code == 401 and err.value.body["code"] == "invalid_api_key"
        assert httpx.get(url + "/v1/models", timeout=10).status_code == 401  # no header at all
        assert httpx.get(url + "/health", timeout=10).status_code == 200  # probes need no key
        r = openai_client(url, "s3cret").chat.completions.create(model=MODEL, messages=HI, max_tokens=3,
                                                                   temperature=0)
        assert r.usage.completion_tokens == 3
    finally:
        keyed.stop()
