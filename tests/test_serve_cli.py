"""`qwenlocal serve` as a user runs it: a real subprocess on loopback, with an API key."""
from __future__ import annotations

from pathlib import Path
import signal
import subprocess
import sys

import httpx
import openai
import pytest

from qwenlocal.app.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parent))  # serve_support sits beside this file
from serve_support import HI, free_port, openai_client, wait_for  # noqa: E402


def test_serve_subprocess_with_api_key(tiny_ckpt):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "qwenlocal.app.cli", "serve", "--model", str(tiny_ckpt),
                             "--model-name", "tiny-cli", "--port", str(port), "--api-key", "k3y", "--device", "cpu",
                             "--queue", "2", "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(url + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return proc.poll() is not None  # died: stop waiting
    try:
        assert wait_for(up, timeout=60, every=0.2) and proc.poll() is None
        with pytest.raises(openai.AuthenticationError):
            openai_client(url, "nope").models.list()
        client = openai_client(url, "k3y")
        assert [m.id for m in client.models.list().data] == ["tiny-cli"]
        r = client.chat.completions.create(model="tiny-cli", messages=HI, max_tokens=3, temperature=0)
        assert r.usage.completion_tokens == 3 and r.choices[0].finish_reason == "length"
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    assert proc.returncode == 0, err  # Ctrl-C is the normal way to stop a server
    assert "stopped" in err and f"serving on http://127.0.0.1:{port}/v1" in err
    assert "auth: API key" in err and "WARNING" not in err


def test_exposed_without_key_warns_loudly_before_anything(capsys, tmp_path):
    # The model is missing, so it stops before binding anything: the warning must already be out.
    assert main(["serve", "--host", "0.0.0.0", "--model", str(tmp_path / "missing")]) == 1
    err = capsys.readouterr().err
    assert "WARNING: serving on 0.0.0.0 with NO API KEY" in err and "serving on http" not in err


@pytest.mark.parametrize("argv,msg", [(["--queue", "-1"], "--queue"), (["--port", "0"], "--port"),
                                      (["--api-key", " "], "--api-key is empty")])
def test_bad_flags(capsys, argv, msg):
    assert main(["serve", *argv]) == 1
    assert msg in capsys.readouterr().err


def test_port_in_use_is_reported_before_loading(capsys, tiny_ckpt):
    from qwenlocal.app.serve.launch import bind

    taken = bind("127.0.0.1", 0)
    taken.listen()
    try:
        port = taken.getsockname()[1]
        assert main(["serve", "--model", str(tiny_ckpt), "--port", str(port), "--device", "cpu"]) == 1
    finally:
        taken.close()
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err and "loading" not in err
