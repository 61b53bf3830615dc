#!/usr/bin/env python3
"""The decode-overlap micro-bench (engine/probe/overlap_bench.py) over both expert formats and a few miss
counts per layer step; prints one line per setting and writes the details as JSON (GPU only).
    python scripts/overlap_microbench.py [--out DIR] [--misses 1,2,4]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from qwenlocal.engine.probe.overlap_bench import describe, run_overlap_microbench
from qwenlocal.engine.synthetic import synthetic_config


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--misses", default="1,2,4")
    args = ap.parse_args()
    cfg = synthetic_config("synthetic:qwen3.6-35b-a3b", 248320)
    results = {}
    for fmt in ("nvfp4", "bf16"):
        for misses in (int(m) for m in args.misses.split(",")):
            r = run_overlap_microbench(cfg, misses=misses, nvfp4=fmt == "nvfp4")
            results[f"{fmt}-{misses}"] = r
            print(f"{fmt} misses={misses}: {describe(r)}", flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "overlap_microbench.json").write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
