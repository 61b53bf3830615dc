"""Pilot tests of copying: one code block at a time (F8 / Shift+F8 move the highlight, Ctrl+L copies), the last
reply (Ctrl+B), and the message per clipboard path (a local tool confirmed the copy, it failed, there is none)."""
from __future__ import annotations

import shutil
import subprocess
import time

import pytest

from qwenlocal.app.chat.clipboard import CLIPBOARD_FILE
from qwenlocal.app.chat.copying import FOCUS_CLASS, code_blocks
from qwenlocal.app.chat.fake import ScriptedBackend, ScriptedReply
from qwenlocal.app.chat.panels import HelpScreen
from qwenlocal.app.chat.testing import make_app, send, wait_for, wait_ready, wait_turn

pytestmark = pytest.mark.anyio

PY_CODE = "def add(a, b):\n    return a + b"
SH_CODE = "pip install -e .\nqwenlocal chat --fake"
JSON_CODE = '{"ok": true}'
TWO_BLOCKS = (f"First the function:\n\n```python\n{PY_CODE}\n```\n\nThen run it:\n\n```bash\n{SH_CODE}\n```\n\n"
              "That is all.\n")
ONE_BLOCK = f"The config:\n\n```json\n{JSON_CODE}\n```\n"


@pytest.fixture
def anyio_backend():
    return "asyncio"  # Textual runs on asyncio


class FakeTools:
    """shutil.which and subprocess.run as seen by clipboard.py: `present` tools are on PATH, each run answers
    with `returncode` (and `stderr`), and every run is recorded."""

    def __init__(self, monkeypatch, present=(), returncode=0, stderr=b""):
        self.present, self.returncode, self.stderr = set(present), returncode, stderr
        self.runs: list[tuple[list[str], bytes]] = []
        real_which = shutil.which
        monkeypatch.setattr(shutil, "which", lambda name, *a, **k: f"/usr/bin/{name}" if name in self.present
                            else (None if name in ("wl-copy", "xclip", "xsel", "pbcopy", "clip.exe")
                                  else real_which(name, *a, **k)))
        monkeypatch.setattr(subprocess, "run", self.run)

    def run(self, argv, input=None, stderr=None, **kwargs):
        self.runs.append((list(argv), input))
        if self.stderr and stderr is not None:
            stderr.write(self.stderr)
        return subprocess.CompletedProcess(argv, self.returncode)


def notes(app) -> list[tuple[str, str]]:
    return [(n.title, n.message) for n in app._notifications]


async def press_and_note(pilot, key: str) -> tuple[str, str]:
    """Press a key and wait for the notification it brings (copying runs the tools off the UI thread)."""
    app = pilot.app
    before = len(app._notifications)
    await pilot.press(key)
    await wait_for(pilot, lambda: len(app._notifications) > before, what=f"the notification after {key}")
    return notes(app)[-1]


async def converse(pilot, turns: int) -> None:
    await wait_ready(pilot)
    for i in range(turns):
        await send(pilot, f"question {i}")
        await wait_turn(pilot)


def focused(app) -> list[str]:
    return [b.code for b in code_blocks(app.view) if b.has_class(FOCUS_CLASS)]


def highlighted_on_screen(app) -> list[str]:
    """The blocks drawn with the outline (on the Label that covers the fence) and scrolled into the view."""
    return [b.code for b in code_blocks(app.view)
            if b.query_one("#code-content").styles.outline.top[0] == "tall" and app.view.region.overlaps(b.region)]


async def test_each_code_block_is_focused_and_copied_alone(tmp_path, monkeypatch):
    tools = FakeTools(monkeypatch, present={"xclip"})
    app = make_app(tmp_path, ScriptedBackend([ScriptedReply(answer=TWO_BLOCKS), ScriptedReply(answer=ONE_BLOCK)]))
    async with app.run_test(size=(100, 30)) as pilot:
        await converse(pilot, 2)
        await wait_for(pilot, lambda: len(code_blocks(app.view)) == 3, what="three code blocks")
        # Newest first: the second reply's block, then the first reply's two, bottom up; then around again.
        for expected, title in ((JSON_CODE, "Code block 1 of 3 (json, 1 line"),
                                (SH_CODE, "Code block 2 of 3 (bash, 2 lines"),
                                (PY_CODE, "Code block 3 of 3 (python, 2 lines")):
            shown_title, shown = await press_and_note(pilot, "f8")
            assert shown_title.startswith(title) and "ctrl+l copies it" in shown
            assert focused(app) == [expected] == highlighted_on_screen(app)  # exactly one block highlighted
            assert await press_and_note(pilot, "ctrl+l") == (shown_title, "Copied %s (via xclip)." % (
                "1 line" if expected == JSON_CODE else "2 lines"))
            argv, sent = tools.runs[-1]
            assert argv == ["/usr/bin/xclip", "-selection", "clipboard", "-in"]
            assert sent == expected.encode() and app.clipboard == expected  # no fence lines, no language tag
        await press_and_note(pilot, "f8")
        assert focused(app) == [JSON_CODE]  # wrapped around to the newest
        await press_and_note(pilot, "shift+f8")
        assert focused(app) == [PY_CODE]  # and back, to the oldest
        await pilot.press("escape")
        assert focused(app) == []
        assert not (tmp_path / CLIPBOARD_FILE).exists()  # a confirmed copy needs no fallback file


async def test_copy_code_without_focus_takes_the_newest_and_whole_reply_stays(tmp_path, monkeypatch):
    tools = FakeTools(monkeypatch, present={"wl-copy", "xclip"})
    app = make_app(tmp_path, ScriptedBackend([ScriptedReply(answer=TWO_BLOCKS)]))
    async with app.run_test(size=(100, 30)) as pilot:
        await converse(pilot, 1)
        await wait_for(pilot, lambda: len(code_blocks(app.view)) == 2, what="two code blocks")
        title, message = await press_and_note(pilot, "ctrl+l")
        assert title.startswith("Code block 1 of 2 (bash") and message == "Copied 2 lines (via wl-copy)."
        assert focused(app) == [SH_CODE] and tools.runs[-1][1] == SH_CODE.encode()
        assert [argv[0] for argv, _ in tools.runs] == ["/usr/bin/wl-copy"]  # the first tool that worked, only
        title, message = await press_and_note(pilot, "ctrl+b")
        assert title == "The last reply" and message == f"Copied {len(TWO_BLOCKS.splitlines())} lines (via wl-copy)."
        assert app.clipboard == TWO_BLOCKS and tools.runs[-1][1] == TWO_BLOCKS.encode()
        await send(pilot, "/code")  # the slash command: the highlighted block again
        await wait_for(pilot, lambda: tools.runs[-1][1] == SH_CODE.encode(), what="/code's copy")
        assert app.clipboard == SH_CODE


async def test_without_a_clipboard_tool_the_message_says_osc52_and_where_the_file_is(tmp_path, monkeypatch):
    tools = FakeTools(monkeypatch, present=())
    app = make_app(tmp_path, ScriptedBackend([ScriptedReply(answer=TWO_BLOCKS)]))
    async with app.run_test(size=(100, 30)) as pilot:
        await converse(pilot, 1)
        await wait_for(pilot, lambda: len(code_blocks(app.view)) == 2, what="two code blocks")
        await press_and_note(pilot, "f8")
        await press_and_note(pilot, "f8")
        _, message = await press_and_note(pilot, "ctrl+l")
        path = tmp_path / CLIPBOARD_FILE  # the data folder (the conversations' parent)
        assert message.startswith("Sent 2 lines to the terminal clipboard (OSC 52; your terminal may ignore it")
        assert "No clipboard tool on PATH" in message and f"The text is also in {path}" in message
        assert "Copied" not in message  # nothing confirmed, nothing claimed
        assert path.read_text() == PY_CODE and app.clipboard == PY_CODE and tools.runs == []


async def test_a_failing_tool_is_named_and_the_file_is_the_fallback(tmp_path, monkeypatch):
    FakeTools(monkeypatch, present={"xclip"}, returncode=1, stderr=b"Error: Can't open display: (null)\n")
    app = make_app(tmp_path, ScriptedBackend([ScriptedReply(answer=ONE_BLOCK)]))
    async with app.run_test(size=(100, 30)) as pilot:
        await converse(pilot, 1)
        await wait_for(pilot, lambda: len(code_blocks(app.view)) == 1, what="the code block")
        _, message = await press_and_note(pilot, "ctrl+l")
        assert message.startswith("Sent 1 line to the terminal clipboard (OSC 52")
        assert "Failed: xclip (exit 1: Error: Can't open display: (null))." in message
        assert (tmp_path / CLIPBOARD_FILE).read_text() == JSON_CODE


async def test_a_real_tool_process_is_run_and_not_waited_on_past_its_exit(tmp_path, monkeypatch):
    """A clipboard tool on PATH, run for real: like xclip it leaves a child behind holding its descriptors."""
    bin_dir, out = tmp_path / "bin", tmp_path / "got.txt"
    bin_dir.mkdir()
    tool = bin_dir / "xsel"
    tool.write_text(f"#!/bin/sh\n/bin/cat > '{out}'\n(/bin/sleep 3 &)\nexit 0\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    app = make_app(tmp_path, ScriptedBackend([ScriptedReply(answer=ONE_BLOCK)]))
    async with app.run_test(size=(100, 30)) as pilot:
        await converse(pilot, 1)
        await wait_for(pilot, lambda: len(code_blocks(app.view)) == 1, what="the code block")
        t0 = time.perf_counter()
        _, message = await press_and_note(pilot, "ctrl+l")
        assert time.perf_counter() - t0 < 2.5 and message == "Copied 1 line (via xsel)."
        assert out.read_text() == JSON_CODE


async def test_no_code_block_says_so_and_f1_lists_the_keys(tmp_path, monkeypatch):
    tools = FakeTools(monkeypatch, present={"xclip"})
    app = make_app(tmp_path, ScriptedBackend([ScriptedReply(answer="Plain words, **no** code.")]))
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_ready(pilot)
        assert await press_and_note(pilot, "ctrl+l") == (
            "", "No code block to copy: none of the finished replies has one.")
        await converse(pilot, 1)
        for key in ("ctrl+l", "f8"):
            assert (await press_and_note(pilot, key))[1] == "No code block to copy: none of the finished replies has one."
        assert tools.runs == [] and focused(app) == []
        await pilot.press("f1")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
        help_text = app.screen.query_one("Markdown").source
        for key, bid in (("f8", "chat.code_next"), ("shift+f8", "chat.code_prev"), ("ctrl+l", "chat.copy_code")):
            assert f"`{key}` — " in help_text and f"*({bid})*" in help_text


def test_a_tool_that_does_not_answer_is_given_up_and_named(tmp_path, monkeypatch):
    from qwenlocal.app.chat.clipboard import TOOL_TIMEOUT_S, copy_locally

    def hang(argv, **kwargs):  # subprocess.run kills the child itself when the timeout passes
        raise subprocess.TimeoutExpired(argv, kwargs["timeout"])

    FakeTools(monkeypatch, present={"xsel"})
    monkeypatch.setattr(subprocess, "run", hang)
    outcome = copy_locally("x = 1", tmp_path)
    assert outcome.tool == "" and outcome.failures == [f"xsel (no answer in {TOOL_TIMEOUT_S:g} s)"]
    assert outcome.saved_to == tmp_path / CLIPBOARD_FILE and outcome.saved_to.read_text() == "x = 1"
    assert "Failed: xsel (no answer in 3 s)." in outcome.message() and "Copied" not in outcome.message()
