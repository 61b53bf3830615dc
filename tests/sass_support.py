"""Helpers for the tests that read sm_90 code compiled here (no GPU): a script run in a fresh interpreter (not
Triton's: TRITON_INTERPRET removed), scripts/ on its path, its last line of JSON returned."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

SCRIPTS = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "scripts"))


def sm90_json(source: str, tmp_path) -> dict:
    """Run `source` with argv [tmp_path, scripts/] and scripts/ on sys.path; its last stdout line as JSON. Skips
    where this Triton build has no cuobjdump to read the code with."""
    env = {key: v for key, v in os.environ.items() if key != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {SCRIPTS!r})\n{source}",
                          str(tmp_path), SCRIPTS], env=env, capture_output=True, text=True, timeout=300)
    if run.returncode and "cuobjdump" in run.stderr:
        pytest.skip("no cuobjdump in this Triton build: the sm_90 code cannot be inspected here")
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.splitlines()[-1])
