"""qwenlocal.engine: everything that touches torch lives below this package.

Importing this package does not import torch: `Engine` is resolved lazily, so the app side can import the
error and event types cheaply.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .api import Engine, EngineOptions

__all__ = ["Engine", "EngineOptions"]


def __getattr__(name: str):
    if name in ("Engine", "EngineOptions"):
        from . import api

        return getattr(api, name)
    raise AttributeError(name)
