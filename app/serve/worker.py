"""The engine thread: it loads the engine, owns it, and runs one generation at a time from a bounded queue.

HTTP handlers never touch the engine: they submit a Job and read its items from an asyncio queue, fed from
this thread with `call_soon_threadsafe`. The engine refuses concurrent use, so a single consumer thread is
the simplest correct schedule; admission is counted here so a full queue is refused at once (429) instead of
piling up requests that would time out. Stop strings are matched here, next to the engine, so a stop sets the
cancel event within the same decode step that produced it.
"""
from __future__ import annotations

import asyncio
import queue
import threading
from dataclasses import dataclass, replace
from typing import Any, Callable

from qwenlocal.engine.errors import QwenlocalError
from qwenlocal.engine.events import EngineError, ReasoningDelta, TokenDelta, TurnDone

from .protocol import ChatRequest, CompletionRequest
from .stops import StopMatcher


@dataclass(frozen=True)
class Started:
    """The request passed the engine's own checks and generation began (the HTTP status can now be 200)."""


@dataclass(frozen=True)
class Rejected:
    """The engine refused the request before any work (bad option, prompt past the context): a 400."""

    error: QwenlocalError


class QueueFull(Exception):
    pass


class NotReady(Exception):
    pass


class Job:
    def __init__(self, request: ChatRequest | CompletionRequest, loop: asyncio.AbstractEventLoop):
        self.request = request
        self.cancel = threading.Event()  # set by a disconnect, a stop string, or shutdown
        self.items: asyncio.Queue = asyncio.Queue()
        self._loop = loop

    def post(self, item: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(self.items.put_nowait, item)
        except RuntimeError:  # the event loop is closed (server shut down): nobody will read, so stop
            self.cancel.set()


class EngineWorker:
    def __init__(self, load: Callable[[], Any], max_waiting: int = 8):
        self.max_waiting = max_waiting  # requests allowed to wait behind the running one
        self.info: dict = {}
        self.counters = {"requests": 0, "completed": 0, "cancelled": 0, "rejected_full": 0,
                         "rejected_invalid": 0, "failed": 0}
        self.last: dict = {}
        self.engine: Any = None  # touched only by the engine thread
        self._load = load
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self._inflight = 0
        self._running: Job | None = None
        self._ready = threading.Event()
        self._load_error: BaseException | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._main, name="qwenlocal-engine", daemon=True)

    def start(self) -> "EngineWorker":
        self._thread.start()
        return self

    def wait_ready(self, timeout: float | None = None) -> None:
        """Block until the engine is loaded; re-raise its load error here, on the caller's thread."""
        if not self._ready.wait(timeout):
            raise TimeoutError("the engine did not finish loading in time")
        if self._load_error is not None:
            raise self._load_error

    @property
    def ready(self) -> bool:
        return self._ready.is_set() and self._load_error is None and not self._closed

    def submit(self, job: Job) -> None:
        with self._lock:
            if not self.ready:
                raise NotReady("the engine is not ready (still loading, failed to load, or shutting down)")
            if self._inflight >= 1 + self.max_waiting:
                self.counters["rejected_full"] += 1
                raise QueueFull(f"the server is busy: one generation is running and {self.max_waiting} "
                                f"request(s) are waiting, which is all the queue holds (--queue {self.max_waiting})")
            self._inflight += 1
            self.counters["requests"] += 1
        self._jobs.put(job)

    def snapshot(self) -> dict:
        with self._lock:
            running = 1 if self._running is not None else 0
            return {"running": running, "waiting": self._inflight - running, "max_waiting": self.max_waiting,
                    "counters": dict(self.counters), "last": dict(self.last)}

    def close(self, timeout: float = 5.0) -> None:
        with self._lock:
            self._closed = True
            if self._running is not None:
                self._running.cancel.set()
        self._jobs.put(None)
        self._thread.join(timeout)

    # --- the engine thread ---------------------------------------------------------------------------------

    def _main(self) -> None:
        try:
            self.engine = self._load()
            self.info = {"max_context": getattr(self.engine, "max_context", None),
                         "device": str(getattr(self.engine, "device", ""))}
        except BaseException as exc:  # handed to wait_ready's caller, which reports it
            self._load_error = exc
            self._ready.set()
            return
        self._ready.set()
        while (job := self._jobs.get()) is not None:
            with self._lock:
                self._running = job
                if self._closed:
                    job.cancel.set()
            try:
                self._serve(job)
            except Exception as exc:  # never let one request kill the engine thread
                self._count("failed")
                job.post(EngineError(f"the server failed on this request: {exc!r}", type(exc).__name__))
            finally:
                with self._lock:
                    self._running = None
                    self._inflight -= 1
        self.engine = None
        self._drain()

    def _drain(self) -> None:
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                job.post(EngineError("the server is shutting down", "ShuttingDown"))

    def _count(self, key: str) -> None:
        with self._lock:
            self.counters[key] += 1

    def _serve(self, job: Job) -> None:
        if job.cancel.is_set():  # the client left while waiting in the queue: no work at all
            self._count("cancelled")
            job.post(TurnDone("cancelled", 0, 0, "", ""))
            return
        req = job.request
        try:
            if isinstance(req, ChatRequest):
                events = self.engine.chat(list(req.messages), dict(req.sampling),
                                          enable_thinking=req.enable_thinking, cancel=job.cancel)
            else:
                from .rawgen import raw_completion

                events = raw_completion(self.engine, req.prompt, req.sampling, job.cancel)
        except QwenlocalError as exc:
            self._count("rejected_invalid")
            job.post(Rejected(exc))
            return
        job.post(Started())
        try:
            self._pump(job, events)
        finally:
            close = getattr(events, "close", None)
            if close is not None:  # an unfinished generator holds the engine's busy lock until closed
                close()

    def _pump(self, job: Job, events) -> None:
        matcher = StopMatcher(job.request.stop)
        emitted: list[str] = []
        thought: list[str] = []
        for ev in events:
            if isinstance(ev, TokenDelta):
                out = matcher.push(ev.text)
                if out:
                    emitted.append(out)
                    job.post(TokenDelta(out))
                if matcher.stopped:
                    job.cancel.set()  # the engine stops within one decode step; its TurnDone still comes
            elif isinstance(ev, ReasoningDelta):
                if not matcher.stopped:
                    thought.append(ev.text)
                    job.post(ev)
            elif isinstance(ev, TurnDone):
                tail = matcher.flush()
                if tail:
                    emitted.append(tail)
                    job.post(TokenDelta(tail))
                finish = "stop" if matcher.stopped else ev.finish_reason
                self._count("cancelled" if finish == "cancelled" else "completed")
                with self._lock:
                    self.last = {"finish_reason": finish, "engine_finish_reason": ev.finish_reason,
                                 "prompt_tokens": ev.prompt_tokens, "completion_tokens": ev.completion_tokens}
                job.post(replace(ev, finish_reason=finish, text="".join(emitted), reasoning="".join(thought)))
                return
            elif isinstance(ev, EngineError):
                self._count("failed")
                job.post(ev)
                return
        self._count("failed")
        job.post(EngineError("the engine ended the reply without a final event", "ProtocolError"))
