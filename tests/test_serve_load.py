"""A bounded load test on loopback (4 concurrent clients x 5 requests, max_tokens 6): nothing lost or mixed up.

The figures recorded in docs/serve_load.txt come from the same code at 4 x 25:
`python -m qwenlocal.app.serve.loadtest --out docs/serve_load.txt`.
"""
from __future__ import annotations

from pathlib import Path
import sys

import pytest

from qwenlocal.app.serve.loadtest import report, run_load

sys.path.insert(0, str(Path(__file__).resolve().parent))  # serve_support sits beside this file
from serve_support import serve  # noqa: E402


@pytest.fixture(scope="module")
def served(tiny_ckpt):
    s = serve(tiny_ckpt, max_waiting=4)
    yield s
    s.stop()


def test_concurrent_replies_match_a_serial_replay(served):
    fig = run_load(served.url + "/v1", clients=4, per_client=5, max_tokens=6)
    print(report(fig, served.url))
    assert fig["ok"] == fig["requests"] == 20, fig["errors"]
    assert fig["mismatched"] == [] and fig["replay_errors"] == []
    counters = served.health()["counters"]
    assert counters["rejected_full"] == 0 and counters["failed"] == 0
    assert counters["completed"] == 1 + 20 + 20  # warm-up, the load, the replay
