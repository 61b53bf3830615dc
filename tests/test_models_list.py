"""`qwenlocal models`: what is on disk (the app's model folder and the HF cache, read by the real
huggingface_hub), the known names not downloaded, sizes, formats and the same fit verdict as `download`/`chat`."""
import hashlib
import json
import os

import pytest

from fakehub import COMMIT, install, make_cached_snapshot
from qwenlocal.app import hub
from qwenlocal.app.cli import main
from qwenlocal.app.inventory import INCOMPLETE, NOT_DOWNLOADED, READY, checkpoint_format, list_models
from qwenlocal.engine.probe.fake import fake_gpu_profile
from qwenlocal.engine.registry import KNOWN_MODELS, find_known

NVFP4_REPO = "nvidia/Qwen3.6-35B-A3B-NVFP4"
# Shard sizes as published (sparse files here: the length without the bytes).
SHARDS = {"model-00001-of-00002.safetensors": 12_000_000_000, "model-00002-of-00002.safetensors": 11_407_457_492}


@pytest.fixture()
def home(monkeypatch, tmp_path):
    from huggingface_hub import constants

    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("QWENLOCAL_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(hub, "free_disk_bytes", lambda path: 500 * 2**30)
    return cache


def _sparse_snapshot(cache, repo_id, config: dict, shards: dict[str, int]):
    """A full-size checkpoint in the HF cache layout, shards as sparse blobs (no data written)."""
    storage = cache / ("models--" + repo_id.replace("/", "--"))
    snap, blobs = storage / "snapshots" / COMMIT, storage / "blobs"
    snap.mkdir(parents=True)
    blobs.mkdir()
    (storage / "refs").mkdir()
    (storage / "refs" / "main").write_text(COMMIT)
    index = {"metadata": {"total_size": sum(shards.values())}, "weight_map": {f"w{i}": n for i, n in enumerate(shards)}}
    files = {"config.json": json.dumps(config), "tokenizer.json": "{}", hub.INDEX: json.dumps(index)}
    for name, text in files.items():
        blob = blobs / hashlib.sha256(text.encode()).hexdigest()
        blob.write_text(text)
        os.symlink(os.path.relpath(blob, snap), snap / name)
    for i, (name, size) in enumerate(shards.items()):
        blob = blobs / f"{i:064x}"
        with open(blob, "wb") as fh:
            fh.truncate(size)
        os.symlink(os.path.relpath(blob, snap), snap / name)
    return storage


def _files_bytes(folder):
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def test_nothing_downloaded_lists_the_known_names_and_says_how(home, monkeypatch, capsys):
    monkeypatch.setattr("qwenlocal.app.models.machine_profile", lambda: fake_gpu_profile(ram_total=64.0))
    entries = list_models()
    assert [e.repo_id for e in entries] == [k.repo_id for k in KNOWN_MODELS]
    assert all(e.status == NOT_DOWNLOADED and e.path is None for e in entries)
    assert [e.size_bytes for e in entries] == [k.download_bytes for k in KNOWN_MODELS]
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "No checkpoint is downloaded yet" in out and "qwenlocal download qwen3.6-35b-a3b-nvfp4" in out
    assert out.count("not downloaded") >= len(KNOWN_MODELS)


def test_lists_what_is_on_disk_with_sizes_and_formats(home, tiny_ckpt, tmp_path):
    from qwenlocal.app.models import ensure_demo_model
    from qwenlocal.app.paths import models_dir
    from qwenlocal.engine.quant.convert import quantize_checkpoint

    demo = ensure_demo_model()
    quantize_checkpoint(tiny_ckpt, models_dir() / "tiny-nvfp4")
    staging = models_dir() / ".half.partial"  # a `download --dir .../half` that stopped
    staging.mkdir()
    (staging / "model-00001-of-00003.safetensors").write_bytes(b"\0" * 1000)
    make_cached_snapshot(home, "acme/tiny-moe", tiny_ckpt)
    nvfp4 = _sparse_snapshot(home, NVFP4_REPO, {"model_type": "qwen3_5_moe"}, SHARDS)
    other = home / "models--someone--bert" / "snapshots" / COMMIT
    other.mkdir(parents=True)
    (other / "config.json").write_text('{"model_type": "bert"}')  # another project's model: not listed
    (home / "models--someone--bert" / "refs").mkdir()
    (home / "models--someone--bert" / "refs" / "main").write_text(COMMIT)

    entries = {e.name: e for e in list_models(profile=fake_gpu_profile(ram_total=64.0, ram_available=60.0))}
    assert set(entries) == {"demo-tiny", str(models_dir() / "tiny-nvfp4"), str(models_dir() / "half"),
                            "acme/tiny-moe", "qwen3.6-35b-a3b-nvfp4", "qwen3.6-35b-a3b", "qwen3.5-35b-a3b"}
    d = entries["demo-tiny"]
    assert (d.status, d.format, d.is_demo, d.verdict.fits) == (READY, "BF16", True, "yes")
    assert d.size_bytes == _files_bytes(demo) > 0
    q = entries[str(models_dir() / "tiny-nvfp4")]
    assert (q.status, q.format, q.verdict.fits) == (READY, "NVFP4", "yes")
    assert q.size_bytes == _files_bytes(models_dir() / "tiny-nvfp4")
    half = entries[str(models_dir() / "half")]
    assert half.status == INCOMPLETE and half.size_bytes == 1000 and "--dir" in half.note
    t = entries["acme/tiny-moe"]
    assert (t.status, t.format, t.source) == (READY, "BF16", "hf-cache")
    assert t.size_bytes == _files_bytes(tiny_ckpt)  # the blobs, not counted again through the snapshot links
    n = entries["qwen3.6-35b-a3b-nvfp4"]
    assert (n.status, n.format, n.repo_id, n.source) == (READY, "NVFP4", NVFP4_REPO, "hf-cache")
    assert n.size_bytes == _files_bytes(nvfp4 / "blobs") > sum(SHARDS.values())
    assert entries["qwen3.6-35b-a3b"].status == NOT_DOWNLOADED
    assert checkpoint_format(other) == "?"


def test_a_cache_download_cut_short_is_incomplete(home):
    storage = _sparse_snapshot(home, NVFP4_REPO, {"model_type": "qwen3_5_moe"}, SHARDS)
    os.remove(storage / "snapshots" / COMMIT / "model-00002-of-00002.safetensors")
    (e,) = [e for e in list_models(with_fit=False) if e.repo_id == NVFP4_REPO]
    assert e.status == INCOMPLETE and "model-00002-of-00002.safetensors" in e.note and "download" in e.note
    assert e.verdict.fits == "unknown"


def test_fit_verdicts_are_the_download_and_load_checks(home, monkeypatch, tiny_ckpt, capsys):
    """Not downloaded: download's own report (disk included). On disk: resolve's check before loading."""
    from qwenlocal.app.commands.download import download_fit_report
    from qwenlocal.app.models import fit_check, resolve_model

    profile = fake_gpu_profile(ram_total=32.0, ram_available=30.0)
    _sparse_snapshot(home, NVFP4_REPO, {"model_type": "qwen3_5_moe"}, SHARDS)
    entries = {e.name: e for e in list_models(profile=profile)}
    bf16 = entries["qwen3.6-35b-a3b"]
    want = download_fit_report(find_known("qwen3.6-35b-a3b"), "Qwen/Qwen3.6-35B-A3B", bf16.size_bytes, profile=profile)
    assert bf16.verdict.report == want and not want.ok
    assert bf16.verdict.fits == "no" and "60.0 GiB" in bf16.verdict.why
    nv = entries["qwen3.6-35b-a3b-nvfp4"]
    loaded = fit_check(resolve_model("qwen3.6-35b-a3b-nvfp4", check_fit=False), profile=profile, force=True)
    assert nv.verdict.report.items == loaded.items
    assert nv.verdict.fits == ("caveats" if loaded.warnings else "yes") and loaded.ok
    assert not any(i.what == "disk" for i in nv.verdict.report.items)  # on disk already: no download to fit
    # The CLI refuses the download the listing says does not fit (the fake hub lists it; nothing is fetched).
    fake = install(monkeypatch, {"Qwen/Qwen3.6-35B-A3B": tiny_ckpt}, home)
    monkeypatch.setattr("qwenlocal.app.models.machine_profile", lambda: profile)
    assert main(["download", "qwen3.6-35b-a3b", "--quiet"]) == 1
    assert "does not fit" in capsys.readouterr().err and fake.transferred == 0


def test_json_output(home, tiny_ckpt, monkeypatch, capsys):
    monkeypatch.setattr("qwenlocal.app.models.machine_profile", lambda: fake_gpu_profile(ram_total=32.0))
    make_cached_snapshot(home, "acme/tiny-moe", tiny_ckpt)
    assert main(["models", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["hf_cache"] == str(home) and data["models_dir"].endswith(os.path.join("home", "data", "models"))
    by_name = {m["name"]: m for m in data["models"]}
    tiny = by_name["acme/tiny-moe"]
    assert tiny["status"] == "ready" and tiny["format"] == "BF16" and tiny["fits"] == "yes"
    assert tiny["size_bytes"] == _files_bytes(tiny_ckpt) and tiny["path"].startswith(str(home))
    bf16 = by_name["qwen3.6-35b-a3b"]
    assert bf16["status"] == "not downloaded" and bf16["fits"] == "no" and bf16["report"]["ok"] is False
    assert {i["what"] for i in bf16["report"]["items"]} >= {"disk", "VRAM", "host RAM"}
    assert by_name["qwen3.6-35b-a3b-nvfp4"]["size_bytes"] == find_known("qwen3.6-35b-a3b-nvfp4").download_bytes


def test_the_fit_options_change_the_verdict_and_are_checked(home, monkeypatch, capsys):
    monkeypatch.setattr("qwenlocal.app.models.machine_profile", lambda: fake_gpu_profile(ram_total=64.0))
    assert main(["models", "--json", "--vram-budget", "2GiB"]) == 0
    data = json.loads(capsys.readouterr().out)
    nv = next(m for m in data["models"] if m["name"] == "qwen3.6-35b-a3b-nvfp4")
    assert nv["fits"] == "no" and "VRAM" in nv["why"]
    assert main(["models", "--vram-budget", "banana"]) == 1
    assert "not a size" in capsys.readouterr().err


def test_unprobeable_machine_says_unknown(home, monkeypatch):
    monkeypatch.setattr("qwenlocal.app.models.machine_profile", lambda: None)
    entries = list_models()
    assert {e.verdict.fits for e in entries} == {"unknown"}
    assert len(entries) == len(KNOWN_MODELS)


def test_cpu_only_verdict_counts_every_weight_at_float32_like_the_load_check(home, monkeypatch, capsys, tiny_ckpt):
    """`download` and `models` count the CPU path as resolve does before loading: 34.7 G params x 4 B."""
    from qwenlocal.engine.probe.fake import fake_cpu_profile

    cpu = fake_cpu_profile(ram_total=64.0, ram_available=60.0)
    monkeypatch.setattr("qwenlocal.app.models.machine_profile", lambda: cpu)
    nv = next(e for e in list_models() if e.name == "qwen3.6-35b-a3b-nvfp4")
    assert nv.verdict.fits == "no" and "32-bit: 129.1 GiB" in nv.verdict.why
    fake = install(monkeypatch, {NVFP4_REPO: tiny_ckpt}, home)
    assert main(["download", "qwen3.6-35b-a3b-nvfp4", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "does not fit" in err and "32-bit: 129.1 GiB" in err and fake.transferred == 0
