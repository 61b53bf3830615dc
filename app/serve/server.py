"""The FastAPI app: OpenAI-compatible routes over an EngineWorker.

Handlers validate, submit a Job and wait on its items; the HTTP status is chosen only after the engine has
accepted the request (`Started`), so a prompt past the context is a 400, not a 200 stream that errors. A client
that leaves sets the job's cancel event: while it waits (a watcher task reads `http.disconnect`) and while it
streams (Starlette cancels the body iterator, whose `finally` sets the event).
"""
from __future__ import annotations

import asyncio
import hmac
import time
from typing import Any, AsyncIterator, Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from qwenlocal.engine.errors import ContextLimitError
from qwenlocal.engine.events import EngineError, ReasoningDelta, TokenDelta, TurnDone

from . import responses as R
from .protocol import ApiError, GenRequest, bad, parse_chat, parse_completion
from .worker import EngineWorker, Job, NotReady, QueueFull, Rejected, Started

MAX_BODY_BYTES = 32 * 2**20  # far above any context's worth of text; refuses a runaway upload early
_STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _error_response(exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def _read_json(request: Request) -> Any:
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > MAX_BODY_BYTES:
        raise ApiError(413, f"the request body is {int(length)} bytes; at most {MAX_BODY_BYTES} are accepted")
    try:
        return await request.json()
    except ValueError:  # JSONDecodeError and UnicodeDecodeError are both ValueErrors
        raise bad("the request body is not valid JSON") from None


async def _watching(request: Request, job: Job, awaitable: Awaitable) -> Any:
    """Await `awaitable`, setting job.cancel if the client disconnects meanwhile."""

    async def watch() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                job.cancel.set()
                return

    watcher = asyncio.ensure_future(watch())
    try:
        return await awaitable
    finally:
        watcher.cancel()


async def _until_done(job: Job) -> TurnDone | EngineError:
    while True:
        item = await job.items.get()
        if isinstance(item, (TurnDone, EngineError)):
            return item


def create_app(worker: EngineWorker, model_id: str, api_key: str | None = None) -> FastAPI:
    app = FastAPI(title="qwenlocal", docs_url=None, redoc_url=None, openapi_url=None)
    created = int(time.time())

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return _error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        msg = f"no route {request.method} {request.url.path}" if exc.status_code in (404, 405) else str(exc.detail)
        return _error_response(ApiError(exc.status_code, msg, code="not_found" if exc.status_code == 404 else None))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _error_response(bad(f"invalid request: {exc.errors()}"))

    def check_auth(request: Request) -> None:
        if api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
            raise ApiError(401, "a valid API key is required: send the header 'Authorization: Bearer <key>' with "
                                "the key given to `qwenlocal serve --api-key`", code="invalid_api_key")

    def model_card() -> dict:
        return {"id": model_id, "object": "model", "created": created, "owned_by": "qwenlocal",
                "max_model_len": worker.info.get("max_context")}

    @app.get("/health")
    async def health() -> JSONResponse:
        # No auth: load balancers and scripts probe it; it tells nothing beyond queue counts.
        body = {"status": "ok" if worker.ready else "unavailable", "model": model_id, **worker.snapshot()}
        return JSONResponse(body, status_code=200 if worker.ready else 503)

    @app.get("/v1/models")
    async def models(request: Request) -> dict:
        check_auth(request)
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str, request: Request) -> dict:
        check_auth(request)
        if name != model_id:
            raise ApiError(404, f"the model {name!r} is not served here; this server serves {model_id!r}",
                           param="model", code="model_not_found")
        return model_card()

    async def start(request: Request, parse: Callable) -> tuple[Job, Any]:
        """Auth, validation, admission, and the engine's own checks; returns the job once generating."""
        check_auth(request)
        req = parse(await _read_json(request), model_id)
        job = Job(req, asyncio.get_running_loop())
        try:
            worker.submit(job)
        except QueueFull as exc:
            raise ApiError(429, str(exc), type="server_busy", code="queue_full", headers={"Retry-After": "1"})
        except NotReady as exc:
            raise ApiError(503, str(exc), type="server_error", code="engine_unavailable")
        first = await _watching(request, job, job.items.get())
        if isinstance(first, Rejected):
            code = "context_length_exceeded" if isinstance(first.error, ContextLimitError) else "invalid_value"
            raise ApiError(400, str(first.error), code=code)
        if isinstance(first, EngineError):
            raise ApiError(503 if first.kind == "ShuttingDown" else 500, first.message, type="server_error")
        return job, first

    async def reply(request: Request, job: Job, first: Any, full: Callable, stream: Callable):
        req: GenRequest = job.request
        if not isinstance(first, Started):  # the client left while queued; nobody reads this
            return JSONResponse(R.error_body("the request was cancelled", code="cancelled"), status_code=499)
        if req.stream:
            return StreamingResponse(stream(job), media_type="text/event-stream", headers=_STREAM_HEADERS)
        done = await _watching(request, job, _until_done(job))
        if isinstance(done, EngineError):
            raise ApiError(500, done.message, type="server_error")
        return full(done)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        job, first = await start(request, parse_chat)
        ids = R.Ids("chatcmpl", model_id)
        return await reply(request, job, first, lambda done: R.chat_response(ids, done),
                           lambda job: _chat_stream(job, ids))

    @app.post("/v1/completions")
    async def completions(request: Request):
        job, first = await start(request, parse_completion)
        ids = R.Ids("cmpl", model_id)
        return await reply(request, job, first, lambda done: R.completion_response(ids, done),
                           lambda job: _completion_stream(job, ids))

    return app


async def _chat_stream(job: Job, ids: R.Ids) -> AsyncIterator[str]:
    try:
        yield R.sse(R.chat_chunk(ids, {"role": "assistant", "content": ""}))
        while True:
            item = await job.items.get()
            if isinstance(item, TokenDelta):
                yield R.sse(R.chat_chunk(ids, {"content": item.text}))
            elif isinstance(item, ReasoningDelta):
                yield R.sse(R.chat_chunk(ids, {"reasoning_content": item.text}))
            elif isinstance(item, TurnDone):
                yield R.sse(R.chat_chunk(ids, {}, R.finish_reason(item)))
                if job.request.include_usage:
                    yield R.sse(R.usage_chunk(ids, "chat.completion.chunk", item))
                yield R.SSE_DONE
                return
            elif isinstance(item, EngineError):
                yield R.sse(R.error_body(item.message))
                yield R.SSE_DONE
                return
    finally:
        job.cancel.set()  # a no-op after a normal end; stops the engine when the client went away


async def _completion_stream(job: Job, ids: R.Ids) -> AsyncIterator[str]:
    try:
        while True:
            item = await job.items.get()
            if isinstance(item, TokenDelta):
                yield R.sse(R.completion_chunk(ids, item.text))
            elif isinstance(item, TurnDone):
                yield R.sse(R.completion_chunk(ids, "", R.finish_reason(item)))
                if job.request.include_usage:
                    yield R.sse(R.usage_chunk(ids, "text_completion", item))
                yield R.SSE_DONE
                return
            elif isinstance(item, EngineError):
                yield R.sse(R.error_body(item.message))
                yield R.SSE_DONE
                return
    finally:
        job.cancel.set()
