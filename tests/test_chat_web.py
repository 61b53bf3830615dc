"""`qwenlocal chat --web`: option checks, the page's key, and the whole thing in headless Chromium.

The browser test runs the real command on the built-in demo model as a subprocess, types into the page, reads
the reply back from it, opens a second tab (which must not load a second model), then sends Ctrl+C (SIGINT)
and checks that no process of the command's session is left.
"""
from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from qwenlocal.app.cli import main
from qwenlocal.app.serve.webfront import basic_auth_ok, tab_command

sys.path.insert(0, str(Path(__file__).resolve().parent))  # cdp_support sits beside this file
from cdp_support import Browser, find_chromium, launch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_non_loopback_host_needs_a_key(capsys):
    assert main(["chat", "--web", "--no-browser", "--host", "0.0.0.0"]) == 1
    assert "--api-key" in capsys.readouterr().err


def test_port_in_use_is_reported_before_loading(capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        started = time.monotonic()
        assert main(["chat", "--web", "--no-browser", "--port", str(port)]) == 1
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err and "--port" in err
    assert "loading" not in err and time.monotonic() - started < 5


def test_web_flags_without_web_are_refused(capsys):
    assert main(["chat", "--no-browser"]) == 1
    assert "--no-browser is for --web" in capsys.readouterr().err


def test_basic_auth_checks_the_password():
    def header(user_password: str) -> str:
        return "Basic " + base64.b64encode(user_password.encode()).decode()

    assert basic_auth_ok(header("anyone:s3cret"), "s3cret")
    assert not basic_auth_ok(header("anyone:wrong"), "s3cret")
    assert not basic_auth_ok("Bearer s3cret", "s3cret")
    assert not basic_auth_ok("Basic !!notbase64", "s3cret")


def test_tab_command_is_an_endpoint_client():
    command = tab_command("http://127.0.0.1:9/v1", "demo-tiny", ["--seed", "1"])
    assert "chat --endpoint http://127.0.0.1:9/v1 --model demo-tiny --seed 1" in command
    assert command.startswith("exec ")  # no shell left as a parent of the tab's chat


# --- the real thing, in a browser ---------------------------------------------------------------------------


def _session_pids(sid: int) -> list[int]:
    """Live processes of session `sid` (the command runs in a session of its own)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[3]) == sid:
            out.append(int(entry.name))
    return out


def _loads_torch(pid: int) -> bool:
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def _read_until_url(proc: subprocess.Popen, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith("chat in the browser:"):
            return line
        if not line and proc.poll() is not None:
            break
    raise AssertionError(f"`qwenlocal chat --web` did not print its URL; stderr:\n{proc.stderr.read()}")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc for the process tree")
def test_browser_chat_two_tabs_one_engine_and_ctrl_c(tmp_path):
    chromium = find_chromium()
    if chromium is None:
        pytest.skip("chromium is not installed (apt-get install chromium; .ci/run installs it where apt works)")
    home = tmp_path / "home"
    env = {**os.environ, "QWENLOCAL_HOME": str(home), "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-m", "qwenlocal.app.cli", "chat", "--web", "--no-browser", "--port",
                             "0", "--seed", "1", "--max-tokens", "32", "--no-think", "--device", "cpu"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
                            start_new_session=True)
    browser_proc = None
    try:
        line = _read_until_url(proc, 60)
        url = re.search(r"(http://\S+/)\s", line).group(1)
        engine = re.search(r"on (http://\S+)/v1", line).group(1)
        browser_proc, devtools = launch(chromium, tmp_path / "profile")
        shot = Path(os.environ.get("QWENLOCAL_WEB_SCREENSHOT", tmp_path / "web-chat.png"))
        asyncio.run(_drive(devtools, url, engine, home, shot, proc.pid))
        # Ctrl+C: the command stops its tabs and the engine, and exits; nothing of its session is left.
        os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(20) == 0
        deadline = time.monotonic() + 10
        while _session_pids(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _session_pids(proc.pid) == []
        assert "stopped" in proc.stderr.read()
    finally:
        if browser_proc is not None:
            browser_proc.kill()
            browser_proc.wait()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


async def _drive(devtools: str, url: str, engine: str, home: Path, shot: Path, main_pid: int) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as http:
        browser = await Browser.connect(http, devtools)
        tab = await browser.open_tab(url)
        await tab.wait_for_text("demo-tiny", 40)  # the header's model label: the tab's chat reached the engine
        await asyncio.sleep(0.5)
        await tab.type_text("hello from the browser")
        await tab.press_enter()
        reply = await _saved_reply(home, 40)
        words = [w for w in re.findall(r"\w{4,}", reply)][:6]
        assert words, f"the demo reply has no word to look for: {reply!r}"
        page = await tab.wait_for_text("hello from the browser", 10)
        deadline = time.monotonic() + 10
        while not all(w in page for w in words) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            page = await tab.screen_text()
        assert all(w in page for w in words), f"reply words {words} not all in the page:\n{page[-2000:]}"
        await asyncio.sleep(0.5)
        shot.parent.mkdir(parents=True, exist_ok=True)
        await tab.screenshot(shot)

        second = await browser.open_tab(url)  # while the first is open
        await second.wait_for_text("demo-tiny", 40)
        async with httpx.AsyncClient() as client:
            health = (await client.get(f"{engine}/health")).json()
            models = (await client.get(f"{engine}/v1/models")).json()["data"]
        assert health["status"] == "ok" and health["counters"]["completed"] == 1
        assert [m["id"] for m in models] == ["demo-tiny"]
        # One loaded model: only the command's own process has torch; both tabs' chats are clients.
        pids = _session_pids(main_pid)
        clients = [p for p in pids if p != main_pid and "--endpoint" in _cmdline(p)]
        assert len(clients) == 2, [(p, _cmdline(p)) for p in pids]
        assert _loads_torch(main_pid) and not any(_loads_torch(p) for p in clients)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


async def _saved_reply(home: Path, timeout: float) -> str:
    """The assistant's reply as the chat saved it (the page is then checked for it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for path in (home / "data" / "conversations").glob("*.json"):
            try:
                messages = json.loads(path.read_text())["messages"]
            except (OSError, ValueError, KeyError):
                continue
            done = [m["content"] for m in messages if m.get("role") == "assistant" and m.get("content")]
            if done:
                return done[-1]
        await asyncio.sleep(0.2)
    raise AssertionError("no reply was saved within the timeout")


def test_model_that_does_not_fit_leaves_nothing_started(monkeypatch, capsys):
    from qwenlocal.app import models
    from qwenlocal.engine.errors import ResourceError

    def unfit(ref, **kwargs):
        raise ResourceError("the model needs 40 GiB of RAM and this machine has 16 GiB: pick a smaller one")

    monkeypatch.setattr(models, "resolve_model", unfit)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    threads = {t.name for t in threading.enumerate()}
    assert main(["chat", "--web", "--no-browser", "--port", str(port), "--model", "big"]) == 1
    assert "pick a smaller one" in capsys.readouterr().err
    assert {t.name for t in threading.enumerate()} <= threads  # no engine or HTTP thread left running
    with socket.socket() as again:  # and the page's port was released
        again.bind(("127.0.0.1", port))


def test_browser_that_does_not_open_is_reported(monkeypatch, capsys):
    import webbrowser

    from qwenlocal.app.commands import chat_web

    monkeypatch.setattr(webbrowser, "open", lambda url, new=0: False)
    chat_web.open_browser("http://127.0.0.1:8765/")
    deadline = time.monotonic() + 5
    while "qwenlocal-browser" in {t.name for t in threading.enumerate()} and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "could not open a browser here; open http://127.0.0.1:8765/ yourself" in capsys.readouterr().err


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc for the process tree")
def test_exposed_page_asks_for_the_key_and_keeps_it_out_of_the_url(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text("s3cret\n")
    env = {**os.environ, "QWENLOCAL_HOME": str(tmp_path / "home")}
    proc = subprocess.Popen([sys.executable, "-m", "qwenlocal.app.cli", "chat", "--web", "--no-browser", "--host",
                             "0.0.0.0", "--api-key-file", str(key_file), "--port", "0", "--device", "cpu"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
                            start_new_session=True)
    try:
        line = _read_until_url(proc, 60)
        url = re.search(r"(http://\S+/)\s", line).group(1)
        assert "s3cret" not in line and "password: the API key" in line
        for path in ("", "ws", "static/js/textual.js"):
            refused = httpx.get(url + path)
            assert refused.status_code == 401 and "Basic" in refused.headers["www-authenticate"]
        assert httpx.get(url, auth=("me", "wrong")).status_code == 401
        page = httpx.get(url, auth=("me", "s3cret"))
        assert page.status_code == 200 and "s3cret" not in page.text
        os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
