"""The browser front end of `qwenlocal chat --web`: textual-serve runs one chat process per tab.

Each tab's process is the chat in client mode (`--endpoint` to the one engine server), so tabs never load a
model. Over textual-serve this adds: an already bound socket (a port in use is reported before any loading),
HTTP Basic auth when an API key is set (the browser sends it in a header; the page URL holds no secret), and a
shutdown that stops every tab's process before returning. textual-serve and aiohttp are imported lazily.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import socket
import sys
from typing import Callable

TAB_STOP_TIMEOUT_S = 5.0  # each tab's chat gets this long to quit on its own before it is killed


def tab_command(endpoint: str, model_id: str, chat_args: list[str]) -> str:
    """The shell command textual-serve runs per tab. `exec` so the shell does not linger as a parent."""
    argv = [sys.executable, "-m", "qwenlocal.app.cli", "chat", "--endpoint", endpoint, "--model", model_id,
            *chat_args]
    if sys.platform == "win32":
        import subprocess

        return subprocess.list2cmdline(argv)
    import shlex

    return "exec " + shlex.join(argv)


def basic_auth_ok(header: str, api_key: str) -> bool:
    """True when `Authorization: Basic ...` carries the key as its password (any user name)."""
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "basic":
        return False
    try:
        _, _, password = base64.b64decode(token.strip(), validate=True).decode("utf-8").partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return False
    return hmac.compare_digest(password.encode(), api_key.encode())


def make_front_end(command: str, title: str, api_key: str | None, on_ready: Callable[[], None]):
    """A textual-serve Server subclass instance for `command`; `on_ready` runs once the site listens."""
    from aiohttp import web
    from textual_serve.server import Server

    class ChatFrontEnd(Server):
        def __init__(self) -> None:
            super().__init__(command, title=title)
            self.tabs: set[asyncio.Task] = set()

        async def _make_app(self) -> web.Application:
            app = await super()._make_app()
            if api_key:
                app.middlewares.append(require_key)
            return app

        async def handle_index(self, request: web.Request):
            # The page holds absolute ws:// URLs: build them from the address the browser used.
            self.public_url = f"{request.scheme}://{request.host}"
            return await super().handle_index(request)

        async def handle_websocket(self, request: web.Request):
            task = asyncio.current_task()
            self.tabs.add(task)
            try:
                return await super().handle_websocket(request)
            finally:
                self.tabs.discard(task)

        async def on_startup(self, app: web.Application) -> None:
            on_ready()

        async def on_shutdown(self, app: web.Application) -> None:
            # Cancelling a tab's handler makes textual-serve send its chat "quit" and wait for the exit.
            tabs = list(self.tabs)
            for task in tabs:
                task.cancel()
            if tabs:
                await asyncio.wait(tabs, timeout=TAB_STOP_TIMEOUT_S)

    @web.middleware
    async def require_key(request: web.Request, handler):
        if not basic_auth_ok(request.headers.get("Authorization", ""), api_key or ""):
            raise web.HTTPUnauthorized(text="this chat needs the API key it was started with (as the password)",
                                       headers={"WWW-Authenticate": 'Basic realm="qwenlocal chat"'})
        return await handler(request)

    return ChatFrontEnd()


def run_front_end(front, sock: socket.socket) -> None:
    """Serve in this (main) thread until SIGINT/SIGTERM; returns after every tab's process has stopped."""
    from aiohttp import web

    web.run_app(front._make_app(), sock=sock, handle_signals=True, print=None, shutdown_timeout=2 * TAB_STOP_TIMEOUT_S,
                access_log=None)
