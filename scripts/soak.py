#!/usr/bin/env python3
"""Reliability soak on the CPU (a program that prints figures, not a test), on the built-in demo model.

Part A: chat turns through the chat app's backend layer with regenerate, edit, cancel and context overflow
mixed in (scripts/soak_chat.py). Part B: `qwenlocal serve` on loopback under a bounded concurrent load for
--minutes (scripts/soak_serve.py). Both sample RSS and check every reply against a replay; the exit status is 0
only when nothing was lost, failed or mixed up and RSS growth stayed within --rss-bound-mib.

    PYTHONPATH=.pkg python scripts/soak.py [--turns 300] [--minutes 10] [--clients 4] [--json out.json]
    PYTHONPATH=.pkg python scripts/soak.py --quick      # 60 turns and 30 s of serve
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the soak_* modules beside this file

from soak_rss import fmt_latency, fmt_rss  # noqa: E402


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parent, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def report_chat(a: dict) -> list[str]:
    acts = ", ".join(f"{k} {v}" for k, v in sorted(a["actions"].items()))
    return [
        f"part A, chat backend: {a['turns']} turns in {a['conversations']} conversations ({acts}); "
        f"seeded sampling (T=1, a seed per turn), max_tokens {a['max_tokens']}, context {a['max_context']} tokens; wall {a['wall_s']:.1f} s",
        f"  replies matching a fresh replay {a['replies_ok']}, cancels that took {a['cancels_ok']} (+{a['cancel_early']} replies that ended before the cancel was due), refused as "
        f"too long {a['refused_ok']} ({a['distinct_replies']} distinct replies); turns sent with the oldest turns left out (overflow) {a['trimmed_turns']}",
        f"  lost {len(a['lost'])}, mismatched {len(a['mismatched'])}, saved-conversation problems {len(a['store_bad'])}",
        "  " + fmt_latency("turn latency", a["latency_s"]) + "; " + fmt_latency("TTFT", a["ttft_s"]),
        "  " + fmt_rss(a["rss"]) + f" (this process: backend engine + replay engine; sampled after "
        f"{a['warmup_turns']} warm-up turns)",
    ] + [f"  lost: {x}" for x in a["lost"][:5]] + [f"  mismatched: {x}" for x in a["mismatched"][:5]] + [
        f"  store: {x}" for x in a["store_bad"][:5]]


def report_serve(b: dict) -> list[str]:
    la = ", ".join("unknown" if x is None else f"{x:.2f}" for x in b["loadavg_1m"])
    return [
        f"part B, qwenlocal serve (subprocess, loopback, demo model, CPU): {b['clients']} clients back to back for "
        f"{b['minutes']:g} min, {b['keys']} distinct prompt+seed keys, half streamed, max_tokens {b['max_tokens']}",
        f"  {b['requests']} requests in {b['wall_s']:.1f} s ({b['req_per_s']:.1f} req/s): ok {b['ok']}, failed "
        f"{b['failed']}, mismatched vs the serial reference {b['mismatched_n']} (reference: {b['keys']} requests "
        f"in {b['reference_s']:.1f} s, {b['distinct_reference_replies']} distinct texts, "
        f"{len(b['reference_errors'])} errors)",
        "  " + fmt_latency("latency under load", b["latency_s"]) + "; " + fmt_latency("streamed TTFT", b["stream_ttft_s"]),
        "  " + fmt_rss(b["rss"]) + " (the server process)",
        f"  server counters {b['server_counters']}; exit status after SIGINT {b['server_exit']}; "
        f"1-min load average before/after {la}",
    ] + [f"  error: {e}" for e in b["errors"][:5]]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="a short run: 60 turns and 0.5 min of serve")
    p.add_argument("--turns", type=int, default=300)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rss-bound-mib", type=float, default=32.0,
                   help="the stated bound: RSS growth from the first 10%% to the last 10%% of samples")
    p.add_argument("--only", choices=["chat", "serve"], help="run one part")
    p.add_argument("--json", help="also write the figures to this file")
    p.add_argument("--trace-python", action="store_true",
                   help="chat part: tracemalloc over the sampled turns (what the Python heap kept, and where)")
    args = p.parse_args(argv)
    if args.quick:
        args.turns, args.minutes = min(args.turns, 60), min(args.minutes, 0.5)
    if args.turns < 1 or args.minutes <= 0 or args.clients < 1:
        p.error("--turns and --clients must be at least 1 and --minutes more than 0")
    every = 0.5 if args.quick else 2.0
    os.environ.setdefault("QWENLOCAL_HOME", __import__("tempfile").mkdtemp(prefix="qwenlocal-soak-home-"))
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    lines = [f"qwenlocal soak {started}, commit {_commit()}, {platform.machine()} {platform.system()}, "
             f"{os.cpu_count()} CPUs, python {platform.python_version()}, 1-min load average at start "
             f"{os.getloadavg()[0]:.2f}"]
    print(lines[0], flush=True)
    fig: dict = {"started": started, "args": vars(args)}
    good = True
    if args.only != "serve":
        from soak_chat import run_chat

        a = fig["chat"] = run_chat(args.turns, args.seed, every_s=every, warmup=10 if args.quick else 30,
                                   log=lambda s: print(s, flush=True), trace_python=args.trace_python)
        a_ok = not (a["lost"] or a["mismatched"] or a["store_bad"]) and a["rss"]["growth_mib"] < args.rss_bound_mib
        good &= a_ok
        lines += report_chat(a)
        print("\n".join(report_chat(a)), flush=True)
    if args.only != "chat":
        from soak_serve import run_serve

        b = fig["serve"] = run_serve(args.minutes, args.clients, keys=32 if args.quick else 256, every_s=every,
                                     log=lambda s: print(s, flush=True))
        b_ok = (b["failed"] == 0 and b["mismatched_n"] == 0 and not b["reference_errors"]
                and b["rss"]["growth_mib"] < args.rss_bound_mib)
        good &= b_ok
        lines += report_serve(b)
        print("\n".join(report_serve(b)), flush=True)
    verdict = (f"verdict: {'PASS' if good else 'FAIL'} (nothing lost, failed or mixed up; RSS growth < "
               f"{args.rss_bound_mib:g} MiB in each part)")
    print(verdict, flush=True)
    fig["pass"] = good
    if args.json:
        Path(args.json).write_text(json.dumps(fig, indent=1, default=str), encoding="utf-8")
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
