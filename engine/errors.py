"""The engine's exception hierarchy. Every message says what went wrong and what to do about it.

No torch import here: the app side catches these without loading the engine.
"""
from __future__ import annotations


class QwenlocalError(Exception):
    """Base of every error qwenlocal raises on purpose."""


class ConfigError(QwenlocalError):
    """A checkpoint's config.json is malformed or describes a model this engine does not run."""


class UnsupportedModelError(ConfigError):
    """The checkpoint is not a qwen3_5_moe model (or uses a feature we do not implement)."""


class CheckpointError(QwenlocalError):
    """Weights or tokenizer files are missing, truncated or of the wrong shape."""


class OptionError(QwenlocalError):
    """An engine option, CLI flag or environment variable has a value we do not accept."""


class ContextLimitError(QwenlocalError):
    """The conversation no longer fits the context window."""


class ResourceError(QwenlocalError):
    """Not enough host RAM or VRAM for what was asked."""


class FeatureUnavailableError(QwenlocalError):
    """A command or backend that this build or machine does not provide."""


class GenerationCancelled(QwenlocalError):
    """Raised inside the engine when the caller cancelled a running generation."""
