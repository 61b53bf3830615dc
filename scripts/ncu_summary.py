#!/usr/bin/env python3
"""Nsight Compute's raw CSV (`ncu --import R.ncu-rep --page raw --csv`) as one row a launch shape.

Per (kernel, grid, block): launches, us a launch, DRAM MB read and the rate over the kernel's own time,
DRAM throughput as ncu's % of peak, L2 hit rate, registers, waves, theoretical and achieved occupancy, issue
activity, cycles a warp waits between its instructions, and the largest warp stall reasons (warps stalled
per issue slot). Whatever metric a section did not collect is shown as "-". Sorted by total time.

    python scripts/ncu_summary.py raw.csv [--top 20]
"""
from __future__ import annotations

import argparse
import csv
import re
import sys
from collections import defaultdict

COLUMNS = {  # short name -> ncu raw metric
    "us": "gpu__time_duration.sum",
    "dram_rd": "dram__bytes_read.sum",
    "dram_pct": "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    "l2_hit": "lts__t_sector_hit_rate.pct",
    "regs": "launch__registers_per_thread",
    "waves": "launch__waves_per_multiprocessor",
    "occ_theory": "sm__maximum_warps_per_active_cycle_pct",
    "occ": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "issue": "sm__issue_active.avg.pct_of_peak_sustained_elapsed",
    "cpi": "smsp__average_warps_active_per_inst_executed.ratio",
}
STALL = re.compile(r"^smsp__average_warps?_(?:latency_)?issue_stalled_(\w+?)_per_issue_active\.ratio$")
UNIT_SCALE = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6,
              "byte": 1e-6, "Kbyte": 1e-3, "Mbyte": 1.0, "Gbyte": 1e3}


def number(text: str) -> float | None:
    """A raw CSV value ('1,152', '3.5', 'n/a') as a float, or None."""
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def read_rows(path: str) -> tuple[list[dict], dict]:
    """The kernel rows and the units row of ncu's raw CSV (the line after the header holds the units)."""
    with open(path, newline="") as f:
        lines = [ln for ln in f if ln.startswith('"')]  # ncu prints ==PROF== lines around the table
    reader = csv.DictReader(lines)
    units = next(reader, {})
    return list(reader), units


def scaled(row: dict, units: dict, metric: str) -> float | None:
    """A metric in the summary's unit (us for times, MB for bytes, as is otherwise)."""
    if metric not in row:
        return None
    v = number(row[metric])
    return None if v is None else v * UNIT_SCALE.get(units.get(metric, ""), 1.0)


def summarise(rows: list[dict], units: dict) -> list[dict]:
    stall_cols = {m: STALL.match(m).group(1) for m in (rows[0] if rows else {}) if STALL.match(m)}
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        name = r.get("Kernel Name", "?").split("(")[0][:40]
        groups[(name, r.get("Grid Size", "?"), r.get("Block Size", "?"))].append(r)
    out = []
    for (name, grid, block), rs in groups.items():
        def mean(metric):
            vals = [v for v in (scaled(r, units, metric) for r in rs) if v is not None]
            return sum(vals) / len(vals) if vals else None
        s = {"kernel": name, "grid": grid, "block": block, "launches": len(rs)}
        s.update({k: mean(m) for k, m in COLUMNS.items()})
        s["gbps"] = 1e3 * s["dram_rd"] / s["us"] if s["us"] and s["dram_rd"] is not None else None
        stalls = {reason: mean(col) for col, reason in stall_cols.items()}
        s["stalls"] = sorted(((v, k) for k, v in stalls.items() if v), reverse=True)
        out.append(s)
    return sorted(out, key=lambda s: -(s["us"] or 0) * s["launches"])


def fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("csv")
    p.add_argument("--top", type=int, default=20)
    a = p.parse_args()
    rows, units = read_rows(a.csv)
    if not rows:
        sys.exit(f"{a.csv}: no kernel rows (did ncu profile anything?)")
    table = summarise(rows, units)
    total = sum((s["us"] or 0) * s["launches"] for s in table)
    print(f"{len(rows)} kernels profiled, {total:,.1f} us of kernel time (serialised, caches flushed)")
    print(f"{'kernel':<30} {'grid':>12} {'blk':>5} {'n':>3} {'us':>7} {'MB':>6} {'GB/s':>6} {'dram%':>5} {'L2hit':>5} "
          f"{'regs':>4} {'waves':>5} {'occT':>4} {'occ':>4} {'issue':>5} {'cpi':>5}  top stalls (warps per issue)")
    for s in table[:a.top]:
        stalls = ", ".join(f"{k} {v:.1f}" for v, k in s["stalls"][:4])
        print(f"{s['kernel'][:30]:<30} {s['grid'][:12]:>12} {s['block'][:5]:>5} {s['launches']:>3} "
              f"{fmt(s['us'], '7.2f')} {fmt(s['dram_rd'], '6.2f')} {fmt(s['gbps'], '6.0f')} "
              f"{fmt(s['dram_pct'], '5.1f')} {fmt(s['l2_hit'], '5.1f')} {fmt(s['regs'], '4.0f')} "
              f"{fmt(s['waves'], '5.2f')} {fmt(s['occ_theory'], '4.0f')} {fmt(s['occ'], '4.0f')} "
              f"{fmt(s['issue'], '5.1f')} {fmt(s['cpi'], '5.1f')}  {stalls}")


if __name__ == "__main__":
    main()
