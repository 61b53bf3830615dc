"""`qwenlocal download ID`: fetch a checkpoint's engine files from the Hugging Face hub, after a fit check.

ID is a registry alias (`qwenlocal download --list`) or a hub id (owner/name[@revision]). Files land in the
HF cache (then `--model ID` finds them) or, with --dir, in that folder (then `--model DIR`). An interrupted
download resumes when the same command runs again; a half-done one is never taken for a model.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from qwenlocal.engine.errors import OptionError, QwenlocalError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", nargs="?", help="a known name (see --list) or a hub id, owner/name[@revision]")
    parser.add_argument("--dir", type=Path, help="download into this folder instead of the Hugging Face cache")
    parser.add_argument("--force", action="store_true", help="download even if the fit check says it will not fit")
    parser.add_argument("--list", action="store_true", help="show the known checkpoints and exit")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    add_fit_arguments(parser)


def add_fit_arguments(parser: argparse.ArgumentParser) -> None:
    """The options that change the fit verdict (`download`, `models`)."""
    fit = parser.add_argument_group("fit check (how the model will be run here)")
    fit.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda when present")
    fit.add_argument("--vram-budget", metavar="SIZE", help="VRAM the engine may use, e.g. 16GiB")
    fit.add_argument("--max-context", type=int, metavar="TOKENS", help="context the KV cache must hold")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console(stderr=True, soft_wrap=True, highlight=False)
    from qwenlocal.engine.options import EngineOptions

    # The fit options are checked first: a bad size must not wait for (or be skipped by) the hub listing.
    EngineOptions.coerce(None, vram_budget=args.vram_budget, max_context=args.max_context)
    if args.list:
        _show_known(Console())
        return 0
    if not args.id:
        raise OptionError("name a checkpoint: `qwenlocal download qwen3.6-35b-a3b-nvfp4` (`--list` shows the known "
                          "ones) or a hub id owner/name")
    from qwenlocal.app import hub
    from qwenlocal.engine.registry import find_known

    repo_part, revision = hub.split_revision(args.id)
    known = find_known(repo_part)
    repo_id = known.repo_id if known else repo_part
    if known is None and not hub.looks_like_repo_id(repo_id):
        raise OptionError(f"{args.id!r} is neither a known checkpoint (`qwenlocal download --list`) nor a hub id "
                          "(owner/name)")
    target = args.dir.expanduser().resolve() if args.dir else None
    done = _already_complete(hub, repo_id, revision, target)
    if done is not None and target is not None:  # a finished --dir folder is final; the cache may get updates
        console.print(f"Already downloaded: {done}")
        _how_to_use(console, args.id, target)
        return 0
    try:
        listing = hub.remote_listing(repo_id, revision, hub.staging_dir(target) if target else None)
    except QwenlocalError:
        if done is None:
            raise
        console.print(f"[yellow]The hub is unreachable; the local copy is complete:[/] {done}")
        return 0
    if listing is not None and listing.remaining_bytes == 0 and done is not None:
        console.print(f"Already downloaded: {done}")
        _how_to_use(console, args.id, target)
        return 0
    remaining = listing.remaining_bytes if listing is not None else (known.download_bytes if known else None)
    _fit(console, args, known, repo_id, remaining, target)
    fetch(console, repo_id, revision, target, listing, quiet=args.quiet)
    _how_to_use(console, args.id, target)
    return 0


def fetch(console, repo_id: str, revision: str | None, target: Path | None, listing, quiet: bool = False) -> Path:
    """The download itself, with the hub's progress bars (`download`, and `chat` when it offers one)."""
    from qwenlocal.app import hub

    if listing is not None:
        console.print(f"Downloading {repo_id}: {len(listing.files)} files, {listing.remaining_bytes / 1e9:.2f} GB of "
                      f"{listing.total_bytes / 1e9:.2f} GB still to fetch.")
    try:
        path = hub.download(repo_id, revision, target, progress=not quiet)
    except KeyboardInterrupt:
        console.print("[yellow]Interrupted.[/] Run the same command again: it resumes where it stopped.")
        raise
    console.print(f"[green]Ready:[/] {path}")
    return path


def _already_complete(hub, repo_id: str, revision: str | None, target: Path | None) -> Path | None:
    if target is not None:
        return target if target.is_dir() and not hub.missing_files(target) else None
    cached = hub.find_cached(repo_id, revision)
    return cached.path if cached is not None and cached.complete else None


def _fit(console, args, known, repo_id: str, remaining: int | None, target: Path | None) -> None:
    from qwenlocal.engine.options import EngineOptions

    options = EngineOptions.coerce(None, vram_budget=args.vram_budget, max_context=args.max_context)
    check_download_fit(console, known, repo_id, remaining, target, device=args.device, options=options,
                       force=args.force)


def download_fit_report(known, repo_id: str, remaining: int | None, target: Path | None = None,
                        device: str | None = None, options=None, profile=None):
    """The download's fit check: disk for the bytes still to fetch, and RAM/VRAM when the registry knows the
    sizes and the probe can read this machine. One verdict for `download`, `chat` and `models`."""
    from qwenlocal.app import fit, hub
    from qwenlocal.app.models import machine_profile
    from qwenlocal.engine.registry import smaller_alternatives

    disk_path = target.parent if target else hub.hub_cache_dir()
    need = remaining if remaining is not None else 0
    if profile is None and known is not None:
        profile = machine_profile()
    if known is not None and profile is not None:
        # params: the CPU path holds every weight at float32, as resolve's check before loading counts it.
        return fit.check_fit(known.facts, profile, device=device, options=options, download_bytes=need,
                             disk_path=disk_path, alternatives=smaller_alternatives(known), params=known.params)
    return fit.disk_report(repo_id, need, disk_path)


def check_download_fit(console, known, repo_id: str, remaining: int | None, target: Path | None, *,
                       device: str | None = None, options=None, force: bool = False,
                       force_hint: str = "--force goes ahead anyway."):
    """Show the fit table; raise ResourceError when it does not fit (unless force). Returns the report."""
    report = download_fit_report(known, repo_id, remaining, target, device=device, options=options)
    if known is None:
        console.print("[dim]RAM and VRAM are checked when the model is loaded (its sizes are not known yet).[/]")
    _show_fit(console, report)
    if report.failures and force:
        console.print("[yellow]--force: downloading anyway.[/]")
    report.raise_if_unfit(force=force, force_hint=force_hint)
    if report.warnings:
        console.print(report.message())
    return report


def _show_fit(console, report) -> None:
    from rich.table import Table

    from qwenlocal.app.fit import report_rows

    style = {"ok": "green", "warn": "yellow", "fail": "bold red", "unknown": "dim"}
    table = Table(title=f"Fit check: {report.model} ({report.device})", title_justify="left")
    for col in ("what", "", "needs", "has", "detail"):
        table.add_column(col, overflow="fold")
    for what, status, need, have, detail in report_rows(report):
        table.add_row(what, f"[{style[status]}]{status}[/]", need, have, detail)
    console.print(table)


def _how_to_use(console, ref: str, target: Path | None) -> None:
    model = str(target) if target else ref
    console.print(f"Use it: qwenlocal chat --model {model}")


def _show_known(console) -> None:
    from rich.table import Table

    from qwenlocal.app.fit import gib
    from qwenlocal.engine.registry import KNOWN_MODELS, SYNTHETIC_MODELS

    table = Table(title="Known checkpoints", title_justify="left")
    for col in ("hub id", "name", "format", "size", "bank"):
        table.add_column(col, no_wrap=True)
    for e in KNOWN_MODELS:
        table.add_row(e.repo_id, e.aliases[0], e.expert_format, f"{e.download_bytes / 1e9:.1f} GB",
                      gib(e.facts.experts_total_bytes))
    console.print(table)
    for e in KNOWN_MODELS:
        more = f" (also {', '.join(e.aliases[1:])})" if len(e.aliases) > 1 else ""
        console.print(f"  {e.aliases[0]}{more}: {e.note}")
    names = ", ".join(f"synthetic:{n}" for n in SYNTHETIC_MODELS)
    console.print(f"No download needed (random weights, for benchmarks): {names}")
