"""Serve building blocks without a server: stop matching, inline think tags, request validation, binding."""
from __future__ import annotations

import sys

import pytest

from qwenlocal.app.serve.launch import exposure_warning, is_loopback
from qwenlocal.app.serve.protocol import ApiError, parse_chat, parse_completion
from qwenlocal.app.serve.remote_client import normalize_endpoint
from qwenlocal.app.serve.stops import StopMatcher
from qwenlocal.app.serve.thinktags import InlineThinkSplitter


def run_stops(stops, pieces):
    m = StopMatcher(stops)
    out = [m.push(p) for p in pieces]
    return "".join(out) + m.flush(), m.stopped, out


def test_stop_cuts_across_pieces_and_never_shows_a_half_stop():
    text, stopped, out = run_stops(["END"], ["hello E", "N", "D tail"])
    assert (text, stopped) == ("hello ", True)
    assert out == ["hello ", "", ""]  # "E" and "N" were held, never shown


def test_stop_false_start_is_released_and_earliest_stop_wins():
    assert run_stops(["ab"], ["xa", "c", "d"])[:2] == ("xacd", False)
    assert run_stops(["world", "lo"], ["hel", "lo world"])[:2] == ("hel", True)
    assert run_stops([], ["a", "b"])[:2] == ("ab", False)
    assert run_stops(["zz"], ["z"])[:2] == ("z", False)  # a held tail is just text at the end


def split(enable, pieces):
    s = InlineThinkSplitter(enable)
    out = [x for p in pieces for x in s.push(p)] + s.flush()
    joined = {"reasoning": "", "content": ""}
    for kind, text in out:
        joined[kind] += text
    return joined


def test_inline_think_tags_split_across_chunks():
    # Thinking on, template-injected <think>: only the closing tag arrives.
    assert split(True, ["I think", " so</th", "ink>\n\nAnswer"]) == {"reasoning": "I think so", "content": "Answer"}
    # The model opens the block itself, the tag split over chunks.
    assert split(False, ["<thi", "nk>\nhm</think>", "Yes"]) == {"reasoning": "hm", "content": "Yes"}
    # Thinking off and no tags: all answer, even a '<' at the start.
    assert split(False, ["<b>bold</b>"]) == {"reasoning": "", "content": "<b>bold</b>"}


def test_inline_think_passthrough_when_the_server_splits():
    s = InlineThinkSplitter(True)
    s.passthrough()
    assert s.push("answer") == [("content", "answer")]


BASE = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("patch,param", [
    ({"model": "other"}, "model"), ({"model": 3}, "model"), ({"messages": "hi"}, "messages"),
    ({"messages": []}, "messages"), ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"max_tokens": "10"}, "max_tokens"), ({"max_tokens": 0}, "max_tokens"), ({"temperature": "hot"}, "temperature"),
    ({"temperature": 3}, "temperature"), ({"top_p": 0}, "top_p"), ({"top_k": 1.5}, "top_k"), ({"seed": "x"}, "seed"),
    ({"stream": "yes"}, "stream"), ({"stop": 5}, "stop"), ({"stop": ["a"] * 17}, "stop"), ({"n": 2}, "n"),
    ({"tools": [{"type": "function"}]}, "tools"), ({"chat_template_kwargs": {"enable_thinking": "no"}},
                                                   "chat_template_kwargs.enable_thinking"),
])
def test_chat_validation_names_the_field(patch, param):
    with pytest.raises(ApiError) as err:
        parse_chat({**BASE, **patch}, "m")
    assert err.value.status == 400 and err.value.param == param
    assert err.value.body()["error"]["type"] == "invalid_request_error"


def test_chat_parsing_maps_openai_fields():
    req = parse_chat({**BASE, "max_tokens": 5, "max_completion_tokens": 7, "top_k": -1, "stop": "x", "seed": 3,
                      "messages": [{"role": "developer", "content": [{"type": "text", "text": "be "},
                                                                     {"type": "text", "text": "brief"}]},
                                   {"role": "user", "content": "hi"}],
                      "chat_template_kwargs": {"enable_thinking": False}, "unknown_field": 1}, "m")
    assert req.sampling == {"max_tokens": 7, "top_k": 0, "seed": 3}
    assert req.stop == ("x",) and req.enable_thinking is False
    assert req.messages[0] == {"role": "system", "content": "be brief"}


def test_completion_prompt_forms():
    assert parse_completion({"model": "m", "prompt": ["abc"]}, "m").prompt == "abc"
    assert parse_completion({"model": "m", "prompt": [1, 2, 3]}, "m").prompt == (1, 2, 3)
    for bad in ("", ["a", "b"], {"x": 1}, [1, "a"]):
        with pytest.raises(ApiError):
            parse_completion({"model": "m", "prompt": bad}, "m")


def test_binding_warning_only_when_exposed_without_key():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("example.org")
    assert exposure_warning("127.0.0.1", None) is None
    assert exposure_warning("0.0.0.0", "key") is None
    assert "NO API KEY" in exposure_warning("0.0.0.0", None)


def test_endpoint_forms():
    for url in ("127.0.0.1:8000", "http://127.0.0.1:8000", "http://127.0.0.1:8000/v1/"):
        assert normalize_endpoint(url) == "http://127.0.0.1:8000/v1"


def test_serve_modules_do_not_import_torch():
    import subprocess

    code = ("import sys; import qwenlocal.app.commands.serve, qwenlocal.app.serve.server, "
            "qwenlocal.app.serve.remote_client, qwenlocal.app.serve.loadtest; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_empty_messages_says_empty():
    with pytest.raises(ApiError) as err:
        parse_chat({**BASE, "messages": []}, "m")
    message = err.value.body()["error"]["message"]
    assert "is empty" in message and "got an array" not in message and err.value.param == "messages"
