"""Rich tables for bench results: one run (median (mean) [min-max] and per-pair ratios vs the first arm) and
the comparison of two runs. Reads the JSON record's dicts only, so a saved run renders the same way."""
from __future__ import annotations

from typing import Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from qwenlocal.engine.bench.stats import METRICS

# Columns in this order when present; the roofline column is always shown (empty with a note if unknown).
SHOWN = ("decode_tok_s", "ttft_s", "hit_rate", "misses_per_token", "h2d_bytes_per_token", "prompt_h2d_bytes",
         "roofline_tok_s", "kernels_per_step", "hbm_roofline_tok_s", "hbm_fraction")
RATIO_OF = ("decode_tok_s", "ttft_s")
DIGITS = {"decode_tok_s": 1, "ttft_s": 3, "prefill_tok_s": 0, "roofline_tok_s": 1, "hit_rate": 3,
          "misses_per_token": 1, "h2d_bytes_per_token": 0, "prompt_h2d_bytes": 0, "kernels_per_step": 0,
          "hbm_roofline_tok_s": 0, "hbm_fraction": 3}


def _fmt(s: dict | None, digits: int) -> str:
    if not s or not s.get("n"):
        return "-"
    f = f"{{:.{digits}f}}"
    if s["n"] == 1:
        return f.format(s["median"])
    return f"{f.format(s['median'])} ({f.format(s['mean'])}) [{f.format(s['min'])}-{f.format(s['max'])}]"


def _ratio(row: dict | None, metric: str) -> str:
    """'median 0.64, 1 of 3 pairs faster' over 'pairs 2.47 0.64 0.44', flagged when noisy."""
    if not row or not row.get("ratios"):
        return ""
    higher = METRICS[metric][2]
    word = "faster" if higher or metric == "ttft_s" else "better"
    n = len(row["ratios"])
    per = " ".join(f"{r:.2f}" for r in row["ratios"])
    flag = " (noisy)" if is_noisy(row["ratios"], row["ratio"]["median"]) else ""
    return f"median {row['ratio']['median']:.2f}, {row['better_pairs']} of {n} pair{'s' if n != 1 else ''} {word}{flag}\npairs {per}"


def is_noisy(ratios: Sequence[float], median: float) -> bool:
    """The pairs disagree more than the median ratio claims: their spread (max - min) exceeds the claimed
    change |median - 1| (a 1.05 claim from pairs 0.9..1.2 is not a result). One pair has no spread to read."""
    return len(ratios) > 1 and max(ratios) - min(ratios) > abs(median - 1.0)


def noise_notes(rows: Sequence[dict]) -> list[str]:
    out = []
    for r in rows:
        if r.get("metric") in RATIO_OF and r.get("ratios") and is_noisy(r["ratios"], r["ratio"]["median"]):
            lo, hi, med = min(r["ratios"]), max(r["ratios"]), r["ratio"]["median"]
            out.append(f"noise: {r['case']} {METRICS[r['metric']][0]} {r['arm']}: the pairs' ratios span "
                       f"{lo:.2f}-{hi:.2f} ({hi / lo:.1f}x), wider than the {abs(med - 1) * 100:.0f}% change the median "
                       f"{med:.2f} claims; not a result: rerun with more --pairs on a quiet machine")
    return out


# Records from before --sampling decoded greedily with the token on the GPU.
_LOOPS = {"model": "chat's loop, the checkpoint's sampling", "argmax": "greedy on the GPU"}


def render_run(record: dict, console: Console) -> None:
    rows = record.get("summary", [])
    arms = [a["name"] for a in record.get("arms", [])]
    present = {r["metric"] for r in rows if r["summary"].get("n")}
    metrics = [m for m in SHOWN if m in present or m == "roofline_tok_s"]
    ratio_metrics = [m for m in RATIO_OF if m in present and len(arms) > 1]
    by = {(r["case"], r["arm"], r["metric"]): r for r in rows}
    s = record.get("settings", {})
    title = (f"{record.get('model', {}).get('name', '?')} · {s.get('device') or 'auto'} · {s.get('pairs')} pairs · "
             f"{s.get('output_tokens')} output tokens · {_LOOPS.get(s.get('sampling'), _LOOPS['argmax'])} · "
             f"budget {s.get('vram_budget') or 'auto'}")
    table = Table(title=title, title_justify="left", caption=escape("median (mean) [min-max] over pairs; ratio = this arm / "
                                                          f"{arms[0] if arms else '?'} within each pair"), caption_justify="left")
    table.add_column("case", no_wrap=True)
    table.add_column("arm", no_wrap=True)
    for m in metrics:
        label, unit, _ = METRICS[m]
        table.add_column(f"{label} {unit}".strip(), overflow="fold")
    for m in ratio_metrics:
        table.add_column(f"{METRICS[m][0]} ratio", overflow="fold")
    cases = list(dict.fromkeys(r["case"] for r in rows))
    for i, case in enumerate(cases):
        if i:
            table.add_section()
        for arm in arms:
            cells = [_fmt(by.get((case, arm, m), {}).get("summary"), DIGITS[m]) for m in metrics]
            cells += [_ratio(by.get((case, arm, m)), m) for m in ratio_metrics]
            table.add_row(case, arm, *cells)
    console.print(table)
    if "roofline_tok_s" not in present:
        console.print("[dim]roofline: empty, it needs the H2D bytes per step (engine stats h2d_bytes, offloaded "
                      "experts only) and the link speed from the probe (GPU), or the device time per step (gpu_s).[/]")
    for note in noise_notes(rows):
        console.print(f"[yellow]{escape(note)}[/]")
    for skip in record.get("skipped_cases", []):
        console.print(f"[yellow]skipped {skip['case']}:[/] {skip['why']}")
    for note in record.get("notes", []):
        console.print(f"[dim]{note}[/]")


def render_compare(a: dict, b: dict, rows: Sequence[dict], names: tuple[str, str], console: Console) -> None:
    def who(r: dict) -> str:
        src = r.get("source", {})
        return f"{src.get('short') or '?'}{'+dirty' if src.get('dirty') else ''} {r.get('machine', {}).get('gpu_name') or 'cpu'}"

    table = Table(title=f"A = {names[0]} ({who(a)})\nB = {names[1]} ({who(b)})", title_justify="left",
                  caption="B/A is a ratio of medians across two runs (not paired: run-to-run drift included)",
                  caption_justify="left")
    for col in ("case", "arm", "metric", "A", "B", "B/A"):
        table.add_column(col, overflow="fold")
    for r in rows:
        if r["metric"] not in SHOWN and r["metric"] != "prefill_tok_s":
            continue
        d = DIGITS.get(r["metric"], 3)
        label, unit, _ = METRICS.get(r["metric"], (r["metric"], "", True))
        table.add_row(r["case"], r["arm"], f"{label} {unit}".strip(), _fmt(r["a"], d), _fmt(r["b"], d),
                      f"{r['ratio']:.3f}" if r["ratio"] is not None else "-")
    console.print(table)
    if not rows:
        console.print("[yellow]The two runs share no (case, arm, metric): nothing to compare.[/]")
