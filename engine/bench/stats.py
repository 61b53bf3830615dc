"""The paired protocol's arithmetic: the rotating schedule, median (mean) [min-max], per-pair ratios. No torch.

A pair is one trial of every arm at one case (context length), run back to back; the arms' order rotates
from pair to pair, so no arm always runs first (warmer caches, clocks) or last. Each arm is compared with the
first arm *within a pair* (ratio arm / first), which cancels drift between pairs that a comparison of
medians would keep.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

# metric -> (label, unit, higher is better)
METRICS: dict[str, tuple[str, str, bool]] = {
    "decode_tok_s": ("decode", "tok/s", True),
    "ttft_s": ("TTFT", "s", False),
    "prefill_tok_s": ("prefill", "tok/s", True),
    "roofline_tok_s": ("roofline", "tok/s", True),
    "hit_rate": ("hit rate", "", True),
    "misses_per_token": ("misses/token", "", False),
    "h2d_bytes_per_token": ("H2D/token", "B", False),
    "prompt_h2d_bytes": ("H2D/prompt", "B", False),
    "kernels_per_step": ("kernels/step", "", False),
    "hbm_roofline_tok_s": ("HBM roofline", "tok/s", True),
    "hbm_fraction": ("of HBM roofline", "", True),
}


def rotation(arms: Sequence[str], pair: int) -> list[str]:
    """The arms' order in pair `pair` (0-based): rotated left by pair mod n."""
    if not arms:
        return []
    k = pair % len(arms)
    return list(arms[k:]) + list(arms[:k])


def schedule(arms: Sequence[str], cases: Sequence[str], pairs: int) -> list[tuple[int, str, str]]:
    """(pair, case, arm) in run order: pair by pair, each case in turn, the arms in that pair's rotation."""
    return [(p, c, a) for p in range(pairs) for c in cases for a in rotation(arms, p)]


@dataclass(frozen=True)
class Summary:
    n: int
    median: float
    mean: float
    min: float
    max: float

    def fmt(self, digits: int = 1) -> str:
        """'143.6 (142.0) [137.9-144.6]': median (mean) [min-max]."""
        if self.n == 0:
            return "-"
        f = f"{{:.{digits}f}}"
        if self.n == 1:
            return f.format(self.median)
        return f"{f.format(self.median)} ({f.format(self.mean)}) [{f.format(self.min)}-{f.format(self.max)}]"

    def as_dict(self) -> dict:
        """NaN (no values) becomes null: the file stays strict JSON."""
        clean = (lambda v: None if math.isnan(v) else v)
        return {"n": self.n, "median": clean(self.median), "mean": clean(self.mean), "min": clean(self.min),
                "max": clean(self.max)}


def median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    if not s:
        return math.nan
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def summarize(xs: Iterable[float]) -> Summary:
    vals = [float(x) for x in xs if x is not None and not math.isnan(float(x))]
    if not vals:
        return Summary(0, math.nan, math.nan, math.nan, math.nan)
    return Summary(len(vals), median(vals), sum(vals) / len(vals), min(vals), max(vals))


def pair_ratios(values: Mapping[int, float], base: Mapping[int, float]) -> list[float]:
    """value / base for each pair both have (sorted by pair); a zero or missing base gives no ratio."""
    return [values[p] / base[p] for p in sorted(values) if p in base and base[p] and values[p] is not None]


def better_count(ratios: Sequence[float], higher_is_better: bool) -> int:
    """How many pairs the arm beat the first arm in (strictly)."""
    return sum(1 for r in ratios if (r > 1.0 if higher_is_better else r < 1.0))


@dataclass(frozen=True)
class Row:
    case: str
    metric: str
    arm: str
    summary: Summary
    ratios: tuple[float, ...]  # per pair, vs the first arm (empty for the first arm itself)
    ratio: Summary
    better: int  # pairs in which this arm beat the first arm

    def as_dict(self) -> dict:
        return {"case": self.case, "metric": self.metric, "arm": self.arm, "summary": self.summary.as_dict(),
                "ratios": list(self.ratios), "ratio": self.ratio.as_dict(), "better_pairs": self.better}


def table(trials: Sequence[Mapping], arms: Sequence[str], metrics: Sequence[str] = tuple(METRICS)) -> list[Row]:
    """Rows per (case, metric, arm) from measured (non-warm-up) trials; a metric no trial has is left out.

    A trial is a mapping with "pair", "case", "arm", "metrics" ({metric: value or None}) and "warmup"."""
    measured = [t for t in trials if not t.get("warmup")]
    cases = list(dict.fromkeys(t["case"] for t in measured))
    rows: list[Row] = []
    for case in cases:
        for metric in metrics:
            by_arm: dict[str, dict[int, float]] = {a: {} for a in arms}
            for t in measured:
                v = t["metrics"].get(metric)
                if t["case"] == case and t["arm"] in by_arm and v is not None:
                    by_arm[t["arm"]][t["pair"]] = float(v)
            if not any(by_arm.values()):
                continue
            base = by_arm[arms[0]]
            higher = METRICS.get(metric, ("", "", True))[2]
            for i, arm in enumerate(arms):
                ratios = tuple(pair_ratios(by_arm[arm], base)) if i else ()
                rows.append(Row(case, metric, arm, summarize(by_arm[arm].values()), ratios, summarize(ratios),
                                better_count(ratios, higher)))
    return rows
