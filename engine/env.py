"""The one place that reads environment variables. Bad values are rejected, never ignored."""
from __future__ import annotations

import os
from dataclasses import dataclass

from .errors import OptionError

_PREFIX = "QWENLOCAL_"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _bool(name: str, default: bool) -> bool:
    raw = os.environ.get(_PREFIX + name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise OptionError(f"{_PREFIX}{name}={raw!r}: use 1/0, true/false, yes/no or on/off")


def _str(name: str, default: str | None) -> str | None:
    raw = os.environ.get(_PREFIX + name)
    return default if raw is None or raw == "" else raw


@dataclass(frozen=True)
class EnvSettings:
    """Settings that come from the environment (read once, by `read_env`)."""

    home: str | None  # overrides the data/cache root (tests, portable installs)
    cache_dir: str | None  # overrides the cache folder alone (probe profiles); wins over home
    no_cuda: bool  # pretend there is no GPU (CPU path) even when one is present
    debug: bool  # show tracebacks in the CLI


def read_env() -> EnvSettings:
    return EnvSettings(home=_str("HOME", None), cache_dir=_str("CACHE_DIR", None), no_cuda=_bool("NO_CUDA", False),
                       debug=_bool("DEBUG", False))
