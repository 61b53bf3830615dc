#!/usr/bin/env python
"""Calibrate / report the synthetic routing trace (engine/offload/routing.py) against a global LRU.

Full-size geometry by default (40 layers x 256 experts, top-8 = 10240 experts). For each slot count it
prints the trace parameters, misses per token and the LRU hit rate after a warm-up, plus the trace's reuse
distance. 3164 slots is the seeds' cache (~28 misses/token at 16K); 1400 and 5978 are the 16 GiB budgets with
BF16 and NVFP4 experts.

  python scripts/calibrate_routing.py                         # report the calibrated-28 preset
  python scripts/calibrate_routing.py --seeds 0,1,2           # ... and its spread over seeds
  python scripts/calibrate_routing.py --solve-reuse 28        # bisect reuse for 28 misses/token at 3164 slots
  python scripts/calibrate_routing.py --skew 1.2 --reuse 0.5  # any other parameters
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from qwenlocal.engine.offload.routing import DEFAULT_PRESET, PRESETS, RoutingSpec, generate_trace, lru_misses_per_token


def reuse_distance(trace: torch.Tensor) -> tuple[float, float, float]:
    """Tokens since this layer last used the same expert, over every re-use: (median, mean, share <= 2)."""
    tokens, layers, k = trace.shape
    key = (trace + (torch.arange(layers) * (int(trace.max()) + 1))[None, :, None]).reshape(tokens, -1)
    t = torch.arange(tokens)[:, None].expand_as(key)
    order = torch.sort(key.reshape(-1) * tokens + t.reshape(-1)).values  # by key, then by token
    same = order[1:] // tokens == order[:-1] // tokens
    d = (order[1:] % tokens - order[:-1] % tokens)[same].double()
    return float(d.median()), float(d.mean()), float((d <= 2).double().mean())


def measure(spec: RoutingSpec, args, slots: list[int]) -> dict:
    t0 = time.perf_counter()
    trace = generate_trace(spec, args.layers, args.experts, args.top_k, args.warmup + args.tokens)
    gen_s = time.perf_counter() - t0
    rows = {}
    for n in slots:
        r = lru_misses_per_token(trace, n, args.warmup)
        rows[n] = {"misses_per_token": r.misses_per_token, "hit_rate": r.hit_rate}
    med, mean, near = reuse_distance(trace)
    return {"spec": spec.as_dict(), "generate_s": gen_s, "slots": rows,
            "reuse_distance": {"median": med, "mean": mean, "share_le_2": near}}


def report(res: dict, args) -> None:
    spec = RoutingSpec(**res["spec"])
    total = args.layers * args.experts
    print(spec.describe())
    print(f"  geometry {args.layers} layers x {args.experts} experts, top-{args.top_k}; {args.tokens} tokens measured "
          f"after {args.warmup} warm-up; trace generated in {res['generate_s']:.1f} s")
    rd = res["reuse_distance"]
    print(f"  reuse distance: median {rd['median']:.0f} tokens, mean {rd['mean']:.1f}, {rd['share_le_2']:.0%} <= 2")
    for n, r in res["slots"].items():
        print(f"  {n:6d} slots ({n / total:5.1%} resident): {r['misses_per_token']:6.2f} misses/token, "
              f"hit rate {r['hit_rate']:.2%}")


def solve_reuse(args, target: float, slots: int) -> float:
    """Bisection on reuse (misses fall monotonically as reuse grows) at fixed skew and window."""
    lo, hi = 0.0, 0.98
    for _ in range(args.iterations):
        mid = round((lo + hi) / 2, 4)
        spec = RoutingSpec(seed=args.seeds[0], skew=args.skew, reuse=mid, window=args.window)
        trace = generate_trace(spec, args.layers, args.experts, args.top_k, args.warmup + args.tokens)
        got = lru_misses_per_token(trace, slots, args.warmup).misses_per_token
        print(f"  reuse={mid:.4f}: {got:.2f} misses/token at {slots} slots", flush=True)
        lo, hi = (mid, hi) if got > target else (lo, mid)
    return round((lo + hi) / 2, 3)


def main() -> None:
    preset = PRESETS[DEFAULT_PRESET]
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--skew", type=float, default=preset["skew"])
    p.add_argument("--reuse", type=float, default=preset["reuse"])
    p.add_argument("--window", type=int, default=preset["window"])
    p.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[0])
    p.add_argument("--tokens", type=int, default=4000, help="tokens measured after the warm-up")
    p.add_argument("--warmup", type=int, default=1000, help="tokens run through the cache before counting")
    p.add_argument("--slots", type=lambda s: [int(x) for x in s.split(",")], default=[1400, 3164, 5978])
    p.add_argument("--layers", type=int, default=40)
    p.add_argument("--experts", type=int, default=256)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--solve-reuse", type=float, metavar="MISSES", help="bisect reuse for this many misses/token "
                   "at 3164 slots (or the middle --slots entry) before reporting")
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()
    if args.solve_reuse is not None:
        at = 3164 if 3164 in args.slots else args.slots[len(args.slots) // 2]
        print(f"solving reuse for {args.solve_reuse} misses/token at {at} slots (skew={args.skew}, "
              f"window={args.window}, seed={args.seeds[0]})")
        args.reuse = solve_reuse(args, args.solve_reuse, at)
    results = []
    for seed in args.seeds:
        spec = RoutingSpec(seed=seed, skew=args.skew, reuse=args.reuse, window=args.window)
        res = measure(spec, args, args.slots)
        report(res, args)
        results.append(res)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"geometry": [args.layers, args.experts, args.top_k], "tokens": args.tokens,
                       "warmup": args.warmup, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
