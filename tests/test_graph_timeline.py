"""scripts/graph_timeline.py: each kernel of a graph replay charged the time it moved the step's end, on traces
made up here: a serial chain with a gap, a programmatic launch that starts early, a side stream's kernel, several
replays; the charges add up to the span; a trace that does not split into equal replays is refused."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from graph_timeline import charges, replays, timeline  # noqa: E402


def _k(name: str, start: float, end: float, grid: str = "[1, 1, 1]") -> dict:
    return {"cat": "kernel", "name": name, "ts": start, "dur": end - start,
            "args": {"grid": grid, "block": "[32, 1, 1]"}}


def test_a_serial_chain_is_charged_its_durations_and_the_gap_is_idle():
    rows, span, idle = charges([_k("a", 0, 10), _k("b", 10, 15), _k("c", 20, 30)])
    assert [(key[0], d, c) for key, d, c in rows] == [("a", 10, 10), ("b", 5, 5), ("c", 10, 15)]
    assert span == 30 and idle == 5


def test_an_early_launch_is_charged_only_past_its_predecessors_end():
    """Programmatic launch: b's first block is resident at 2 and waits; it ends 4 after a."""
    rows, span, idle = charges([_k("a", 0, 10), _k("b", 2, 14)])
    assert [(key[0], d, c) for key, d, c in rows] == [("a", 10, 10), ("b", 12, 4)]
    assert span == 14 and idle == 0


def test_a_side_streams_kernel_inside_the_chain_adds_nothing_to_the_span():
    rows, span, idle = charges([_k("a", 0, 10), _k("side", 1, 5), _k("b", 10, 12)])
    assert sum(c for _, _, c in rows) == span == 12 and idle == 0


def test_replays_are_averaged_and_launch_shapes_told_apart():
    one = [_k("gemv", 0, 10, "[512, 1, 1]"), _k("gemv", 10, 30, "[800, 1, 1]"), _k("topk", 30, 31)]
    two = [dict(ev, ts=ev["ts"] + 100) for ev in one]
    two[1]["dur"], two[2]["ts"] = 30, 140  # the second replay's in_proj is slower, the top-k after it
    t = timeline(one + two, 2)
    rows = {(name, shape): (n, d, c) for name, shape, n, d, c in t["rows"]}
    assert rows[("gemv", "[800, 1, 1] x [32, 1, 1]")] == (1.0, 25.0, 25.0)
    assert rows[("gemv", "[512, 1, 1] x [32, 1, 1]")] == (1.0, 10.0, 10.0)
    assert t["kernels_per_replay"] == 3 and t["span_us"] == 36.0 and t["idle_us"] == 0.0
    assert t["rows"][0][:2] == ("gemv", "[800, 1, 1] x [32, 1, 1]")  # the largest charge first


def test_a_trace_that_does_not_split_into_replays_is_refused():
    with pytest.raises(ValueError, match="equal length"):
        replays([_k("a", 0, 1), _k("b", 1, 2), _k("c", 2, 3)], 2)
    assert len(replays([{"cat": "cpu_op", "ts": 0}] + [_k("a", 0, 1), _k("b", 1, 2)], 2)) == 2
