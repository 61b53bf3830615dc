"""OpenAI response bodies and SSE chunks, built from the engine's events (plain dicts, no framework types)."""
from __future__ import annotations

import json
import time
import uuid

from qwenlocal.engine.events import TurnDone

# The engine's reasons -> OpenAI's. "context" (the window filled up) is a length limit to a client, as in vLLM;
# "cancelled" is only seen by a client that already left, or after a stop string (rewritten to "stop").
FINISH = {"stop": "stop", "length": "length", "context": "length", "cancelled": "stop"}
SSE_DONE = "data: [DONE]\n\n"


class Ids:
    """One response's id, creation time and model, shared by all of its chunks."""

    def __init__(self, prefix: str, model: str):
        self.id = f"{prefix}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.model = model

    def head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}


def sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def usage(done: TurnDone) -> dict:
    return {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens,
            "total_tokens": done.prompt_tokens + done.completion_tokens}


def finish_reason(done: TurnDone) -> str:
    return FINISH.get(done.finish_reason, "stop")


def chat_response(ids: Ids, done: TurnDone) -> dict:
    message = {"role": "assistant", "content": done.text, "reasoning_content": done.reasoning or None}
    return {**ids.head("chat.completion"),
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason(done)}],
            "usage": usage(done)}


def chat_chunk(ids: Ids, delta: dict, finish: str | None = None) -> dict:
    return {**ids.head("chat.completion.chunk"),
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}


def completion_response(ids: Ids, done: TurnDone) -> dict:
    return {**ids.head("text_completion"),
            "choices": [{"index": 0, "text": done.text, "logprobs": None, "finish_reason": finish_reason(done)}],
            "usage": usage(done)}


def completion_chunk(ids: Ids, text: str, finish: str | None = None) -> dict:
    return {**ids.head("text_completion"),
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]}


def usage_chunk(ids: Ids, obj: str, done: TurnDone) -> dict:
    """The extra last chunk of `stream_options: {include_usage: true}`: no choices, only usage."""
    return {**ids.head(obj), "choices": [], "usage": usage(done)}


def error_body(message: str, type: str = "server_error", code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": None, "code": code}}
