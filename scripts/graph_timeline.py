"""Where a CUDA-graph decode step's time goes, kernel by kernel, from the profiler's trace of a few replays
(scripts/profile_decode.py prints it per arm).

Why: the eager profile's kernel times do not add up to the graph step. Under programmatic dependent launch a
kernel starts (its first block resident) before its predecessor ends, so its duration includes waiting for it,
and a side stream's kernel overlaps the compute stream's. Here each kernel is charged the time by which it moved
the step's end: kernels sorted by their end, kernel i is charged e_i - e_(i-1), the first kernel its duration.
The charges add up to the replay's span (first start to last end). Where two streams overlap (the decode
overlap's split, offload/overlap.py), the stretch is split between their kernels by the order of their ends: the
sum stays the span, and neither part is what that kernel would cost alone. Also counted: the idle time between
kernels (a start after the latest end so far), the part of the span no kernel ran.

Input: chrome-trace events (torch.profiler's export_chrome_trace "traceEvents"), of `steps` replays of one graph;
kernels are told apart by name and launch shape (grid x block), as profile_decode's launch table does.
"""
from __future__ import annotations

from collections import defaultdict


def replays(events: list[dict], steps: int) -> list[list[dict]]:
    """The trace's kernel events split into `steps` replays of equal length, each sorted by start."""
    kernels = sorted((ev for ev in events if ev.get("cat") == "kernel"), key=lambda ev: float(ev["ts"]))
    if steps < 1 or not kernels or len(kernels) % steps:
        raise ValueError(f"{len(kernels)} kernel events do not split into {steps} replays of equal length")
    n = len(kernels) // steps
    return [kernels[i * n:(i + 1) * n] for i in range(steps)]


def _key(ev: dict) -> tuple[str, str]:
    args = ev.get("args", {})
    return ev["name"], f"{args.get('grid')} x {args.get('block')}"


def charges(replay: list[dict]) -> tuple[list[tuple[tuple[str, str], float, float]], float, float]:
    """([(kernel key, duration us, charge us)] in end order, span us, idle us) of one replay."""
    spans = [(float(ev["ts"]), float(ev["ts"]) + float(ev.get("dur", 0.0)), _key(ev)) for ev in replay]
    by_end = sorted(spans, key=lambda s: s[1])
    first = min(s[0] for s in spans)
    out, latest = [], None
    for start, end, key in by_end:
        out.append((key, end - start, end - (first if latest is None else latest)))
        latest = end
    idle, reach = 0.0, None
    for start, end, _ in spans:  # by start
        if reach is not None and start > reach:
            idle += start - reach
        reach = end if reach is None else max(reach, end)
    return out, by_end[-1][1] - first, idle


def timeline(events: list[dict], steps: int) -> dict:
    """Per kernel key, per replay on average: calls, in-graph us (durations' sum), charged us; and the replay's
    span, idle time and kernel count. Rows sorted by charged time."""
    calls, dur, charged = defaultdict(float), defaultdict(float), defaultdict(float)
    span = idle = 0.0
    runs = replays(events, steps)
    for replay in runs:
        rows, s, i = charges(replay)
        span, idle = span + s, idle + i
        for key, d, c in rows:
            calls[key] += 1
            dur[key] += d
            charged[key] += c
    rows = sorted(((k[0], k[1], calls[k] / steps, dur[k] / steps, charged[k] / steps) for k in calls),
                  key=lambda r: -r[4])
    return {"kernels_per_replay": len(runs[0]), "span_us": span / steps, "idle_us": idle / steps, "rows": rows}


def print_timeline(t: dict, top: int) -> None:
    print(f"graph replay, each kernel charged the time it moved the step's end: span {t['span_us']:.1f} us, "
          f"{t['kernels_per_replay']} kernels, idle between kernels {t['idle_us']:.1f} us")
    print(f"{'kernel':<56} {'grid x block':>26} {'calls':>6} {'us in graph':>11} {'charged us':>10} {'us/call':>7} "
          f"{'share':>6}")
    for name, shape, n, d, c in t["rows"][:top]:
        print(f"{name[:56]:<56} {shape:>26} {n:>6.1f} {d:>11.1f} {c:>10.1f} {c / n:>7.2f} {c / t['span_us']:>6.1%}")
