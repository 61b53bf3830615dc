"""`qwenlocal bench`: not built yet (see issue #10 (models and benchmark))."""
from __future__ import annotations

import argparse

from qwenlocal.engine.errors import FeatureUnavailableError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    raise FeatureUnavailableError("'bench' is not built yet in this version (tracked in issue #10 (models and benchmark))")
