#!/usr/bin/env python
"""Run the real hardware probe on this machine (the lent GPU) and report its output and runtime.

    python scripts/gpu_probe.py --out "$OUT" [--full]

Runs `qwenlocal probe` as a user would, each step in a fresh Python process with an empty cache folder:
  1. `probe --refresh --json`   the default (quick) probe, timed end to end (Python start, torch import, CUDA
                                init, measurement); the budget is ~10 s
  2. `probe`                    the table, from the cache just written (and how long a cache hit takes)
  3. `probe --vram-budget 16GiB`  the plan for a simulated 16 GB card
  4. `probe --full --json`      with --full: the deeper measurement, timed
JSON lands in --out (probe_quick.json, probe_full.json, probe_summary.json); a short summary prints last.
Works without the project installed (puts a `qwenlocal` namespace over the checkout on PYTHONPATH).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUICK_BUDGET_S = 10.0


def _env(cache_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["QWENLOCAL_CACHE_DIR"] = str(cache_dir)
    env.setdefault("COLUMNS", "160")
    probe = subprocess.run([sys.executable, "-c", "import qwenlocal.app.cli"], env=env, capture_output=True)
    if probe.returncode != 0:  # not installed: a namespace package made of links to the checkout
        shim = Path(tempfile.mkdtemp(prefix="qwenlocal-shim-"))
        (shim / "qwenlocal").mkdir()
        for part in ("app", "engine", "assets"):
            (shim / "qwenlocal" / part).symlink_to(ROOT / part, target_is_directory=True)
        env["PYTHONPATH"] = os.pathsep.join([str(shim)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def _run(args: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "qwenlocal.app.cli", "probe", *args], env=env, capture_output=True,
                          text=True, timeout=600)
    return time.perf_counter() - t0, done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="folder for the JSON files (e.g. $OUT on the lent machine)")
    parser.add_argument("--full", action="store_true", help="also run the deeper `probe --full`")
    args = parser.parse_args(argv)
    out = args.out
    if out:
        out.mkdir(parents=True, exist_ok=True)
    env = _env(Path(tempfile.mkdtemp(prefix="qwenlocal-probe-cache-")))
    summary: dict = {}
    failed = False

    wall, done = _run(["--refresh", "--json"], env)
    if done.returncode != 0:
        print(done.stdout, done.stderr, sep="\n", file=sys.stderr)
        print(f"quick probe FAILED (rc {done.returncode})")
        return 1
    quick = json.loads(done.stdout)
    summary["quick"] = {"wall_s": round(wall, 2), "probe_s": quick["profile"]["probe_seconds"],
                        "within_budget": wall <= QUICK_BUDGET_S}
    if done.stderr.strip():
        print(done.stderr, file=sys.stderr)
    if out:
        (out / "probe_quick.json").write_text(json.dumps(quick, indent=2))

    for extra, key in (([], "cached"), (["--vram-budget", "16GiB"], "budget_16gib")):
        wall, done = _run(extra, env)
        print(f"\n$ qwenlocal probe {' '.join(extra)}   ({wall:.2f} s)")
        print(done.stdout)
        if done.returncode != 0:
            print(done.stderr, file=sys.stderr)
            failed = True
        summary[key] = {"wall_s": round(wall, 2), "rc": done.returncode}

    if args.full:
        wall, done = _run(["--full", "--json"], env)
        if done.returncode != 0:
            print(done.stdout, done.stderr, sep="\n", file=sys.stderr)
            failed = True
        else:
            full = json.loads(done.stdout)
            summary["full"] = {"wall_s": round(wall, 2), "probe_s": full["profile"]["probe_seconds"]}
            if out:
                (out / "probe_full.json").write_text(json.dumps(full, indent=2))
            wall, done = _run(["--full"], env)
            print(f"\n$ qwenlocal probe --full   (from the cache, {wall:.2f} s)")
            print(done.stdout)

    facts = quick["profile"]["facts"]
    plan = quick["plan"] or {}
    print("\n== probe summary ==")
    print(f"GPU: {facts['gpu_name']['value']}  cuda_available: {quick['cuda_available']}  "
          f"copy engines: {facts['copy_engines']['value']}  PCIe: gen {facts['pcie_gen']['value']} "
          f"x{facts['pcie_width']['value']}")
    print(f"H2D pinned {facts['h2d_pinned_gbps']['value']} GB/s, D2H pinned {facts['d2h_pinned_gbps']['value']} GB/s, "
          f"H2D pageable {facts['h2d_pageable_gbps']['value']} GB/s, both {facts['bidir_pinned_gbps']['value']} GB/s, "
          f"gather {facts['h2d_expert_gather_gbps']['value']} GB/s, overlaps compute "
          f"{facts['h2d_overlaps_compute']['value']}")
    print(f"plan (no budget): overlap {plan.get('overlap')}, layer_major {plan.get('layer_major')}, "
          f"slots {plan.get('slots')}, bank {plan.get('bank')}")
    for key, row in summary.items():
        print(f"{key:>13}: " + ", ".join(f"{k} {v}" for k, v in row.items()))
    verdict = "OK" if summary["quick"]["within_budget"] else "OVER BUDGET"
    print(f"quick probe end to end {summary['quick']['wall_s']} s (budget {QUICK_BUDGET_S:.0f} s): {verdict}")
    if out:
        (out / "probe_summary.json").write_text(json.dumps(summary, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
