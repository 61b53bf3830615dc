"""A tiny Chrome DevTools Protocol client (aiohttp websockets) for driving headless Chromium in tests.

textual-serve draws the terminal on a canvas, so the page's text is not in the DOM; `SCREEN_HOOK` records what
the page's websocket delivers to the terminal (the text it draws), which `screen_text` returns without escapes.
"""
from __future__ import annotations

import asyncio
import base64
import json
import re
import shutil
import subprocess
import time
from pathlib import Path

SCREEN_HOOK = """
(() => {
  const Native = window.WebSocket;
  window.__screen = [];
  window.WebSocket = class extends Native {
    constructor(...args) {
      super(...args);
      const decoder = new TextDecoder();
      this.addEventListener("message", (e) => {
        if (typeof e.data !== "string") window.__screen.push(decoder.decode(e.data, {stream: true}));
      });
    }
  };
})();
"""
_ESCAPES = re.compile(r"\x1b\[[0-9;?<>=]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(\x07|\x1b\\)|\x1b[@-Z\\-_]")


def find_chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def launch(binary: str, profile: Path) -> tuple[subprocess.Popen, str]:
    """Headless Chromium with a DevTools port of its own choosing; returns (process, browser websocket URL)."""
    proc = subprocess.Popen([binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                             "--remote-debugging-port=0", f"--user-data-dir={profile}", "--window-size=1280,800",
                             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line and proc.poll() is not None:
            break
        match = re.search(r"DevTools listening on (ws://\S+)", line)
        if match:
            return proc, match.group(1)
    proc.kill()
    raise RuntimeError("chromium did not start its DevTools endpoint")


class Browser:
    def __init__(self, ws) -> None:
        self.ws = ws
        self._next = 0
        self._pending: dict[int, asyncio.Future] = {}
        self._reader = asyncio.ensure_future(self._read())

    @classmethod
    async def connect(cls, session, url: str) -> "Browser":
        return cls(await session.ws_connect(url, max_msg_size=0))

    async def _read(self) -> None:
        async for msg in self.ws:
            data = json.loads(msg.data)
            future = self._pending.pop(data.get("id"), None)
            if future is not None and not future.done():
                future.set_result(data)

    async def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self._next += 1
        future = asyncio.get_running_loop().create_future()
        self._pending[self._next] = future
        body = {"id": self._next, "method": method, "params": params or {}}
        if session:
            body["sessionId"] = session
        await self.ws.send_str(json.dumps(body))
        reply = await asyncio.wait_for(future, 30)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    async def open_tab(self, url: str) -> "Tab":
        target = (await self.send("Target.createTarget", {"url": "about:blank"}))["targetId"]
        session = (await self.send("Target.attachToTarget", {"targetId": target, "flatten": True}))["sessionId"]
        tab = Tab(self, session)
        await tab.call("Page.enable")
        await tab.call("Page.addScriptToEvaluateOnNewDocument", {"source": SCREEN_HOOK})
        await tab.call("Page.navigate", {"url": url})
        return tab


class Tab:
    def __init__(self, browser: Browser, session: str) -> None:
        self.browser, self.session = browser, session

    async def call(self, method: str, params: dict | None = None) -> dict:
        return await self.browser.send(method, params, self.session)

    async def evaluate(self, expression: str):
        result = await self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        return result.get("result", {}).get("value")

    async def screen_text(self) -> str:
        raw = await self.evaluate("(window.__screen || []).join('')") or ""
        return _ESCAPES.sub("", raw)

    async def wait_for_text(self, needle: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            text = await self.screen_text()
            if needle in text:
                return text
            if time.monotonic() > deadline:
                raise AssertionError(f"{needle!r} did not appear in the page within {timeout}s; it shows:\n"
                                     f"{text[-2000:]}")
            await asyncio.sleep(0.2)

    async def type_text(self, text: str) -> None:
        await self.evaluate("document.querySelector('.xterm-helper-textarea').focus()")
        await self.call("Input.insertText", {"text": text})

    async def press_enter(self) -> None:
        for kind in ("keyDown", "keyUp"):
            await self.call("Input.dispatchKeyEvent", {"type": kind, "key": "Enter", "code": "Enter",
                                                       "windowsVirtualKeyCode": 13, "text": "\r" if kind == "keyDown" else ""})

    async def screenshot(self, path: Path) -> None:
        data = (await self.call("Page.captureScreenshot", {"format": "png"}))["data"]
        path.write_bytes(base64.b64decode(data))
