"""Sampling settings as the user types them ("temperature=0.7 top_k=20"), checked without importing the engine
(its SamplingParams lives next to torch). The engine validates again; this gives the early, friendly error.
Also the chat's own settings file (ChatSettings)."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

SAMPLING_KEYS = ("temperature", "top_p", "top_k", "max_tokens", "seed")
_ALIASES = {"temp": "temperature", "t": "temperature", "topp": "top_p", "top-p": "top_p", "topk": "top_k",
            "top-k": "top_k", "max": "max_tokens", "max-tokens": "max_tokens", "max_new_tokens": "max_tokens"}


def parse_value(key: str, raw: str) -> float | int | None:
    """One setting; "" or "default" means "use the model's default" (None)."""
    raw = raw.strip()
    if raw in ("", "default", "none"):
        return None
    try:
        if key in ("temperature", "top_p"):
            value = float(raw)
        else:
            value = int(raw)
    except ValueError:
        kind = "a number" if key in ("temperature", "top_p") else "a whole number"
        raise ValueError(f"{key} must be {kind}, got {raw!r}") from None
    if key == "temperature" and value < 0:
        raise ValueError("temperature must be >= 0 (0 = greedy)")
    if key == "top_p" and not 0 < value <= 1:
        raise ValueError("top_p must be in (0, 1]")
    if key == "top_k" and value < 0:
        raise ValueError("top_k must be >= 0 (0 = no cut)")
    if key == "max_tokens" and value < 1:
        raise ValueError("max_tokens must be >= 1")
    return value


def parse_assignments(text: str) -> dict:
    """"temperature=0.7 top_k=20" -> {"temperature": 0.7, "top_k": 20}; raises ValueError naming the problem."""
    out = {}
    for part in text.split():
        key, sep, raw = part.partition("=")
        key = _ALIASES.get(key.lower(), key.lower())
        if not sep:
            raise ValueError(f"write settings as key=value, e.g. temperature=0.7 (got {part!r})")
        if key not in SAMPLING_KEYS:
            raise ValueError(f"unknown setting {key!r}; use one of {', '.join(SAMPLING_KEYS)}")
        out[key] = parse_value(key, raw)
    return out


def describe(sampling: dict) -> str:
    set_ = [f"{k}={v}" for k, v in sampling.items() if v is not None]
    return " ".join(set_) or "model defaults"


# ----- the chat's settings file (chat-settings.json in the data folder): choices that survive a restart -----
# What to do when a conversation outgrows the context. "ask": ask once per conversation (the modal).
CONTEXT_FULL_CHOICES = {"ask": "Ask (once per conversation)", "drop": "Drop the oldest turns",
                        "summarise": "Summarise the oldest turns"}


@dataclass
class ChatSettings:
    context_full: str = "ask"


def load_chat_settings(path: Path) -> tuple[ChatSettings, str | None]:
    """The settings in `path` (defaults if there is no file), and a warning if the file could not be used
    (the defaults are used then, and the file is left as it is until a setting is changed)."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return ChatSettings(), None
    except (OSError, ValueError) as exc:
        return ChatSettings(), f"{path}: could not be read ({exc}); using the default settings"
    choice = raw.get("context_full", "ask") if isinstance(raw, dict) else None
    if choice not in CONTEXT_FULL_CHOICES:
        return ChatSettings(), (f"{path}: context_full must be one of {', '.join(CONTEXT_FULL_CHOICES)} "
                                f"(got {choice!r}); using ask")
    return ChatSettings(context_full=choice), None


def save_chat_settings(path: Path, settings: ChatSettings) -> None:
    from .store import atomic_write_text

    atomic_write_text(path, json.dumps(asdict(settings), indent=1) + "\n")
