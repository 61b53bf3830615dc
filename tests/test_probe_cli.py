"""`qwenlocal probe` on this machine: runs, prints valid JSON, and says when there is no CUDA GPU."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from qwenlocal.app.cli import main


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QWENLOCAL_")}
    env.update(QWENLOCAL_CACHE_DIR=str(tmp_path), COLUMNS="160", **extra)
    return env


def _assert_cpu_plan_or_ram_error(data: dict) -> None:
    """The CPU path holds the 35B model's weights in float32 (~129 GiB): the plan exists exactly when this
    machine's RAM holds them, and the download fit check says the same (engine/memory.py for both)."""
    from qwenlocal.app.fit import check_fit
    from qwenlocal.engine.probe.profile import HardwareProfile
    from qwenlocal.engine.registry import find_known

    known = find_known("qwen3.6-35b-a3b-nvfp4")
    fit = check_fit(known.facts, HardwareProfile.from_dict(data["profile"]), device="cpu", params=known.params)
    if data["plan"] is None:
        assert data["plan_error"]["kind"] == "ResourceError" and "host RAM" in data["plan_error"]["message"]
        assert not fit.ok, fit.message()
    else:
        assert data["plan"]["device"] == "cpu" and data["plan"]["overlap"] == "off"
        assert data["plan"]["reasons"]["device"]
        assert fit.ok, fit.message()


def test_probe_json_in_a_subprocess(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "qwenlocal.app.cli", "probe", "--json"], env=_env(tmp_path),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert set(data) >= {"cuda_available", "profile", "plan", "plan_error", "cache", "model", "runtime_s"}
    facts = data["profile"]["facts"]
    assert data["cuda_available"] == facts["cuda_available"]["value"]
    for fact in facts.values():
        assert fact["source"] in ("measured", "read", "assumed", "unavailable")
    if not data["cuda_available"]:  # this CI machine: CPU-only torch, no GPU
        assert "no CUDA GPU" in data["cuda_note"]
        assert facts["gpu_name"]["source"] == "unavailable"
        _assert_cpu_plan_or_ram_error(data)
    assert data["cache"]["path"] and Path(data["cache"]["path"]).is_file()
    assert Path(data["cache"]["path"]).is_relative_to(tmp_path)


def test_probe_forced_no_cuda_table_and_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("QWENLOCAL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("QWENLOCAL_NO_CUDA", "1")
    monkeypatch.setenv("COLUMNS", "160")
    assert main(["probe"]) == 0
    text = capsys.readouterr().out
    assert "No CUDA GPU found" in text and "QWENLOCAL_NO_CUDA" in text
    assert "Hardware profile" in text and "Plan for Qwen3.6-35B-A3B NVFP4" in text
    assert "measured now" in text
    assert main(["probe", "--json", "--overlap", "copy-side"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["cuda_available"] is False and data["cache"]["from_cache"] is True
    _assert_cpu_plan_or_ram_error(data)
    if data["plan"] is not None:
        assert data["plan"]["overlap"] == "off" and "overlap" in data["plan"]["overridden"]
    assert main(["probe", "--json", "--refresh"]) == 0
    assert json.loads(capsys.readouterr().out)["cache"]["from_cache"] is False


def test_probe_plan_error_is_reported_not_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("QWENLOCAL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("QWENLOCAL_NO_CUDA", "1")
    assert main(["probe", "--json", "--device", "cuda"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["plan"] is None and data["plan_error"]["kind"] == "FeatureUnavailableError"
    assert main(["probe", "--vram-budget", "lots"]) == 1  # a bad option is the CLI's error, before any probing
    assert "vram_budget" in capsys.readouterr().err


def test_probe_modules_import_without_torch() -> None:
    code = ("import sys; import qwenlocal.engine.probe, qwenlocal.engine.probe.measure, qwenlocal.engine.plan, "
            "qwenlocal.app.commands.probe; assert 'torch' not in sys.modules, 'torch imported at import time'")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
