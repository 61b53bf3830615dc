"""One module per `qwenlocal` subcommand."""

import argparse


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def add_threads_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=positive_int, metavar="N",
                        help="CPU threads for the CPU path (default: physical cores less one, at most 8)")


def thread_options(args: argparse.Namespace) -> dict | None:
    """The engine options --threads asks for (None: the engine's default)."""
    threads = getattr(args, "threads", None)
    return {"threads": threads} if threads is not None else None
