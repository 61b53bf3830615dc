"""`qwenlocal chat --model NAME` for a known model that is not downloaded: say what the download would be
(size, where, the fit verdict), ask, then fetch it with `qwenlocal download`'s code before the chat starts.

Asks only on a terminal; elsewhere `--yes` decides. Refusals raise QwenlocalError (the CLI prints them), all
before anything is fetched. Names that are neither on disk nor known fail here too, before the TUI starts.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TextIO

from qwenlocal.engine.errors import OptionError


def ensure_model_on_disk(args: argparse.Namespace, stdin: TextIO | None = None, console=None) -> None:
    """Return once args.model can be loaded from disk (downloading it if the user agrees); raise otherwise."""
    from qwenlocal.app import hub
    from qwenlocal.app.models import resolve_model
    from qwenlocal.engine.registry import find_known, synthetic_name

    ref = (args.model or "").strip()
    if not ref or synthetic_name(ref) is not None or Path(ref).expanduser().is_dir():
        return
    repo_part, revision = hub.split_revision(ref)
    known = find_known(repo_part)
    if known is None:
        resolve_model(ref, check_fit=False)  # raises the clear error (it lists the known names) before the TUI
        return
    cached = hub.find_cached(known.repo_id, revision)
    if cached is not None and cached.complete:
        return
    _offer(args, known, revision, partial=cached is not None, stdin=stdin or sys.stdin, console=console)


def _offer(args, known, revision: str | None, *, partial: bool, stdin: TextIO, console) -> None:
    from rich.console import Console

    from qwenlocal.app import hub
    from qwenlocal.app.commands import thread_options
    from qwenlocal.app.commands.download import check_download_fit, fetch

    console = console or Console(stderr=True, soft_wrap=True, highlight=False)
    name = args.model.strip()
    what = known.repo_id + (f"@{revision}" if revision else "")
    interactive = _is_terminal(stdin)
    console.print(f"{name} ({what}, {known.expert_format.upper()} experts) is "
                  f"{'only partly downloaded' if partial else 'not downloaded yet'}.")
    # Exact bytes from the hub when we may go on; a refusal without --yes does not wait on the network.
    listing = hub.remote_listing(known.repo_id, revision) if (args.yes or interactive) else None
    remaining = listing.remaining_bytes if listing is not None else known.download_bytes
    console.print(f"The download: {remaining / 1e9:.2f} GB into {hub.hub_cache_dir()} (the Hugging Face cache).")
    check_download_fit(console, known, known.repo_id, remaining, None, device=args.device,
                       options=thread_options(args), force=args.force,
                       force_hint=f"--force downloads it anyway; `qwenlocal download {name}` shows the same check.")
    if not args.yes:
        if not interactive:
            raise OptionError(f"{name} is not downloaded and stdin is not a terminal, so there is no one to ask: run "
                              f"`qwenlocal download {name}` first, or pass --yes to download it and start the chat")
        if not _ask(console, f"Download {what} ({remaining / 1e9:.2f} GB) and start the chat? [y/N] ", stdin):
            raise OptionError(f"not downloaded. `qwenlocal download {name}` fetches it (it resumes if stopped); "
                              "leave --model out to chat with the built-in demo model")
    fetch(console, known.repo_id, revision, None, listing)


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def _ask(console, question: str, stdin: TextIO) -> bool:
    console.print(question, end="", markup=False)
    answer = stdin.readline()
    if not answer:  # end of input: no answer is a no
        console.print("")
    return answer.strip().lower() in ("y", "yes")
