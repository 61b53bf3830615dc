"""scripts/ncu_summary.py: ncu's raw CSV (header, units row, one row a kernel) as one row a launch shape."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import ncu_summary  # noqa: E402

STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
HEADER = ["ID", "Kernel Name", "Grid Size", "Block Size", "gpu__time_duration.sum", "dram__bytes_read.sum",
          STALL.format("long_scoreboard"), STALL.format("barrier"), "launch__registers_per_thread"]
UNITS = ["", "", "", "", "usecond", "Mbyte", "", "", "register/thread"]


def _csv(tmp_path, rows) -> str:
    lines = ["==PROF== Disconnected from process 1"]
    for r in [HEADER, UNITS, *rows]:
        lines.append(",".join(f'"{v}"' for v in r))
    path = tmp_path / "raw.csv"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_launches_of_one_shape_are_averaged_and_sorted_by_total_time(tmp_path):
    rows = [["0", "gemv(float*)", "(512, 1, 1)", "(128, 1, 1)", "4", "8", "3.0", "1.0", "80"],
            ["1", "gemv(float*)", "(512, 1, 1)", "(128, 1, 1)", "6", "8", "5.0", "1.0", "80"],
            ["2", "gemv(float*)", "(15520, 1, 1)", "(128, 1, 1)", "1,300", "272", "n/a", "0.5", "80"],
            ["3", "topk(int*)", "(1, 1, 1)", "(32, 1, 1)", "2", "0.001", "0.2", "9.0", "40"]]
    rows_read, units = ncu_summary.read_rows(_csv(tmp_path, rows))
    table = ncu_summary.summarise(rows_read, units)
    assert [(s["kernel"], s["grid"], s["launches"]) for s in table] == [
        ("gemv", "(15520, 1, 1)", 1), ("gemv", "(512, 1, 1)", 2), ("topk", "(1, 1, 1)", 1)]
    lm, small, topk = table
    assert lm["us"] == 1300.0 and lm["dram_rd"] == 272.0  # '1,300': ncu's thousands separator
    assert abs(lm["gbps"] - 272e-3 / 1300e-6 / 1e3 * 1e3) < 1e-9  # MB / us -> GB/s
    assert small["us"] == 5.0 and small["stalls"][0] == (4.0, "long_scoreboard")
    assert lm["stalls"] == [(0.5, "barrier")]  # 'n/a' is no figure
    assert topk["stalls"][0][1] == "barrier" and small["occ"] is None  # a metric not collected stays None


def test_units_are_scaled_to_us_and_mb(tmp_path):
    units = dict(zip(HEADER, UNITS))
    units["gpu__time_duration.sum"] = "nsecond"
    units["dram__bytes_read.sum"] = "Kbyte"
    row = dict(zip(HEADER, ["0", "k", "(1, 1, 1)", "(32, 1, 1)", "2,500", "300", "1", "1", "32"]))
    assert ncu_summary.scaled(row, units, "gpu__time_duration.sum") == 2.5
    assert ncu_summary.scaled(row, units, "dram__bytes_read.sum") == 0.3
    assert ncu_summary.scaled(row, units, "not_a_metric") is None
