"""The DESIGN.md performance protocol as a loop: warm-up, then pairs of interleaved arms in rotating order over
every case, with the same seeded prompt for every arm of a pair. No torch here (sessions do the measuring).

Each trial is kept raw (times, counter deltas) plus the figures derived from it (`derive`); stats.py turns
the measured ones into the table.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from ..errors import OptionError
from .arms import Arm
from .stats import rotation

# Counter names looked up in engine.stats() deltas (leaf names; the first present wins). The engine's offload
# runtime is asked to report these; until it does, the columns that need them stay empty.
HIT_KEYS = ("hits", "expert_hits", "cache_hits")
MISS_KEYS = ("misses", "expert_misses", "cache_misses")
H2D_KEYS = ("h2d_bytes", "miss_bytes", "copy_bytes")
GPU_TIME_KEYS = ("gpu_s", "gpu_time_s", "decode_gpu_s")  # device-side time of the decode steps
BANDWIDTH_KEYS = ("h2d_gbps",)  # GB/s the engine measured for its own miss copies


@dataclass(frozen=True)
class Case:
    name: str  # "16k" (decode at that context) or "ttft-64k" (prefill only)
    prompt_tokens: int
    output_tokens: int  # 1 = prefill and the first token only (TTFT)


def parse_tokens(text: str) -> int:
    """'16k' -> 16384, '120k' -> 122880, '1m' -> 1048576, '500' -> 500."""
    t = text.strip().lower()
    mult = {"k": 1024, "m": 1024 * 1024}.get(t[-1:], 1)
    try:
        n = int(float(t[:-1] if mult > 1 else t) * mult)
    except ValueError:
        raise OptionError(f"{text!r} is not a token count; write it like 512, 16k or 120k") from None
    if n < 1:
        raise OptionError(f"token count {text!r} must be positive")
    return n


def token_label(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def build_cases(contexts: Sequence[int], prompt_lengths: Sequence[int], output_tokens: int) -> list[Case]:
    if output_tokens < 2:
        raise OptionError("--output-tokens must be at least 2 (one decode step)")
    cases = [Case(token_label(c), c, output_tokens) for c in contexts]
    cases += [Case(f"ttft-{token_label(p)}", p, 1) for p in prompt_lengths]
    names = [c.name for c in cases]
    if len(set(names)) != len(names):
        raise OptionError("a context or prompt length is listed twice")
    return cases


def prompt_ids(seed: int, pair: int, case_index: int, length: int, vocab: int) -> list[int]:
    """The prompt every arm gets in this pair and case: seeded, so a run can be repeated exactly."""
    rng = random.Random(f"{seed}/{pair}/{case_index}")
    return [rng.randrange(vocab) for _ in range(length)]


def numeric_leaves(d: Any, prefix: str = "") -> dict[str, float]:
    """{'a.b': 3, ...} for every int/float (not bool) leaf of nested dicts (engine.stats() flattened)."""
    out: dict[str, float] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(numeric_leaves(v, f"{prefix}{k}."))
    elif isinstance(d, (int, float)) and not isinstance(d, bool):
        out[prefix[:-1]] = d
    return out


def delta(before: dict, after: dict) -> dict[str, float]:
    """after - before for every numeric leaf both have that changed (counters; gauges that moved show too)."""
    a, b = numeric_leaves(after), numeric_leaves(before)
    return {k: a[k] - b[k] for k in a if k in b and a[k] != b[k]}


def _first(d: Mapping[str, float], names: Sequence[str]) -> float | None:
    for name in names:
        for key, value in d.items():
            if key == name or key.endswith("." + name):
                return value
    return None


def derive(trial: Mapping[str, Any], bandwidth_gbps: float | None = None) -> dict[str, float | None]:
    """The figures of one trial: tok/s, TTFT, and where the engine reports counters, hit rate, misses and H2D
    bytes per token and the roofline (max of device time and miss bytes / bandwidth, per token)."""
    steps, dec, ttft = trial.get("decode_steps", 0), trial.get("decode_s", 0.0), trial.get("ttft_s", 0.0)
    out: dict[str, float | None] = {
        "ttft_s": ttft,
        "decode_tok_s": steps / dec if steps and dec > 0 else None,
        "prefill_tok_s": trial.get("prompt_tokens", 0) / ttft if ttft > 0 else None,
        "hit_rate": None, "misses_per_token": None, "h2d_bytes_per_token": None, "roofline_tok_s": None,
        "prompt_h2d_bytes": _first(trial.get("stats_prefill") or {}, H2D_KEYS),  # what the prefill streamed
    }
    sd = trial.get("stats_decode") or {}
    hits, misses, h2d = _first(sd, HIT_KEYS), _first(sd, MISS_KEYS), _first(sd, H2D_KEYS)
    if hits is not None and misses is not None and hits + misses > 0:
        out["hit_rate"] = hits / (hits + misses)
    if steps and misses is not None:
        out["misses_per_token"] = misses / steps
    if steps and h2d is not None:
        out["h2d_bytes_per_token"] = h2d / steps
    bw = _first(trial.get("stats_numeric") or {}, BANDWIDTH_KEYS) or bandwidth_gbps
    bounds = []
    if out["h2d_bytes_per_token"] is not None and bw:
        bounds.append(out["h2d_bytes_per_token"] / (bw * 1e9))
    gpu_s = _first(sd, GPU_TIME_KEYS)
    if steps and gpu_s:
        bounds.append(gpu_s / steps)
    if bounds and max(bounds) > 0:
        out["roofline_tok_s"] = 1.0 / max(bounds)
    # The step's HBM roofline: bytes it must read / the device's measured bandwidth (GPU trials only).
    step_bytes, gbps = trial.get("step_bytes"), trial.get("device_gbps")
    out["kernels_per_step"] = trial.get("kernels_per_step")
    out["hbm_roofline_tok_s"] = gbps * 1e9 / step_bytes if step_bytes and gbps else None
    if out["hbm_roofline_tok_s"] and out["decode_tok_s"]:
        out["hbm_fraction"] = out["decode_tok_s"] / out["hbm_roofline_tok_s"]
    else:
        out["hbm_fraction"] = None
    return out


Progress = Callable[[int, int, str], None]  # (done, total, what runs next)


class Sessions:
    """Each arm's session, opened once (default) or per trial (`reload`: one model in memory at a time)."""

    def __init__(self, arms: Sequence[Arm], opener: Callable[[Arm], Any], reload: bool):
        self.arms = {a.name: a for a in arms}
        self.opener, self.reload = opener, reload
        self.open: dict[str, Any] = {}
        self.info: dict[str, dict] = {}

    def get(self, name: str):
        if name not in self.open:
            if self.reload:
                self.close_all()
            self.open[name] = self.opener(self.arms[name])
            self.info.setdefault(name, self.open[name].describe())
        return self.open[name]

    def done_with(self, name: str) -> None:
        if self.reload:
            self.info[name] = self.open[name].describe()
            self.open.pop(name).close()

    def close_all(self) -> None:
        for name in list(self.open):
            self.info[name] = self.open[name].describe()
            self.open.pop(name).close()


def run_protocol(arms: Sequence[Arm], cases: Sequence[Case], opener: Callable[[Arm], Any], *, pairs: int,
                 warmup_s: float, seed: int, trials: list, reload: bool = False,
                 bandwidth_gbps: float | None = None, progress: Progress | None = None) -> dict:
    """Run warm-up and the pairs, appending each trial (a dict) to `trials` as it finishes, so a caller can
    keep what was measured when a run is interrupted. Returns {"arms": per-arm info, "skipped": [...]}."""
    names = [a.name for a in arms]
    sessions = Sessions(arms, opener, reload)
    try:
        first = sessions.get(names[0])
        vocab = min(first.vocab_size, *(sessions.get(n).vocab_size for n in names)) if not reload else first.vocab_size
        limit = first.max_context
        runnable = [c for c in cases if c.prompt_tokens + c.output_tokens <= limit]
        skipped = [{"case": c.name, "why": f"{c.prompt_tokens + c.output_tokens:,} tokens exceed the model's "
                    f"context of {limit:,}"} for c in cases if c not in runnable]
        if not runnable:
            raise OptionError(f"no case fits the model's context of {limit:,} tokens; pick shorter --contexts")
        total = len(names) * (pairs * len(runnable) + 1)
        done = 0

        def one(pair: int, ci: int, case: Case, arm: str, warmup: bool) -> None:
            nonlocal done
            if progress:
                progress(done, total, f"{'warm-up' if warmup else f'pair {pair + 1}/{pairs}'} · {case.name} · {arm}")
            session = sessions.get(arm)
            ids = prompt_ids(seed + (7919 if warmup else 0), pair, ci, case.prompt_tokens, vocab)
            raw = session.trial(ids, case.output_tokens)
            sessions.done_with(arm)
            raw = dict(raw)
            raw["stats_numeric"] = numeric_leaves(raw.pop("stats", {}) or {})
            trials.append({"pair": pair, "case": case.name, "arm": arm, "warmup": warmup, "order": len(trials),
                           "finished": time.time(), "raw": raw, "metrics": derive(raw, bandwidth_gbps)})
            done += 1

        # Warm-up: every arm once on the first case (graphs, allocator, kernel caches), then round-robin until
        # warmup_s has passed. Kept in the JSON, marked, and left out of every statistic.
        t0 = time.perf_counter()
        for arm in names:
            one(0, 0, runnable[0], arm, True)
        total_extra, w = 0, 0
        while time.perf_counter() - t0 < warmup_s:
            case_i = w % len(runnable)
            for arm in rotation(names, w):
                total_extra += 1
                total += 1
                one(w + 1, case_i, runnable[case_i], arm, True)
            w += 1
        for pair in range(pairs):
            for ci, case in enumerate(runnable):
                for arm in rotation(names, pair):
                    one(pair, ci, case, arm, False)
        if progress:
            progress(done, total, "done")
        sessions.close_all()
        return {"arms": sessions.info, "skipped": skipped, "warmup_trials": len(names) + total_extra}
    finally:
        sessions.close_all()
