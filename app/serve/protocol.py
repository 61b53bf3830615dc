"""Request validation: OpenAI request bodies -> small dataclasses, or an ApiError (a 400 in OpenAI's error shape).

Hand-written rather than pydantic models because every message must name the field and say what is accepted,
and the status must be 400 (FastAPI's own validation answers 422 in its own shape, which OpenAI clients do not
parse). Unknown fields are ignored, as OpenAI-compatible servers do: clients send many optional ones.
Features we do not implement (tools, n > 1, logprobs, penalties) are refused with a 400 rather than ignored,
so a client never gets a silently different answer from the one it asked for.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MAX_STOPS = 16
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


class ApiError(Exception):
    """An HTTP error with OpenAI's body: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


@dataclass(frozen=True)
class GenRequest:
    """What both endpoints share: sampling, stops, streaming."""

    model: str
    sampling: dict  # only the fields the client set: temperature, top_p, top_k, max_tokens, seed
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False


@dataclass(frozen=True)
class ChatRequest(GenRequest):
    messages: tuple[dict, ...] = ()
    enable_thinking: bool = True  # Qwen3's template default: think unless told not to


@dataclass(frozen=True)
class CompletionRequest(GenRequest):
    prompt: str | tuple[int, ...] = field(default="")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _type_name(v: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(v), "a number" if _is_num(v) else type(v).__name__)


def _model(body: dict, served: str) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad(f"'model' must be a non-empty string (this server serves {served!r}), got {_type_name(model)}",
                  "model")
    if model != served:
        raise bad(f"the model {model!r} is not served here; this server serves {served!r} (see GET /v1/models)",
                  "model", "model_not_found")
    return model


def _sampling(body: dict) -> dict:
    out: dict[str, Any] = {}
    t = body.get("temperature")
    if t is not None:
        if not _is_num(t) or not 0 <= t <= 2:
            raise bad(f"'temperature' must be a number from 0 to 2, got {t!r}", "temperature")
        out["temperature"] = float(t)
    p = body.get("top_p")
    if p is not None:
        if not _is_num(p) or not 0 < p <= 1:
            raise bad(f"'top_p' must be a number in (0, 1], got {p!r}", "top_p")
        out["top_p"] = float(p)
    k = body.get("top_k")
    if k is not None:
        # vLLM and SGLang spell "no top-k cut" as -1; the engine spells it 0.
        if not _is_int(k) or k < -1:
            raise bad(f"'top_k' must be an integer >= 0 (or -1 for no cut), got {k!r}", "top_k")
        out["top_k"] = max(k, 0)
    seed = body.get("seed")
    if seed is not None:
        if not _is_int(seed):
            raise bad(f"'seed' must be an integer, got {seed!r}", "seed")
        out["seed"] = seed
    # max_completion_tokens is the newer name; when both come, it wins (OpenAI deprecated max_tokens).
    for name in ("max_tokens", "max_completion_tokens"):
        v = body.get(name)
        if v is not None:
            if not _is_int(v) or v < 1:
                raise bad(f"'{name}' must be a positive integer, got {v!r}", name)
            out["max_tokens"] = v
    return out


def _stops(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    items = [stop] if isinstance(stop, str) else stop
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise bad(f"'stop' must be a string or an array of strings, got {_type_name(stop)}", "stop")
    if len(items) > MAX_STOPS:
        raise bad(f"'stop' has {len(items)} entries; at most {MAX_STOPS} are accepted", "stop")
    return tuple(s for s in items if s)


def _unsupported(body: dict) -> None:
    n = body.get("n")
    if n is not None and n != 1:
        raise bad(f"'n' must be 1: this server generates one choice per request, got {n!r}", "n")
    for name in ("presence_penalty", "frequency_penalty"):
        v = body.get(name)
        if v is not None and (not _is_num(v) or v != 0):
            raise bad(f"'{name}' is not supported (only 0 is accepted), got {v!r}", name)
    if body.get("logprobs") not in (None, False, 0):
        raise bad("'logprobs' is not supported by this server", "logprobs")
    if body.get("best_of") not in (None, 1):
        raise bad("'best_of' is not supported (only 1)", "best_of")


def _stream(body: dict) -> tuple[bool, bool]:
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise bad(f"'stream' must be a boolean, got {_type_name(stream)}", "stream")
    opts = body.get("stream_options")
    include_usage = False
    if opts is not None:
        if not isinstance(opts, dict):
            raise bad(f"'stream_options' must be an object, got {_type_name(opts)}", "stream_options")
        include_usage = opts.get("include_usage", False)
        if not isinstance(include_usage, bool):
            raise bad("'stream_options.include_usage' must be a boolean", "stream_options.include_usage")
    return stream, include_usage


def _content(value: Any, i: int, role: str) -> str:
    if isinstance(value, str):
        return value
    if value is None and role == "assistant":  # an assistant turn that only carried tool calls
        return ""
    if isinstance(value, list):
        parts = []
        for j, part in enumerate(value):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else _type_name(part)
                raise bad(f"messages[{i}].content[{j}] is {kind!r}; only text parts are supported",
                          f"messages[{i}].content")
            parts.append(part["text"])
        return "".join(parts)
    raise bad(f"messages[{i}].content must be a string or an array of text parts, got {_type_name(value)}",
              f"messages[{i}].content")


def _messages(body: dict) -> tuple[dict, ...]:
    msgs = body.get("messages")
    if isinstance(msgs, list) and not msgs:
        raise bad("'messages' is empty; send at least one {role, content} message, e.g. "
                  "[{\"role\": \"user\", \"content\": \"Hi\"}]", "messages")
    if not isinstance(msgs, list):
        raise bad(f"'messages' must be a non-empty array of {{role, content}} objects, got {_type_name(msgs)}",
                  "messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise bad(f"messages[{i}] must be an object, got {_type_name(m)}", f"messages[{i}]")
        role = _ROLES.get(m.get("role"))
        if role is None:
            raise bad(f"messages[{i}].role is {m.get('role')!r}; use one of {', '.join(_ROLES)}",
                      f"messages[{i}].role")
        out.append({"role": role, "content": _content(m.get("content"), i, role)})
    return tuple(out)


def _thinking(body: dict) -> bool:
    kwargs = body.get("chat_template_kwargs")
    if kwargs is None:
        return True
    if not isinstance(kwargs, dict):
        raise bad(f"'chat_template_kwargs' must be an object, got {_type_name(kwargs)}", "chat_template_kwargs")
    value = kwargs.get("enable_thinking", True)
    if not isinstance(value, bool):
        raise bad("'chat_template_kwargs.enable_thinking' must be a boolean", "chat_template_kwargs.enable_thinking")
    return value


def _common(body: Any, served: str) -> dict:
    if not isinstance(body, dict):
        raise bad(f"the request body must be a JSON object, got {_type_name(body)}")
    model = _model(body, served)
    _unsupported(body)
    stream, include_usage = _stream(body)
    return {"model": model, "sampling": _sampling(body), "stop": _stops(body), "stream": stream,
            "include_usage": include_usage}


def parse_chat(body: Any, served: str) -> ChatRequest:
    common = _common(body, served)
    if body.get("tools"):
        raise bad("'tools' (function calling) is not supported by this server yet", "tools")
    fmt = body.get("response_format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
        raise bad("'response_format' other than {\"type\": \"text\"} is not supported", "response_format")
    return ChatRequest(**common, messages=_messages(body), enable_thinking=_thinking(body))


def parse_completion(body: Any, served: str) -> CompletionRequest:
    common = _common(body, served)
    if body.get("echo"):
        raise bad("'echo' is not supported by this server", "echo")
    if body.get("suffix"):
        raise bad("'suffix' is not supported by this server", "suffix")
    prompt = body.get("prompt")
    # One prompt per request: a string, a one-string array, or one array of token ids.
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, list) and prompt and all(_is_int(t) and t >= 0 for t in prompt):
        prompt = tuple(prompt)
    elif not isinstance(prompt, str):
        raise bad("'prompt' must be a string, or one array of token ids (one prompt per request)", "prompt")
    if not prompt:
        raise bad("'prompt' must not be empty", "prompt")
    return CompletionRequest(**common, prompt=prompt)
