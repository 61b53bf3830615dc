"""Putting text on the clipboard, and saying only what can be confirmed. No Textual here.

Textual's copy_to_clipboard sends OSC 52, which many terminals ignore (tmux passes it on only with
`set-clipboard on`), and nothing comes back to say whether it arrived. So a local clipboard tool on PATH is tried
as well: its exit status confirms the copy. Without a confirmed copy the text is also written to a file in the
data folder, and the message says where: there is always a way to get at it.
"""
from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .store import atomic_write_text

TOOL_TIMEOUT_S = 3.0
CLIPBOARD_FILE = "clipboard.txt"
# Tried in this order; the first that exits 0 holds the text. Each fails fast where its clipboard is out of reach
# (wl-copy without a Wayland session, xclip/xsel without an X display), and the next one is tried.
TOOLS: tuple[tuple[str, ...], ...] = (
    ("wl-copy",),
    ("xclip", "-selection", "clipboard", "-in"),
    ("xsel", "--clipboard", "--input"),
    ("pbcopy",),
    ("clip.exe",),
)


@dataclass
class CopyOutcome:
    text: str
    tool: str = ""  # the local tool that confirmed the copy; "" if none did
    failures: list[str] = field(default_factory=list)  # tools found on PATH that failed, and why
    saved_to: Path | None = None  # the fallback file, when no tool confirmed the copy
    save_error: str = ""

    def message(self) -> str:
        lines = line_count(self.text)
        if self.tool:
            return f"Copied {lines} (via {self.tool})."
        parts = [f"Sent {lines} to the terminal clipboard (OSC 52; your terminal may ignore it, "
                 "and tmux passes it on only with set-clipboard on)."]
        if self.failures:
            parts.append("Failed: " + "; ".join(self.failures) + ".")
        else:
            parts.append("No clipboard tool on PATH (wl-copy, xclip, xsel, pbcopy, clip.exe).")
        if self.saved_to:
            parts.append(f"The text is also in {self.saved_to}")
        elif self.save_error:
            parts.append(f"Could not write the fallback file: {self.save_error}")
        return " ".join(parts)


def line_count(text: str) -> str:
    n = len(text.splitlines()) or 1
    return f"{n} line{'s' if n != 1 else ''}"


def _encode(tool: str, text: str) -> bytes:
    # clip.exe reads the console's code page (mangling non-ASCII UTF-8) unless the input is UTF-16 with a BOM.
    return ("\ufeff" + text).encode("utf-16-le") if tool == "clip.exe" else text.encode("utf-8")


def run_tool(exe: str, argv: tuple[str, ...], text: str) -> str | None:
    """Run one clipboard tool (exe: its path; argv: TOOLS' entry) on the text; None if it confirmed the copy,
    else why not."""
    # stderr goes to a file, not a pipe: xclip and wl-copy fork a child that keeps serving the selection with the
    # parent's descriptors, and reading a pipe to its end would wait for that child.
    with tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.run([exe, *argv[1:]], input=_encode(argv[0], text), stdout=subprocess.DEVNULL,
                                  stderr=err, timeout=TOOL_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            return f"no answer in {TOOL_TIMEOUT_S:g} s"
        except OSError as exc:
            return str(exc)
        if proc.returncode == 0:
            return None
        err.seek(0)
        detail = err.read(300).decode("utf-8", "replace").strip().splitlines()
        return f"exit {proc.returncode}" + (f": {detail[0]}" if detail else "")


def copy_locally(text: str, fallback_dir: Path) -> CopyOutcome:
    """Try the clipboard tools on PATH in turn; without a confirmed copy, write the text to the fallback file.
    Blocking (subprocesses, a file): run it off the UI thread."""
    outcome = CopyOutcome(text)
    for argv in TOOLS:
        exe = shutil.which(argv[0])
        if exe is None:
            continue
        problem = run_tool(exe, argv, text)
        if problem is None:
            outcome.tool = argv[0]
            return outcome
        outcome.failures.append(f"{argv[0]} ({problem})")
    path = fallback_dir / CLIPBOARD_FILE
    try:
        atomic_write_text(path, text)
        outcome.saved_to = path
    except OSError as exc:
        outcome.save_error = str(exc)
    return outcome
