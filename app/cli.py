"""`qwenlocal` command line: one subcommand per module, each with `configure(parser)` and `run(args) -> int`."""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from qwenlocal.engine.errors import QwenlocalError

# name -> (module, one-line help). Modules are imported only to build the parser; none imports torch at import time.
COMMANDS: dict[str, tuple[str, str]] = {
    "chat": ("qwenlocal.app.commands.chat", "chat with a model in the terminal"),
    "bench": ("qwenlocal.app.commands.bench", "measure decode and prefill speed (paired A/B protocol)"),
    "probe": ("qwenlocal.app.commands.probe", "measure this machine and show what the engine will turn on"),
    "download": ("qwenlocal.app.commands.download", "download a checkpoint from the Hugging Face hub"),
    "models": ("qwenlocal.app.commands.models", "list the downloaded and known models, their sizes and fit"),
    "generate": ("qwenlocal.app.commands.generate", "one prompt in, one streamed reply out (no TUI)"),
    "serve": ("qwenlocal.app.commands.serve", "serve the model over an OpenAI-compatible HTTP API"),
}

# The exit status when stdout's reader went away (`qwenlocal models --json | head -1`): 1, as in Python's recipe
# and as Rich's Console exits when it meets the broken pipe itself (on_broken_pipe), so plain prints and Rich tables
# end alike. Not 0: `set -o pipefail` scripts still learn the output was cut short. (Not 141: nothing is killed by
# a signal here, and Windows has no SIGPIPE.)
EXIT_BROKEN_PIPE = 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="qwenlocal",
        description="Run Qwen3.5/3.6 MoE models on one consumer NVIDIA GPU (experts in pinned host RAM).",
    )
    parser.add_argument("--version", action="version", version=f"qwenlocal {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        importlib.import_module(module).configure(cmd)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("qwenlocal")
    except PackageNotFoundError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    # Python's recommended handling of a closed stdout (docs: signal, "Note on SIGPIPE"): catch BrokenPipeError,
    # flush inside the try (small outputs are only written at exit), then point stdout at devnull so the
    # interpreter's own final flush does not fail and print "Exception ignored" again. Not signal.SIGPIPE: Windows
    # has none, and SIG_DFL would also kill `serve` when a client socket closes.
    try:
        try:
            return _run(argv)
        finally:
            if sys.stdout is not None:  # None under pythonw
                sys.stdout.flush()  # also after argparse's SystemExit (--help, --version)
    except BrokenPipeError:
        _stdout_to_devnull()
        return EXIT_BROKEN_PIPE


def _stdout_to_devnull() -> None:
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # no real file behind stdout (None, or a test's capture)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def _run(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    module = importlib.import_module(COMMANDS[args.command][0])
    try:
        return int(module.run(args) or 0)
    except QwenlocalError as exc:
        from qwenlocal.engine.env import read_env

        if read_env().debug:
            raise
        print(f"qwenlocal {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"qwenlocal {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
