"""Bench arms: a name, engine-option overrides, and optionally a runner of its own. No torch.

An arm with no runner runs the embedded engine with its options (engine/bench/measure.py). A runner is any
object with `open(model, *, device, dtype, vram_budget, options) -> ArmSession`, so another engine (a peer
implementation) can run as an arm of the same run: same prompts, same contexts, same table.

Arms for engine features register here once the engine honours them (overlap splits, layer-major prefill);
until then an arm that sets them would measure the same code twice. Ad-hoc arms come from the command line:
`--arm NAME:key=value,key=value` (EngineOptions fields).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, Sequence

from ..errors import OptionError
from ..options import EngineOptions


class ArmSession(Protocol):
    max_context: int  # the longest sequence (prompt + output) this session can hold
    vocab_size: int  # prompt ids are drawn from [0, vocab_size)

    def trial(self, prompt: Sequence[int], output_tokens: int) -> dict:
        """Prefill `prompt`, then decode until `output_tokens` tokens exist (the first comes from the prefill).
        Returns at least ttft_s, decode_s, decode_steps; optionally stats_prefill / stats_decode (counter
        deltas) and stats (the engine's stats() after the trial)."""

    def describe(self) -> dict:
        """Plan, options and anything else the JSON should keep about this arm."""

    def close(self) -> None: ...


class ArmRunner(Protocol):
    def open(self, model: Any, *, device: str | None, dtype: str | None, vram_budget: Any,
             options: EngineOptions) -> ArmSession: ...


@dataclass(frozen=True)
class Arm:
    name: str
    options: Mapping[str, Any] = field(default_factory=dict)  # EngineOptions field overrides
    description: str = ""
    runner: ArmRunner | None = None  # None: the embedded qwenlocal engine

    def engine_options(self, base: EngineOptions | Mapping[str, Any] | None = None) -> EngineOptions:
        """The base options (e.g. the run's routing spec) with this arm's overrides on top; validated."""
        base_opts = EngineOptions.coerce(base)
        merged = {**{k: getattr(base_opts, k) for k in base_opts.__dataclass_fields__}, **dict(self.options)}
        return EngineOptions.coerce(merged)


ARMS: dict[str, Arm] = {}


def register_arm(arm: Arm, *, replace: bool = False) -> Arm:
    if arm.name in ARMS and not replace:
        raise OptionError(f"bench arm {arm.name!r} is already registered")
    if not arm.name or any(c in arm.name for c in ":,= "):
        raise OptionError(f"bench arm name {arm.name!r} must be non-empty and free of ':', ',', '=' and spaces")
    EngineOptions.coerce(dict(arm.options))  # an unknown field or bad value fails at registration, not mid-run
    ARMS[arm.name] = arm
    return arm


register_arm(Arm("baseline", {}, "the engine's defaults (the plan decides every 'auto')"))
register_arm(Arm("chunk-512", {"prefill_chunk": 512}, "prefill in 512-token chunks"))
register_arm(Arm("chunk-1024", {"prefill_chunk": 1024}, "prefill in 1,024-token chunks"))
# The seeds' mechanisms (they apply with offloaded experts: add expert_slots, or let the plan offload).
register_arm(Arm("overlap-off", {"overlap": "off"}, "decode: miss copy and shared expert serial on one stream"))
register_arm(Arm("overlap-copy-side", {"overlap": "copy-side"},
                 "decode: the miss copy on a side stream beside the shared expert (split a)"))
register_arm(Arm("overlap-shared-side", {"overlap": "shared-side"},
                 "decode: the shared expert on a side stream, the copy behind ensure (split b)"))
register_arm(Arm("chunked", {"prefill_mode": "chunked"}, "prefill: every chunk through every layer"))
register_arm(Arm("layer-major", {"prefill_mode": "layer-major"},
                 "prefill: every chunk through layer L before L+1 (each bank crosses PCIe once per prompt)"))


def _value(text: str) -> Any:
    """'512' -> 512, 'true' -> True, 'none' -> None, '{"a": 1}' -> dict; anything else stays a string."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text.strip()


def parse_arm(spec: str) -> Arm:
    """'NAME' (a registered arm) or 'NAME:key=value,key=value' (an ad-hoc arm of EngineOptions overrides)."""
    name, sep, rest = spec.partition(":")
    name = name.strip()
    if not sep:
        if name not in ARMS:
            raise OptionError(f"no bench arm {name!r}; registered: {', '.join(ARMS)}; or define one as "
                              "NAME:key=value,... (engine options)")
        return ARMS[name]
    overrides: dict[str, Any] = {}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            raise OptionError(f"arm {spec!r}: {item!r} is not key=value")
        overrides[key.strip()] = _value(value)
    arm = Arm(name, overrides, "ad-hoc: " + ", ".join(f"{k}={v}" for k, v in overrides.items()))
    if not name or any(c in name for c in ",= "):
        raise OptionError(f"arm {spec!r}: the name before ':' must be a plain word")
    EngineOptions.coerce(overrides)
    return arm


def parse_arms(names: str | None, extra: Sequence[str] = ()) -> list[Arm]:
    """The run's arms in order (the first is the reference of every ratio); names must be distinct."""
    arms = [parse_arm(n) for n in (names or "").split(",") if n.strip()] + [parse_arm(s) for s in extra]
    if not arms:
        raise OptionError("name at least one bench arm (--arms baseline,chunk-512)")
    seen = [a.name for a in arms]
    dupes = sorted({n for n in seen if seen.count(n) > 1})
    if dupes:
        raise OptionError(f"bench arm(s) named twice: {', '.join(dupes)}")
    return arms


def parse_spec(text: str | None) -> Any:
    """A routing-trace spec from the command line: JSON, or key=value,key=value (numbers parsed)."""
    if text is None or not text.strip():
        return None
    text = text.strip()
    if text.startswith("{"):
        try:
            return json.loads(text)
        except ValueError as exc:
            raise OptionError(f"--routing {text!r} is not valid JSON: {exc}") from exc
    out = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            raise OptionError(f"--routing: {item!r} is not key=value (e.g. preset=calibrated-28,seed=1 or skew=1.0,reuse=0.744,window=4)")
        out[key.strip()] = _value(value)
    return out
