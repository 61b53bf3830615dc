"""Synthetic expert routing for benchmarks: a seeded trace of top-k expert ids with a stated locality.

Why: random (synthetic) weights route without locality, so the LRU slot cache would see far more misses
than real Qwen3.6 routing does (median reuse distance ~2 tokens; ~81-91% LRU hits at ~31-33% residency).
The bench therefore replaces the router's expert ids with a trace whose locality is calibrated to a stated
miss rate, and every report prints the trace parameters and the measured hit rate.

Contract for the engine (benchmarks only; real checkpoints never use it):
  * the router still computes its softmax and top-k; its top-k WEIGHTS are kept and only the expert IDS are
    replaced by `RoutingTrace.ids(layer, n)`, so the gate weights still come from the router and every
    kernel (ensure, miss gather, routed GEMM) runs exactly as with real routing;
  * `ids` and `advance` never sync with the host (index arithmetic on a device-side position counter), so
    they can sit inside a captured CUDA graph; `advance(n)` is called once per forward, after all layers.

The model of one layer's routing at one token: k distinct ids drawn without replacement from the mixture
    p(e) = (1 - reuse) * popularity(e) + reuse * (uses of e in this layer's last `window` tokens) / (uses)
i.e. each id is, with probability `reuse`, a re-draw from the ids this layer used recently, else a draw
from a Zipf-like popularity (weight 1 / rank**skew over a per-layer random permutation of the experts).
"""
from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping, NamedTuple

import torch

from ..errors import OptionError

# Calibrated with scripts/calibrate_routing.py on the full-size geometry (40 layers x 256 experts, top-8 =
# 10240 experts), global LRU as in ExpertSlotCache, 4000 tokens counted after a 1000-token warm-up, seed 0:
#   3164 slots (30.9% resident): 27.98 misses/token, hit rate 91.26%  (the seeds' ~28 misses/token at 16K)
#   1400 slots (13.7% resident): 46.47 misses/token, hit rate 85.48%  (BF16 experts, 16 GiB budget)
#   5978 slots (58.4% resident): 12.78 misses/token, hit rate 96.01%  (NVFP4 experts, 16 GiB budget)
# Seeds 1 and 2: 27.79 / 27.77 misses/token at 3164 slots. Median reuse distance 2 tokens (65% <= 2; real
# Qwen3.6: ~2). skew and window were fixed (moderate popularity; a window of 4 tokens puts the median reuse
# distance at ~2), then reuse was bisected for 28 misses/token (--solve-reuse 28).
PRESETS: dict[str, dict[str, Any]] = {
    "calibrated-28": {"skew": 1.0, "reuse": 0.744, "window": 4},
}
DEFAULT_PRESET = "calibrated-28"

_MAX_LENGTH = 1 << 16  # trace rows kept on the device (wraps around); 64K x 40 x 8 longs = 168 MB at most
_MAX_WINDOW = 4096


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return (isinstance(x, (int, float)) and not isinstance(x, bool)) and math.isfinite(x)


@dataclass(frozen=True)
class RoutingSpec:
    """The engine option `routing`: how to synthesise expert ids. Defaults are the calibrated-28 preset."""

    seed: int = 0  # torch.Generator seed: the same spec gives the same trace on every machine
    skew: float = PRESETS[DEFAULT_PRESET]["skew"]  # Zipf exponent of per-layer popularity (0 = uniform)
    reuse: float = PRESETS[DEFAULT_PRESET]["reuse"]  # probability an id is re-drawn from recent ones
    window: int = PRESETS[DEFAULT_PRESET]["window"]  # tokens of this layer's history that reuse draws from
    length: int = 8192  # trace rows generated (then the replay wraps around); bounds device memory

    def __post_init__(self) -> None:
        if not _is_int(self.seed) or not 0 <= self.seed < 2**63:
            raise OptionError(f"routing.seed must be an integer in [0, 2**63), got {self.seed!r}")
        if not _is_number(self.skew) or not 0 <= self.skew <= 10:
            raise OptionError(f"routing.skew must be a number in [0, 10] (0 = uniform popularity), got {self.skew!r}")
        if not _is_number(self.reuse) or not 0 <= self.reuse < 1:
            raise OptionError(f"routing.reuse must be a probability in [0, 1), got {self.reuse!r}")
        if not _is_int(self.window) or not 1 <= self.window <= _MAX_WINDOW:
            raise OptionError(f"routing.window must be a whole number of tokens in [1, {_MAX_WINDOW}], "
                              f"got {self.window!r}")
        if not _is_int(self.length) or not 1 <= self.length <= _MAX_LENGTH:
            raise OptionError(f"routing.length must be a whole number of tokens in [1, {_MAX_LENGTH}], "
                              f"got {self.length!r}")
        object.__setattr__(self, "skew", float(self.skew))
        object.__setattr__(self, "reuse", float(self.reuse))

    @classmethod
    def from_value(cls, value: "RoutingSpec | Mapping[str, Any] | str | None") -> "RoutingSpec | None":
        """None (no synthetic routing) | a preset name | a dict of fields (optionally with "preset": name as
        the base the other keys override) | a RoutingSpec. Unknown keys or presets are an OptionError."""
        if value is None or isinstance(value, cls):
            return value
        if isinstance(value, str):
            return cls(**_preset(value))
        if isinstance(value, Mapping):
            known = {f.name for f in fields(cls)}
            unknown = sorted(set(value) - known - {"preset"})
            if unknown:
                raise OptionError(f"unknown routing key(s) {unknown}; known: {sorted(known | {'preset'})} "
                                  f"(or a preset name: {', '.join(PRESETS)})")
            base = _preset(value["preset"]) if "preset" in value else {}
            return cls(**{**base, **{k: v for k, v in value.items() if k != "preset"}})
        raise OptionError(f"routing must be None, a preset name ({', '.join(PRESETS)}), a dict of "
                          f"{[f.name for f in fields(cls)]} or a RoutingSpec, got {type(value).__name__}")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        """One line for reports: every parameter (and the preset it equals, if any)."""
        name = next((n for n, p in PRESETS.items() if all(getattr(self, k) == v for k, v in p.items())), None)
        params = ", ".join(f"{k}={v}" for k, v in self.as_dict().items())
        return f"synthetic routing ({name or 'custom'}): {params}"


def _preset(name: Any) -> dict[str, Any]:
    if not isinstance(name, str) or name not in PRESETS:
        raise OptionError(f"unknown routing preset {name!r}; known: {', '.join(PRESETS)}")
    return dict(PRESETS[name])


def generate_trace(spec: RoutingSpec, num_layers: int, num_experts: int, top_k: int,
                   tokens: int | None = None) -> torch.Tensor:
    """-> LongTensor [tokens, num_layers, top_k] (CPU) of expert ids, distinct within each (token, layer).

    Deterministic in (spec, geometry, tokens): everything is drawn from one CPU torch.Generator. Tokens are
    sequential (reuse depends on the past), layers are vectorised: one top-k over [layers, experts] per token.
    Sampling k distinct ids from p without replacement uses the exponential race: the k largest p(e) / X(e),
    X(e) ~ Exp(1) iid (equivalent to Gumbel-top-k on log p, without a per-token log)."""
    for name, v in (("num_layers", num_layers), ("num_experts", num_experts), ("top_k", top_k)):
        if not _is_int(v) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if top_k > num_experts:
        raise ValueError(f"top_k={top_k} exceeds num_experts={num_experts}: ids could not be distinct")
    tokens = spec.length if tokens is None else tokens
    if not _is_int(tokens) or tokens < 1:
        raise ValueError(f"tokens must be a positive integer, got {tokens!r}")
    layers, e, k, window = num_layers, num_experts, top_k, spec.window
    gen = torch.Generator().manual_seed(spec.seed)
    # Per-layer popularity: rank r gets 1 / (r + 1)**skew, ranks assigned by a per-layer random permutation.
    perm = torch.argsort(torch.rand(layers, e, generator=gen), dim=1)
    weight = torch.arange(1, e + 1, dtype=torch.float64).pow(-spec.skew).expand(layers, e).contiguous()
    pop = torch.empty(layers, e, dtype=torch.float64).scatter_(1, perm, weight)
    pop = (pop / pop.sum(1, keepdim=True)).to(torch.float32)
    pop_part = pop * (1.0 - spec.reuse)
    out = torch.empty(tokens, layers, k, dtype=torch.long)
    counts = torch.zeros(layers, e)  # uses per (layer, expert) in the last `window` tokens
    ones = torch.ones(layers, k)
    minus_ones = -ones
    chunk = 64  # noise drawn for 64 tokens at once: batched RNG and log, bounded memory
    for c0 in range(0, tokens, chunk):
        n = min(chunk, tokens - c0)
        inv_exp = torch.rand(n, layers, e, generator=gen).clamp_(min=1e-30).log_().neg_().reciprocal_()
        for i in range(n):
            t = c0 + i
            if t == 0 or spec.reuse == 0.0:
                p = pop  # nothing to re-draw from yet
            else:
                p = pop_part + counts * (spec.reuse / (min(t, window) * k))
            ids = torch.topk(p * inv_exp[i], k, dim=1).indices
            out[t] = ids
            counts.scatter_add_(1, ids, ones)
            if t >= window:
                counts.scatter_add_(1, out[t - window], minus_ones)  # that token leaves the window
    return out


class RoutingTrace:
    """A trace on the device, replayed layer by layer with a device-side position (no host sync).

    Engine wiring (per forward of n tokens):  for each MoE layer l: weights, ids = router top-k;
    ids = trace.ids(l, n)  (keep weights);  ...;  after the last layer: trace.advance(n).
    Row r of the trace is used by the r-th token the engine routes (prefill and decode alike), modulo the
    trace length: the replay wraps around. reset() rewinds (e.g. between bench trials, outside a graph).
    """

    _STEPS = 4096  # precomputed offsets 0..4095: decode (n = 1) and prefill chunks need no allocation

    def __init__(self, trace: torch.Tensor, device: torch.device | str = "cpu", spec: RoutingSpec | None = None):
        if trace.dim() != 3 or trace.dtype != torch.long or trace.shape[0] < 1:
            raise ValueError(f"trace must be a LongTensor [tokens, layers, top_k], got {trace.dtype} "
                             f"{tuple(trace.shape)}")
        self.spec = spec
        self.device = torch.device(device)
        self.length, self.num_layers, self.top_k = trace.shape
        # Layer-major: one layer's rows are contiguous, so ids() is a single index_select.
        self.by_layer = trace.permute(1, 0, 2).contiguous().to(self.device)
        self.position = torch.zeros(1, dtype=torch.long, device=self.device)
        self._steps = torch.arange(self._STEPS, dtype=torch.long, device=self.device)

    @classmethod
    def from_spec(cls, spec: RoutingSpec, num_layers: int, num_experts: int, top_k: int,
                  device: torch.device | str = "cpu") -> "RoutingTrace":
        """Generate spec.length rows on the CPU (seconds at full size), then move them to `device`."""
        return cls(generate_trace(spec, num_layers, num_experts, top_k), device, spec)

    @property
    def nbytes(self) -> int:
        """Device bytes held (count them in the VRAM budget)."""
        return (self.by_layer.numel() + self.position.numel() + self._steps.numel()) * 8

    def ids(self, layer: int, num_tokens: int) -> torch.Tensor:
        """The next `num_tokens` rows for `layer` -> LongTensor [num_tokens, top_k] on the device."""
        if num_tokens < 1:
            raise ValueError(f"num_tokens must be positive, got {num_tokens}")
        steps = (self._steps[:num_tokens] if num_tokens <= self._STEPS
                 else torch.arange(num_tokens, dtype=torch.long, device=self.device))
        rows = torch.remainder(self.position + steps, self.length)
        return self.by_layer[layer].index_select(0, rows)

    def one_token_ids(self) -> torch.Tensor:
        """The next row of every layer at once -> LongTensor [layers, 1, top_k]: ids(l, 1) for each l in one
        gather (the fused decode step: one kernel per token instead of three per layer)."""
        return self.by_layer.index_select(1, self.position)  # position stays in [0, length) (advance wraps)

    def advance(self, num_tokens: int) -> None:
        """Move past the rows the forward just used (in place: a captured graph sees the new value)."""
        self.position.add_(num_tokens).remainder_(self.length)

    def reset(self) -> None:
        self.position.zero_()


class LruResult(NamedTuple):
    misses_per_token: float
    hit_rate: float


def lru_miss_counts(trace: torch.Tensor, num_slots: int) -> torch.Tensor:
    """Misses per (token, layer) -> LongTensor [tokens, layers] under ExpertSlotCache's global LRU.

    Layers are visited 0..L-1 per token, each (token, layer) being one `ensure` step. The cache never evicts
    a key the current step uses and stamps the step's keys most recent in top-k order; with num_slots >= k
    that keeps the cache equal to the num_slots most recently used keys (recency = (step, position)), so an
    OrderedDict in recency order, trimmed from the old end after each step, decides hits exactly as the
    device code does (tests/test_routing.py checks it against ExpertSlotCache step by step)."""
    tokens, layers, k = trace.shape
    if not _is_int(num_slots) or num_slots < k:
        raise ValueError(f"num_slots must be an integer >= top_k={k}, got {num_slots!r}")
    keys = trace + (torch.arange(layers) * (int(trace.max()) + 1))[None, :, None]  # (layer, id) -> unique key
    lru: OrderedDict[int, None] = OrderedDict()
    touch, trim = lru.move_to_end, lru.popitem
    out = torch.empty(tokens, layers, dtype=torch.long)
    for c0 in range(0, tokens, 256):  # lists per chunk: 256 x 40 x 8 Python ints at a time, not 6 M
        counts = []
        for token in keys[c0:c0 + 256].tolist():
            row = []
            for step in token:
                missed = 0
                for key in step:  # top-k order: the last touched is the most recent
                    if key in lru:
                        touch(key)
                    else:
                        lru[key] = None
                        missed += 1
                for _ in range(len(lru) - num_slots):  # evict least recent; never this step's (C >= k)
                    trim(last=False)
                row.append(missed)
            counts.append(row)
        out[c0:c0 + len(counts)] = torch.tensor(counts, dtype=torch.long)
    return out


def lru_misses_per_token(trace: torch.Tensor, num_slots: int, warmup_tokens: int = 0) -> LruResult:
    """Steady-state misses per token and hit rate, counting tokens from `warmup_tokens` on (the cache starts
    empty, so the first tokens are cold misses)."""
    tokens, layers, k = trace.shape
    if not _is_int(warmup_tokens) or not 0 <= warmup_tokens < tokens:
        raise ValueError(f"warmup_tokens must be in [0, {tokens}), got {warmup_tokens!r}")
    misses = lru_miss_counts(trace, num_slots)[warmup_tokens:].sum().item()
    measured = tokens - warmup_tokens
    return LruResult(misses / measured, 1.0 - misses / (measured * layers * k))
