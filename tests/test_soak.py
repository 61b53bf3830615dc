"""The soak's quick mode (scripts/soak.py --quick, CPU, demo model): 60 chat turns with regenerate, edit, cancel
and context overflow through the chat backend, then ~30 s of `qwenlocal serve` under 4 concurrent clients.
Nothing may be lost, failed or mixed up, and RSS growth must stay under the soak's bound (32 MiB).

The full soak (300+ turns, 10 minutes of serve) is recorded in docs/RESULTS.md (session 6).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "soak.py"
BOUND_MIB = 32.0


def test_quick_soak_loses_and_mixes_nothing(tmp_path):
    out = tmp_path / "soak.json"
    env = dict(os.environ, QWENLOCAL_HOME=str(tmp_path / "home"))
    run = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--rss-bound-mib", str(BOUND_MIB),
                          "--json", str(out)], env=env, capture_output=True, text=True, timeout=300)
    print(run.stdout, run.stderr[-3000:])
    fig = json.loads(out.read_text())
    chat, serve = fig["chat"], fig["serve"]

    assert chat["turns"] == 60
    assert chat["lost"] == [] and chat["mismatched"] == [] and chat["store_bad"] == []
    # Every kind of action ran and did what it should: regenerate/edit replies matched, cancels took, the
    # conversation overflowed the context, and a message too long by itself was refused.
    assert {"new", "long", "regen", "edit", "cancel", "huge"} <= set(chat["actions"])
    assert chat["cancels_ok"] > 0 and chat["cancels_ok"] + chat["cancel_early"] == chat["actions"]["cancel"]
    assert chat["trimmed_turns"] > 0 and chat["refused_ok"] >= chat["actions"]["huge"]
    assert chat["replies_ok"] + chat["cancels_ok"] + chat["refused_ok"] + chat["actions"].get("newchat", 0) == 60
    assert chat["distinct_replies"] > 30  # the replay check tells requests apart: replies differ by prompt

    assert serve["requests"] > 20 and serve["ok"] == serve["requests"] and serve["failed"] == 0
    assert serve["mismatched_n"] == 0 and serve["reference_errors"] == []
    assert serve["distinct_reference_replies"] > 16
    assert serve["server_counters"]["failed"] == 0 and serve["server_exit"] == 0

    for part in (chat, serve):
        assert part["rss"]["samples"] >= 5
        assert part["rss"]["growth_mib"] < BOUND_MIB, part["rss"]
    assert fig["pass"] and run.returncode == 0
