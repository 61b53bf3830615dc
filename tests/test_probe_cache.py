"""The probe cache: hits, every kind of miss (counted on a fake measure), atomic writes under racing writers."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from qwenlocal.engine.probe import cache, fake
from qwenlocal.engine.probe.measure import GpuIdentity
from qwenlocal.engine.probe.profile import Fact, HardwareProfile, fact_names, measured, read

VERSION = "0.1.0"


class FakeMeasure:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, depth: str = "quick", index: int = 0) -> HardwareProfile:
        self.calls.append(depth)
        n = len(self.calls)
        return dataclasses.replace(fake.wsl2_rtx5070ti(), h2d_pinned_gbps=measured(40.0 + n), qwenlocal_version=VERSION,
                                   probed_at=f"call-{n}", probe_seconds=0.1, depth=depth)


def ident(gpu: str = "GPU-aaaa", driver: str = "580.1"):
    return lambda index=0: GpuIdentity(gpu=gpu, driver=driver, name="fake")


def get(tmp_path: Path, measure: FakeMeasure, *, gpu="GPU-aaaa", driver="580.1", version=VERSION, **kw):
    return cache.get_profile(directory=tmp_path, measure=measure, identify=ident(gpu, driver),
                             refresh_volatile=lambda p, index=0: p, version=version, **kw)


def test_second_call_uses_the_cache(tmp_path: Path) -> None:
    m = FakeMeasure()
    first = get(tmp_path, m)
    second = get(tmp_path, m)
    assert len(m.calls) == 1
    assert not first.from_cache and second.from_cache
    assert second.profile == first.profile
    assert second.path == first.path and first.path.parent == tmp_path


@pytest.mark.parametrize("garbage", [b"", b"{", b"\x00\xff\xfe", b"[]", b'{"file_schema": 1}',
                                     b'{"file_schema": 1, "key": {"gpu": "GPU-aaaa", "driver": "580.1", '
                                     b'"qwenlocal": "0.1.0"}, "profile": {"schema": 1, "facts": {}}}'])
def test_corrupt_file_is_measured_again_and_replaced(tmp_path: Path, garbage: bytes) -> None:
    m = FakeMeasure()
    path = get(tmp_path, m).path
    path.write_bytes(garbage)
    again = get(tmp_path, m)
    assert len(m.calls) == 2 and not again.from_cache
    assert "measuring again" in again.note
    assert get(tmp_path, m).from_cache and len(m.calls) == 2  # the replacement is valid


def test_truncated_file_is_measured_again(tmp_path: Path) -> None:
    m = FakeMeasure()
    path = get(tmp_path, m).path
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    assert not get(tmp_path, m).from_cache and len(m.calls) == 2


def test_other_gpu_is_measured_again(tmp_path: Path) -> None:
    m = FakeMeasure()
    a = get(tmp_path, m, gpu="GPU-aaaa")
    b = get(tmp_path, m, gpu="GPU-bbbb")
    assert len(m.calls) == 2 and not b.from_cache and a.path != b.path
    assert get(tmp_path, m, gpu="GPU-aaaa").from_cache and get(tmp_path, m, gpu="GPU-bbbb").from_cache
    assert len(m.calls) == 2


def test_a_file_holding_another_gpus_profile_is_a_miss(tmp_path: Path) -> None:
    m = FakeMeasure()
    path = get(tmp_path, m, gpu="GPU-aaaa").path
    raw = json.loads(path.read_text())
    raw["key"]["gpu"] = "GPU-zzzz"  # e.g. a name-keyed file shared by two identical GPUs, or a copied cache
    path.write_text(json.dumps(raw))
    again = get(tmp_path, m, gpu="GPU-aaaa")
    assert not again.from_cache and len(m.calls) == 2 and "another gpu" in again.note


def test_other_driver_or_version_is_measured_again(tmp_path: Path) -> None:
    m = FakeMeasure()
    get(tmp_path, m)
    driver = get(tmp_path, m, driver="590.2")
    assert not driver.from_cache and "driver" in driver.note and len(m.calls) == 2
    version = get(tmp_path, m, driver="590.2", version="0.2.0")
    assert not version.from_cache and "qwenlocal" in version.note and len(m.calls) == 3
    assert get(tmp_path, m, driver="590.2", version="0.2.0").from_cache and len(m.calls) == 3


def test_refresh_and_depth(tmp_path: Path) -> None:
    m = FakeMeasure()
    get(tmp_path, m)
    assert not get(tmp_path, m, refresh=True).from_cache and m.calls == ["quick", "quick"]
    full = get(tmp_path, m, depth="full")  # a quick profile does not answer a full request
    assert not full.from_cache and m.calls[-1] == "full"
    assert get(tmp_path, m).from_cache and get(tmp_path, m, depth="full").from_cache  # full answers both
    assert len(m.calls) == 3


def test_volatile_facts_are_refreshed_on_a_hit(tmp_path: Path) -> None:
    m = FakeMeasure()
    get(tmp_path, m)
    fresh = read(123, "re-read")
    hit = cache.get_profile(directory=tmp_path, measure=m, identify=ident(), version=VERSION,
                            refresh_volatile=lambda p, index=0: p.with_facts(vram_free=fresh))
    assert hit.from_cache and hit.profile.vram_free == fresh


def test_unwritable_cache_still_returns_the_profile(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    m = FakeMeasure()
    result = get(blocker, m)
    assert result.path is None and result.profile.depth == "quick" and "could not write" in result.note


def test_round_trip_and_strict_parsing() -> None:
    profile = fake.wsl2_rtx5070ti(microbench={"off": 100.0, "copy-side": 96.5, "shared-side": 97.25})
    raw = json.loads(json.dumps(profile.to_dict()))
    assert HardwareProfile.from_dict(raw) == profile
    for source in ("measured", "read", "assumed", "unavailable"):
        assert source in {getattr(profile, n).source for n in fact_names()}
    bad = json.loads(json.dumps(raw))
    del bad["facts"]["copy_engines"]
    with pytest.raises(ValueError, match="missing"):
        HardwareProfile.from_dict(bad)
    bad = json.loads(json.dumps(raw))
    bad["facts"]["copy_engines"]["source"] = "guessed"
    with pytest.raises(ValueError):
        HardwareProfile.from_dict(bad)
    with pytest.raises(ValueError, match="schema"):
        HardwareProfile.from_dict({**raw, "schema": 99})
    with pytest.raises(ValueError):
        Fact(3, "unavailable", "")


def test_cache_root_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QWENLOCAL_CACHE_DIR", str(tmp_path / "c"))
    assert cache.cache_root() == tmp_path / "c"
    monkeypatch.delenv("QWENLOCAL_CACHE_DIR")
    monkeypatch.setenv("QWENLOCAL_HOME", str(tmp_path / "h"))
    assert cache.cache_root() == tmp_path / "h" / "cache"


def _profiles(n: int) -> list[HardwareProfile]:
    # Different sizes, so a torn write could not pass for a whole one.
    return [fake.wsl2_rtx5070ti(name="GPU " + "x" * (i * 97 % 3000)) for i in range(n)]


def _check_whole(path: Path, identity: GpuIdentity, errors: list[str], stop: threading.Event) -> None:
    seen = 0
    while not stop.is_set() or seen == 0:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            continue
        seen += 1
        try:
            profile, why = cache.load(path, identity, VERSION, depth="fake")
            if profile is None:
                errors.append(why)
        except Exception as exc:  # noqa: BLE001
            errors.append(f"{type(exc).__name__}: {exc} ({len(data)} bytes)")


def _race_threads(tmp_path: Path, save) -> tuple[list[str], Path, list[HardwareProfile]]:
    identity = GpuIdentity("GPU-aaaa", "580.1")
    path = cache.cache_path(identity, tmp_path)
    profiles = _profiles(8)
    errors: list[str] = []
    stop = threading.Event()
    reader = threading.Thread(target=_check_whole, args=(path, identity, errors, stop))
    reader.start()

    def writer(i: int) -> None:
        for _ in range(25):
            assert save(path, identity, VERSION, profiles[i])

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    reader.join()
    return errors, path, profiles


def test_concurrent_thread_writers_never_leave_a_half_file(tmp_path: Path) -> None:
    errors, path, profiles = _race_threads(tmp_path, cache.save)
    assert errors == []
    assert cache.load(path, GpuIdentity("GPU-aaaa", "580.1"), VERSION, depth="fake")[0] in profiles
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temp files left behind


def test_negative_control_a_plain_write_is_caught(tmp_path: Path) -> None:
    """The same race with an in-place (non-atomic) writer must be seen tearing, or the test above proves nothing."""

    def torn_save(path: Path, identity, version: str, profile: HardwareProfile) -> bool:
        data = json.dumps({"file_schema": cache.FILE_SCHEMA, "key": {"gpu": identity.gpu, "driver": identity.driver,
                                                                     "qwenlocal": version},
                           "profile": profile.to_dict()})
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(data[: len(data) // 2])
            fh.flush()
            time.sleep(0.002)
            fh.write(data[len(data) // 2:])
        return True

    errors, _, _ = _race_threads(tmp_path, torn_save)
    assert errors, "a torn writer went unnoticed: the race check cannot fail"


WRITER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from qwenlocal.engine.probe import cache, fake
    from qwenlocal.engine.probe.measure import GpuIdentity
    path, i = Path(sys.argv[1]), int(sys.argv[2])
    identity = GpuIdentity("GPU-aaaa", "580.1")
    profile = fake.wsl2_rtx5070ti(name="GPU " + "y" * (i * 1013 % 5000))
    for _ in range(30):
        assert cache.save(path, identity, "0.1.0", profile)
    assert "torch" not in sys.modules, "the probe cache must not import torch"
""")


def test_concurrent_process_writers_never_leave_a_half_file(tmp_path: Path) -> None:
    identity = GpuIdentity("GPU-aaaa", "580.1")
    path = cache.cache_path(identity, tmp_path)
    errors: list[str] = []
    stop = threading.Event()
    reader = threading.Thread(target=_check_whole, args=(path, identity, errors, stop))
    reader.start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("QWENLOCAL_")}
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(i)], env=env, stderr=subprocess.PIPE)
             for i in range(4)]
    outs = [(p.wait(timeout=120), p.stderr.read().decode()) for p in procs]
    stop.set()
    reader.join()
    assert all(rc == 0 for rc, _ in outs), outs
    assert errors == []
    assert cache.load(path, identity, VERSION, depth="fake")[0] is not None
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_update_profile_stores_a_microbench_result_the_plan_reads(tmp_path: Path) -> None:
    from qwenlocal.engine.plan import QWEN36_35B_A3B_NVFP4, resolve_plan

    m = FakeMeasure()
    kw = dict(directory=tmp_path, measure=m, identify=ident(), refresh_volatile=lambda p, index=0: p, version=VERSION)
    assert resolve_plan(cache.get_profile(**kw).profile, QWEN36_35B_A3B_NVFP4).overlap == "shared-side"
    times = {"off": 100.0, "copy-side": 95.0, "shared-side": 98.0}
    cache.update_profile(lambda p: p.with_facts(overlap_microbench=measured(times, "fake bench")), **kw)
    again = cache.get_profile(**kw)
    assert again.from_cache and len(m.calls) == 1
    assert again.profile.value("overlap_microbench") == times
    assert resolve_plan(again.profile, QWEN36_35B_A3B_NVFP4).overlap == "copy-side"
