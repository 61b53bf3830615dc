"""A reader that stops early (`qwenlocal models --json | head -1`): the CLI ends quietly, nothing on stderr and
status 1 (Python's recipe, and what Rich's Console does for the table commands), instead of a BrokenPipeError
traceback. The real CLI, in a subprocess."""
import os
import subprocess
import sys

import pytest

from qwenlocal.app.cli import EXIT_BROKEN_PIPE


def _env(home, *, unbuffered: bool) -> dict:
    env = dict(os.environ, QWENLOCAL_HOME=str(home), HF_HUB_CACHE=str(home / "hf"))
    env.pop("PYTHONUNBUFFERED", None)
    if unbuffered:  # every write goes out at once: the pipe breaks in the middle of a command's output
        env["PYTHONUNBUFFERED"] = "1"
    return env  # else small outputs are only written by the final flush, at exit


def _cli(*args) -> list[str]:
    return [sys.executable, "-m", "qwenlocal.app.cli", *args]


@pytest.fixture(scope="module")
def crowded_home(tmp_path_factory):
    """300 half-downloaded checkpoints: `models` then prints ~120 kB, more than a pipe holds (64 kB), so the
    command is still writing when the reader closes after its first line."""
    home = tmp_path_factory.mktemp("home")
    for i in range(300):
        folder = home / "data" / "models" / f"model-{i:03d}"
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
    return home


@pytest.mark.parametrize("unbuffered", [False, True], ids=["buffered", "unbuffered"])
@pytest.mark.parametrize("args", [("models", "--json"), ("models",)], ids=["json", "table"])
def test_reader_closing_after_one_line_ends_quietly(crowded_home, args, unbuffered):
    # Unbuffered reads: this side takes only the first line out of the pipe, nothing more.
    proc = subprocess.Popen(_cli(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0,
                            env=_env(crowded_home, unbuffered=unbuffered))
    first = proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == EXIT_BROKEN_PIPE, err
    assert first.strip() == (b"{" if "--json" in args else b"Models (name = what --model takes)")
    assert err == ""  # no traceback, no "Exception ignored" from the interpreter's final flush


@pytest.mark.parametrize("args", [("models", "--json"), ("download", "--list"), ("--help",)],
                         ids=["models-json", "download-list", "help"])
def test_reader_gone_before_any_output_ends_quietly(tmp_path, args):
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the command writes: every write to stdout fails
    try:
        out = subprocess.run(_cli(*args), stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120,
                             env=_env(tmp_path, unbuffered=False))
    finally:
        os.close(write_end)
    assert out.returncode == EXIT_BROKEN_PIPE, out.stderr
    assert out.stderr == ""


def test_output_read_to_the_end_still_exits_zero(tmp_path):
    out = subprocess.run(_cli("models", "--json"), capture_output=True, text=True, timeout=120,
                         env=_env(tmp_path, unbuffered=False))
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("{") and out.stdout.rstrip().endswith("}")
