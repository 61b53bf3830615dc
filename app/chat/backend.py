"""What the chat app talks to: a small backend protocol, and the one that wraps the embedded engine.

The app never imports torch at import time: `EngineBackend` imports `qwenlocal.engine.Engine` inside `load`,
which the app calls from a thread worker. A later remote backend (an OpenAI-compatible server) fits the same
protocol: `load` connects, `start_turn` maps streamed chunks onto the engine's event types, and `cancel` closes
the response.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Iterator, Mapping, Protocol, Sequence

from qwenlocal.engine.errors import (
    CheckpointError,
    ConfigError,
    ContextLimitError,
    FeatureUnavailableError,
    OptionError,
    QwenlocalError,
    ResourceError,
)
from qwenlocal.engine.events import Event

# progress(stage, done, total): stage is a short key ("model", "engine", "weights", later "bank", "graphs").
ProgressFn = Callable[[str, int, int], None]

STAGE_LABELS = {
    "model": "Finding the model",
    "demo": "Building the built-in demo model (first run only)",
    "engine": "Starting the engine (importing torch)",
    "weights": "Reading weights",
    "bank": "Pinning the expert bank",
    "graphs": "Capturing CUDA graphs",
    "ready": "Ready",
}


class ChatBackend(Protocol):
    """One model the chat app can talk to. `load` and `start_turn`'s iteration run on a worker thread."""

    label: str  # what the header shows ("demo-tiny (built-in demo model, random weights)")

    def load(self, progress: ProgressFn) -> None:
        """Make the model ready; raise a QwenlocalError whose message says what to do on failure."""

    def start_turn(self, messages: Sequence[Mapping[str, str]], sampling: Mapping[str, Any],
                   enable_thinking: bool, cancel: threading.Event, reuse_prefix: int = 0) -> Iterator[Event]:
        """Stream one assistant reply as engine events, ending with TurnDone or EngineError.

        Setting `cancel` stops it within one decode step (a TurnDone with finish_reason "cancelled" follows).
        `reuse_prefix` is the seam for conversation snapshots: the first `reuse_prefix` messages are the same
        as in a conversation this backend has already run, so a backend with snapshots may resume from there
        instead of prefilling the history again. Backends without snapshots ignore it.
        """

    def count_tokens(self, messages: Sequence[Mapping[str, str]], enable_thinking: bool) -> int | None:
        """The prompt these messages make, in tokens (None: this backend cannot tell; nothing is trimmed)."""

    @property
    def context_limit(self) -> int | None:
        """The most tokens a prompt and its reply may hold (None: unknown)."""

    def stats(self) -> dict:
        """Counters (tok/s, TTFT, context, expert hit rate, H2D GB/s, VRAM): whatever this backend knows."""

    @property
    def plan(self) -> dict:
        """The resolved execution choices, {name: {"value": ..., "reason": ...}}."""

    def close(self) -> None:
        """Release the model (called once, at exit)."""


class EngineBackend:
    """The embedded engine (`qwenlocal.engine.Engine`) on this machine."""

    def __init__(self, model_ref: str | None = None, device: str | None = None,
                 options: Mapping[str, Any] | None = None):
        self.model_ref = model_ref
        self.device = device
        self.options = dict(options or {})
        self.label = model_ref or "built-in demo model"
        self.is_demo = model_ref is None
        self._engine = None
        self._session = None

    def load(self, progress: ProgressFn) -> None:
        from qwenlocal.app.models import DEMO_NAME, resolve_model
        from qwenlocal.app.paths import models_dir

        progress("model", 0, 1)
        if self.model_ref is None and not (models_dir() / DEMO_NAME / "config.json").is_file():
            progress("demo", 0, 1)
        resolved = resolve_model(self.model_ref)
        self.label, self.is_demo = resolved.label, resolved.is_demo
        # `target` (a folder, or "synthetic:NAME") where models.py has it; older versions had only `path`.
        target = getattr(resolved, "target", None) or resolved.path
        progress("engine", 0, 1)
        from qwenlocal.engine import Engine  # torch is imported here, on the loader thread

        self._engine = Engine.from_pretrained(target, device=self.device, options=self.options or None,
                                              progress=progress)
        progress("ready", 1, 1)

    def start_turn(self, messages, sampling, enable_thinking, cancel, reuse_prefix=0):
        # One engine Session for the app: it reuses the longest common prefix of what it holds, and restores
        # its turn snapshots for regenerate/edit, so `reuse_prefix` needs no handling here.
        if self._session is None:
            self._session = self._engine.new_session()
        return self._engine.chat(list(messages), dict(sampling), enable_thinking=enable_thinking, cancel=cancel,
                                 session=self._session)

    def count_tokens(self, messages, enable_thinking):
        return self._engine.count_tokens(list(messages), enable_thinking) if self._engine is not None else None

    @property
    def context_limit(self):
        return self._engine.max_context if self._engine is not None else None

    @property
    def sampling_defaults(self) -> dict:
        """The model's sampling values (its generation_config.json, else the engine's): what F5 shows as default."""
        if self._engine is None:
            return {}
        d = self._engine.sampling_defaults
        return {"temperature": d.temperature, "top_p": d.top_p, "top_k": d.top_k, "max_tokens": d.max_tokens,
                "seed": d.seed}

    def stats(self) -> dict:
        return self._engine.stats() if self._engine is not None else {}

    @property
    def plan(self) -> dict:
        return self._engine.plan if self._engine is not None else {}

    def close(self) -> None:
        self._engine = self._session = None


def explain_load_error(exc: BaseException) -> tuple[str, str, str]:
    """(title, what happened, what to do) for the load-error modal; never a traceback."""
    msg = str(exc) or type(exc).__name__
    if isinstance(exc, CheckpointError):
        return ("The model could not be read", msg,
                "Check that --model points at a complete checkpoint folder (config.json, *.safetensors, "
                "tokenizer.json), or leave --model out to use the built-in demo model.")
    if isinstance(exc, ConfigError):
        return ("This model is not supported", msg,
                "qwenlocal runs qwen3_5_moe checkpoints (Qwen3.5/3.6 MoE); pick one of those.")
    if isinstance(exc, ResourceError):
        return ("Not enough memory", msg,
                "Close other programs, or choose a smaller model or a lower VRAM budget.")
    if isinstance(exc, (OptionError, FeatureUnavailableError, ContextLimitError)):
        return ("A setting is not accepted", msg, "Fix the option named above and start again.")
    if isinstance(exc, QwenlocalError):
        return ("The model could not be loaded", msg, "Fix what the message says and start again.")
    if isinstance(exc, MemoryError):
        return ("Not enough memory", "the machine ran out of memory while loading the model",
                "Close other programs or choose a smaller model.")
    return ("The model could not be loaded", f"{type(exc).__name__}: {msg}",
            "This looks like a bug: run again with QWENLOCAL_DEBUG=1 for a traceback and report it.")
