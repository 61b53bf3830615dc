"""`qwenlocal chat`: placeholder until the engine's chat path lands."""
from __future__ import annotations

import argparse

from qwenlocal.engine.errors import FeatureUnavailableError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    raise FeatureUnavailableError("'chat' is not built yet in this version")
