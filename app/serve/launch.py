"""Putting a server together: the engine worker, the app, and uvicorn (in the foreground, or in a thread).

The thread launcher binds its own socket first, so a caller may ask for port 0 and learn the port before the
first request (tests and the load test use it); the CLI runs uvicorn in the main thread so Ctrl-C works.
"""
from __future__ import annotations

import ipaddress
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .worker import EngineWorker


def engine_worker(model_path: str | Path, device: str | None = None, max_waiting: int = 8,
                  options: dict | None = None) -> EngineWorker:
    """A started worker whose thread loads the engine (torch is imported there, not here)."""

    def load() -> Any:
        from qwenlocal.engine import Engine

        return Engine.from_pretrained(model_path, device=device, options=options or None)

    return EngineWorker(load, max_waiting=max_waiting).start()


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve anywhere, so treat it as exposed


def exposure_warning(host: str, api_key: str | None) -> str | None:
    """The loud warning for a server reachable from other machines with no key; None when there is no risk."""
    if is_loopback(host) or api_key:
        return None
    bar = "!" * 78
    return (f"{bar}\n!! WARNING: serving on {host} with NO API KEY.\n"
            "!! Anyone who can reach this machine's network can use the model and keep it busy.\n"
            "!! Add --api-key KEY, or bind to 127.0.0.1 (the default) and tunnel to it.\n"
            f"{bar}")


@dataclass
class ServerHandle:
    server: Any  # uvicorn.Server
    thread: threading.Thread
    host: str
    port: int

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def stop(self, timeout: float = 10.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # restart on the same port at once
    sock.bind((host.strip("[]"), port))
    return sock


def start_in_thread(app: Any, host: str = "127.0.0.1", port: int = 0, timeout: float = 20.0) -> ServerHandle:
    import uvicorn

    sock = bind(host, port)
    config = uvicorn.Config(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="qwenlocal-http", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the HTTP server did not start on {host}:{port}")
        time.sleep(0.02)
    return ServerHandle(server, thread, host, sock.getsockname()[1])


def serve_foreground(app: Any, sock: socket.socket, log_level: str = "info") -> None:
    """uvicorn in this (main) thread on an already bound socket, so Ctrl-C shuts it down gracefully."""
    import uvicorn

    uvicorn.Server(uvicorn.Config(app, log_level=log_level, lifespan="off", timeout_graceful_shutdown=3)).run(
        sockets=[sock])
