"""`qwenlocal models`: the checkpoints on this machine and the known ones not downloaded yet, with each one's
size, format and whether it fits here (the same verdict `download` and `chat` give). `--json` for scripts."""
from __future__ import annotations

import argparse
import json
import sys


def configure(parser: argparse.ArgumentParser) -> None:
    from qwenlocal.app.commands.download import add_fit_arguments

    parser.add_argument("--json", action="store_true", help="print one JSON object (for scripts)")
    add_fit_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from qwenlocal.app.inventory import list_models
    from qwenlocal.app.paths import models_dir
    from qwenlocal.engine.options import EngineOptions

    options = EngineOptions.coerce(None, vram_budget=args.vram_budget, max_context=args.max_context)
    entries = list_models(device=args.device, options=options)
    if args.json:
        from qwenlocal.app import hub

        json.dump({"models_dir": str(models_dir()), "hf_cache": str(hub.hub_cache_dir()),
                   "models": [e.describe() for e in entries]}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    _show(entries)
    return 0


def _show(entries) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from qwenlocal.app.inventory import NOT_DOWNLOADED, READY

    console = Console(soft_wrap=True, highlight=False)
    style = {"yes": "green", "caveats": "yellow", "no": "bold red", "unknown": "dim"}
    table = Table(title="Models (name = what --model takes)", title_justify="left")
    for col in ("name", "status", "format", "size", "fits here"):
        table.add_column(col, no_wrap=col != "name", overflow="fold")
    for e in entries:
        status = e.status if e.status == READY else f"[yellow]{e.status}[/]"
        size = f"{e.size_bytes / 1e9:.2f} GB" if e.size_bytes >= 10**8 else f"{e.size_bytes / 1e6:.1f} MB"
        table.add_row(escape(e.name), status, e.format, size, f"[{style[e.verdict.fits]}]{e.verdict.fits}[/]")
    console.print(table)
    # Details below the table: they are long, and a narrow terminal would fold them into a tall column.
    for e in entries:
        notes = [x for x in (e.verdict.why if e.verdict.fits != "yes" else "", e.note) if x]
        if e.path and e.status == READY and not e.is_demo:
            notes.append(f"in {e.path}")
        if e.status == NOT_DOWNLOADED:
            notes.append(f"size is the download's; get it with `qwenlocal download {e.name}`")
        if notes:
            console.print(f"  {escape(e.name)}: " + escape("; ".join(notes)))
    downloaded = [e for e in entries if e.status == READY and not e.is_demo]
    if not downloaded:
        console.print("No checkpoint is downloaded yet. Get one with `qwenlocal download qwen3.6-35b-a3b-nvfp4` "
                      "(`qwenlocal download --list` shows the known ones), or `qwenlocal chat --model NAME` offers "
                      "the download. Without --model, chat runs the built-in demo model.")
    else:
        console.print("Chat with one: qwenlocal chat --model NAME")
