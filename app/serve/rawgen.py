"""/v1/completions: a raw prompt continued by the engine, with no chat template and no thinking split.

Goes through the Engine API (`Engine.complete`), which validates the prompt before any work, takes the
engine's lock and yields the same event types as `Engine.chat`. Kept as the serve side's one seam for it.
"""
from __future__ import annotations

import threading
from typing import Any, Iterator, Mapping, Sequence

from qwenlocal.engine.events import Event


def raw_completion(engine: Any, prompt: str | Sequence[int], sampling: Mapping[str, Any] | None,
                   cancel: threading.Event | None = None) -> Iterator[Event]:
    return engine.complete(prompt, dict(sampling or {}), cancel)
