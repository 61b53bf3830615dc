"""Engine events from any OpenAI-compatible server (vLLM, SGLang, llama-server, `qwenlocal serve`).

`RemoteClient.chat` yields the engine's event types (ReasoningDelta, TokenDelta, Stats, then TurnDone or
EngineError) from a streamed `/v1/chat/completions`, so a chat UI can drive a remote model exactly as it drives
the embedded engine. Reasoning comes from `reasoning_content` (or vLLM's newer `reasoning`), or from `<think>`
tags inline in `content` (thinktags.py). Errors never raise out of the iterator: a connection problem is an
EngineError saying what to check, and the next call simply tries again. `cancel` stops the reply promptly even
while the server is silent (a watcher shuts the socket down), which the server sees as a disconnect.

`RemoteBackend` wraps it in the chat app's backend shape (label, load, start_turn, stats, plan, close).
"""
from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any, Callable, Iterator, Mapping, Sequence

import httpx

from qwenlocal.engine.errors import QwenlocalError
from qwenlocal.engine.events import EngineError, Event, ReasoningDelta, Stats, TokenDelta, TurnDone

from .thinktags import InlineThinkSplitter

_FINISH = {"stop": "stop", "length": "length"}  # anything else (tool_calls, content_filter) ended the turn
_STATS_EVERY_S = 0.25


class RemoteError(QwenlocalError):
    """The server could not be reached, refused us, or does not speak the OpenAI API."""


def normalize_endpoint(url: str) -> str:
    """'host:8000', 'http://host:8000' and 'http://host:8000/v1/' all mean http://host:8000/v1."""
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    return url if url.endswith("/v1") else url + "/v1"


def _error_text(resp: httpx.Response) -> str:
    try:
        err = resp.json().get("error")
        msg = err.get("message") if isinstance(err, dict) else err
    except (ValueError, AttributeError):
        msg = None
    msg = msg or resp.text[:300] or resp.reason_phrase
    if resp.status_code == 401:
        return f"the server refused the API key (HTTP 401): {msg}. Pass the right one with --api-key."
    if resp.status_code in (429, 503):
        return f"the server is busy (HTTP {resp.status_code}): {msg}. Try again in a moment."
    return f"the server answered HTTP {resp.status_code}: {msg}"


class _Abort:
    """Shuts the response's socket down when `cancel` is set, waking a read that is blocked on a silent server."""

    def __init__(self, cancel: threading.Event | None, resp: httpx.Response):
        self._done = threading.Event()
        self._cancel, self._resp = cancel, resp
        if cancel is not None:
            threading.Thread(target=self._watch, name="remote-cancel", daemon=True).start()

    def _watch(self) -> None:
        while not self._done.is_set():
            if self._cancel.wait(0.05):
                stream = self._resp.extensions.get("network_stream")
                sock = stream.get_extra_info("socket") if stream is not None else None
                try:
                    if sock is not None:
                        sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                return

    def stop(self) -> None:
        self._done.set()


class RemoteClient:
    def __init__(self, endpoint: str, api_key: str | None = None, model: str | None = None,
                 connect_timeout: float = 10.0, read_timeout: float = 600.0,
                 transport: httpx.BaseTransport | None = None):
        self.base_url = normalize_endpoint(endpoint)
        self.model = model
        self.server_info: dict = {}  # the model card the server reported (max_model_len, owned_by, ...)
        self.last: dict = {}
        self.totals = {"prompt_tokens": 0, "completion_tokens": 0, "turns": 0}
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        timeout = httpx.Timeout(read_timeout, connect=connect_timeout)
        self._http = httpx.Client(headers=headers, timeout=timeout, transport=transport)

    # --- connection ------------------------------------------------------------------------------------------

    def _unreachable(self, exc: Exception) -> str:
        reason = str(exc) or type(exc).__name__
        return (f"cannot reach {self.base_url} ({reason}). Is the server running, and is --endpoint right "
                "(e.g. http://127.0.0.1:8000/v1)?")

    def list_models(self) -> list[dict]:
        try:
            resp = self._http.get(self.base_url + "/models")
        except httpx.HTTPError as exc:
            raise RemoteError(self._unreachable(exc)) from None
        if resp.status_code != 200:
            raise RemoteError(_error_text(resp))
        try:
            data = resp.json()["data"]
            assert isinstance(data, list)
        except (ValueError, KeyError, TypeError, AssertionError):
            raise RemoteError(f"{self.base_url}/models did not answer like an OpenAI-compatible server") from None
        return [m for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]

    def connect(self) -> str:
        """Check the server and pick the model (the one asked for, or the first it serves)."""
        models = self.list_models()
        ids = [m["id"] for m in models]
        if self.model is None:
            if not ids:
                raise RemoteError(f"{self.base_url} serves no models")
            self.model = ids[0]
        elif ids and self.model not in ids:
            raise RemoteError(f"{self.base_url} does not serve {self.model!r}; it serves {', '.join(ids)}")
        self.server_info = next((m for m in models if m["id"] == self.model), {})
        return self.model

    def stats(self) -> dict:
        out = {"device": "remote", "endpoint": self.base_url, "model": self.model,
               "context_limit": self.server_info.get("max_model_len"), **self.totals}
        if self.last:  # as Engine.stats(): totals at the top, the last turn under "last", its speeds on top
            out["last"] = dict(self.last)
            out.update({k: self.last[k] for k in ("ttft_s", "decode_tok_s") if k in self.last})
        return out

    def close(self) -> None:
        self._http.close()

    # --- one turn --------------------------------------------------------------------------------------------

    def chat(self, messages: Sequence[Mapping[str, Any]], sampling: Mapping[str, Any] | None = None,
             enable_thinking: bool = True, cancel: threading.Event | None = None) -> Iterator[Event]:
        body: dict[str, Any] = {"model": self.model, "messages": [dict(m) for m in messages], "stream": True,
                                "stream_options": {"include_usage": True},
                                "chat_template_kwargs": {"enable_thinking": enable_thinking}}
        for key in ("temperature", "top_p", "top_k", "max_tokens", "seed"):
            value = (sampling or {}).get(key)
            if value is not None:
                # The engine's "no top-k cut" is 0; vLLM, SGLang and llama-server all read -1 that way.
                body[key] = -1 if key == "top_k" and value == 0 else value
        return self._turn(body, InlineThinkSplitter(enable_thinking), cancel)

    def _turn(self, body: dict, think: InlineThinkSplitter, cancel: threading.Event | None) -> Iterator[Event]:
        acc = _Turn(self.model)
        try:
            with self._http.stream("POST", self.base_url + "/chat/completions", json=body) as resp:
                if resp.status_code != 200:
                    resp.read()
                    yield EngineError(_error_text(resp), "RemoteHTTPError")
                    return
                abort = _Abort(cancel, resp)
                try:
                    for line in resp.iter_lines():
                        if cancel is not None and cancel.is_set():
                            break
                        for ev in acc.line(line, think):
                            yield ev
                        if acc.error is not None or acc.ended:
                            break
                finally:
                    abort.stop()
        except httpx.ConnectError as exc:
            yield EngineError(self._unreachable(exc), "ConnectionError")
            return
        except (httpx.HTTPError, OSError) as exc:
            if cancel is None or not cancel.is_set():
                kind = "timed out" if isinstance(exc, httpx.TimeoutException) else "dropped"
                yield EngineError(f"the connection to {self.base_url} {kind} mid-reply ({exc or type(exc).__name__}); "
                                  "the reply is incomplete, send it again", "ConnectionError")
                return
        if acc.error is not None:
            yield acc.error
            return
        for ev in acc.finish(think, cancelled=cancel is not None and cancel.is_set()):
            if isinstance(ev, TurnDone):
                self._record(ev)
            yield ev

    def _record(self, done: TurnDone) -> None:
        self.last = dict(done.stats)
        self.totals["prompt_tokens"] += done.prompt_tokens
        self.totals["completion_tokens"] += done.completion_tokens
        self.totals["turns"] += 1


class _Turn:
    """One streamed reply: SSE lines in, events out, with client-side timings."""

    def __init__(self, model: str | None):
        self.model = model
        self.t0 = time.perf_counter()
        self.t_first: float | None = None
        self.last_stats = self.t0
        self.chunks = 0
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.usage: dict = {}
        self.reason: str | None = None
        self.error: EngineError | None = None
        self.ended = False

    def line(self, line: str, think: InlineThinkSplitter) -> list[Event]:
        if not line.startswith("data:"):
            return []  # comments, event names, keep-alives
        data = line[5:].strip()
        if data == "[DONE]":
            self.ended = True
            return []
        try:
            obj = json.loads(data)
        except ValueError:
            self.error = EngineError(f"the server sent a chunk that is not JSON: {data[:120]!r}", "ProtocolError")
            return []
        if "error" in obj:
            err = obj["error"]
            self.error = EngineError(f"the server reported an error: "
                                     f"{err.get('message') if isinstance(err, dict) else err}", "RemoteError")
            return []
        if isinstance(obj.get("usage"), dict):
            self.usage = obj["usage"]
        out: list[Event] = []
        for choice in obj.get("choices") or []:
            delta = choice.get("delta") or {}
            thought = delta.get("reasoning_content") or delta.get("reasoning")
            if thought:
                think.passthrough()
                out.append(self._piece("reasoning", thought))
            if delta.get("content"):
                out += [self._piece(kind, text) for kind, text in think.push(delta["content"])]
            if choice.get("finish_reason"):
                self.reason = choice["finish_reason"]
        if out and time.perf_counter() - self.last_stats > _STATS_EVERY_S:
            self.last_stats = time.perf_counter()
            out.append(Stats(self.stats()))
        return out

    def _piece(self, kind: str, text: str) -> Event:
        if self.t_first is None:
            self.t_first = time.perf_counter()
        self.chunks += 1
        if kind == "reasoning":
            self.reasoning.append(text)
            return ReasoningDelta(text)
        self.text.append(text)
        return TokenDelta(text)

    def stats(self) -> dict:
        now = time.perf_counter()
        ttft = (self.t_first - self.t0) if self.t_first is not None else 0.0
        produced = self.usage.get("completion_tokens", self.chunks)
        span = now - self.t_first if self.t_first is not None else 0.0
        return {"ttft_s": ttft, "decode_tok_s": (produced - 1) / span if produced > 1 and span > 0 else 0.0,
                "prompt_tokens": self.usage.get("prompt_tokens", 0), "completion_tokens": produced,
                "finish_reason": self.reason or "", "model": self.model}

    def finish(self, think: InlineThinkSplitter, cancelled: bool) -> list[Event]:
        out = [self._piece(kind, text) for kind, text in think.flush()]
        if not cancelled and self.reason is None:
            return out + [EngineError("the server ended the stream without finishing the reply", "ProtocolError")]
        reason = "cancelled" if cancelled else _FINISH.get(self.reason, "stop")
        stats = self.stats() | {"finish_reason": reason}
        return out + [TurnDone(reason, stats["prompt_tokens"], stats["completion_tokens"], "".join(self.text),
                               "".join(self.reasoning), stats)]


class RemoteBackend:
    """The chat app's backend shape (see app/chat/backend.py's ChatBackend) over a RemoteClient."""

    is_demo = False

    def __init__(self, endpoint: str, api_key: str | None = None, model: str | None = None):
        self.client = RemoteClient(endpoint, api_key=api_key, model=model)
        self.label = f"{model or 'remote model'} @ {self.client.base_url}"

    def load(self, progress: Callable[[str, int, int], None]) -> None:
        progress("model", 0, 1)
        self.client.connect()
        self.label = f"{self.client.model} @ {self.client.base_url}"
        progress("ready", 1, 1)

    def start_turn(self, messages, sampling, enable_thinking, cancel, reuse_prefix=0) -> Iterator[Event]:
        # A remote server keeps its own prefix cache (vLLM, SGLang); reuse_prefix has nothing to do here.
        return self.client.chat(messages, sampling, enable_thinking=enable_thinking, cancel=cancel)

    def stats(self) -> dict:
        return self.client.stats()

    @property
    def plan(self) -> dict:
        info = self.client.server_info
        return {"backend": {"value": "remote", "reason": "--endpoint"},
                "endpoint": {"value": self.client.base_url, "reason": "--endpoint"},
                "model": {"value": self.client.model, "reason": "--model, or the first model the server lists"},
                "max_context": {"value": info.get("max_model_len"), "reason": "as the server reports it"}}

    def close(self) -> None:
        self.client.close()
