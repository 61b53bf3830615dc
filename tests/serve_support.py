"""Helpers for the serve tests: a real `qwenlocal serve` app (engine thread + FastAPI + uvicorn) on loopback."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import httpx

from qwenlocal.app.serve.launch import ServerHandle, bind, engine_worker, start_in_thread
from qwenlocal.app.serve.server import create_app
from qwenlocal.app.serve.worker import EngineWorker

MODEL = "tiny"
HI = [{"role": "user", "content": "hi"}]
# Plain sampling over the whole vocabulary, so a seed alone decides the reply.
FREE = {"temperature": 1.0, "top_p": 1.0}


@dataclass
class Served:
    worker: EngineWorker
    handle: ServerHandle

    @property
    def url(self) -> str:
        return self.handle.url

    def health(self) -> dict:
        return httpx.get(self.url + "/health", timeout=10).json()

    def stop(self) -> None:
        self.handle.stop()
        self.worker.close()


def serve(ckpt, api_key: str | None = None, max_waiting: int = 4) -> Served:
    worker = engine_worker(ckpt, device="cpu", max_waiting=max_waiting)
    worker.wait_ready(60)
    return Served(worker, start_in_thread(create_app(worker, MODEL, api_key)))


def extra_app(served: Served, api_key: str | None = None, port: int = 0) -> ServerHandle:
    """Another HTTP front (e.g. with a key) over the same engine worker: no second engine to load."""
    return start_in_thread(create_app(served.worker, MODEL, api_key), port=port)


def free_port() -> int:
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    sock.close()
    return port


def openai_client(url: str, api_key: str = "none"):
    import openai

    return openai.OpenAI(base_url=url + "/v1", api_key=api_key, max_retries=0, timeout=60)


def wait_for(check: Callable[[], Any], timeout: float = 10.0, every: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(every)


def find_long_seed(client, tokens: int = 64) -> int:
    """A seed whose reply (random tiny weights, no thinking) runs `tokens` tokens without an EOS: a test that
    cancels a reply mid-stream must not see it end on its own first (unseeded, it did now and then)."""
    for seed in range(1, 60):
        r = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=tokens, seed=seed,
                                           extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        if r.choices[0].finish_reason == "length":
            return seed
    raise AssertionError("no seed in 1..59 runs without an EOS; widen the search")


def find_split_seed(client, max_tokens: int = 24) -> tuple[int, Any]:
    """A seed whose reply (random tiny weights) closes its thought: reasoning and answer both non-empty."""
    for seed in [25, 20, 38, *range(40, 70)]:
        r = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=max_tokens, seed=seed,
                                           extra_body={"top_k": 0}, **FREE)
        msg = r.choices[0].message
        if msg.content and getattr(msg, "reasoning_content", None):
            return seed, r
    raise AssertionError("no seed in the list closes its thought; widen the search")
