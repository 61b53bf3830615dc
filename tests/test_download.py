"""`qwenlocal download` against a fake local hub (tests/fakehub.py): the files fetched, resume after an
interrupted download, no half model folder, hub errors mapped to messages that say what to do. No network."""
import os
import shutil
import subprocess
import sys

import pytest

from fakehub import install
from qwenlocal.app import hub
from qwenlocal.app.cli import main
from qwenlocal.app.models import resolve_model
from qwenlocal.engine.errors import CheckpointError

REPO = "acme/tiny-moe"


@pytest.fixture()
def remote(tiny_ckpt, tmp_path):
    """The repo as the hub serves it: the checkpoint plus files the engine does not need."""
    repo = tmp_path / "remote"
    shutil.copytree(tiny_ckpt, repo)
    (repo / "preprocessor_config.json").write_text("{}")  # vision-only
    (repo / "README.md").write_text("model card")
    return repo


@pytest.fixture()
def fake(monkeypatch, remote, tmp_path):
    monkeypatch.setenv("QWENLOCAL_HOME", str(tmp_path / "home"))
    return install(monkeypatch, {REPO: remote}, tmp_path / "hf-cache")


def _size(folder):
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file() and p.name not in
               ("preprocessor_config.json", "README.md"))


def test_download_into_the_cache_fetches_only_engine_files_and_resolves(fake, remote):
    path = hub.download(REPO, progress=False)
    assert (path / "config.json").is_file() and (path / "tokenizer.json").is_file()
    assert not (path / "preprocessor_config.json").exists() and not (path / "README.md").exists()
    assert fake.transferred == _size(remote)
    got = resolve_model(REPO, check_fit=False)
    assert got.kind == "hub" and got.path == path and got.repo_id == REPO and got.target == path


def test_interrupted_cache_download_is_refused_then_resumes(fake, remote):
    fake.fail_after_bytes = _size(remote) // 2
    with pytest.raises(hub.HubError, match="--model"):
        hub.download(REPO, progress=False)
    sent_first = fake.transferred
    # The snapshot exists but lacks shards: resolution refuses it and says how to finish.
    with pytest.raises(CheckpointError, match="incomplete.*download acme/tiny-moe.*resumes"):
        resolve_model(REPO, check_fit=False)
    fake.fail_after_bytes = None
    path = hub.download(REPO, progress=False)
    assert fake.transferred == _size(remote), "the second run re-sent bytes the first had already written"
    assert fake.transferred - sent_first < _size(remote)
    assert resolve_model(REPO, check_fit=False).path == path


def test_interrupted_dir_download_leaves_no_model_folder(fake, remote, tmp_path):
    target = tmp_path / "models" / "tiny"
    fake.fail_after_bytes = _size(remote) // 3
    with pytest.raises(hub.HubError):
        hub.download(REPO, local_dir=target, progress=False)
    assert not target.exists(), "a half-downloaded folder must never sit where the model goes"
    staging = hub.staging_dir(target)
    assert staging.is_dir()
    with pytest.raises(CheckpointError):
        resolve_model(str(target), check_fit=False)
    with pytest.raises(CheckpointError, match="unfinished download"):
        resolve_model(str(staging), check_fit=False)
    fake.fail_after_bytes = None
    assert hub.download(REPO, local_dir=target, progress=False) == target.resolve()
    assert not staging.exists() and not hub.missing_files(target)
    assert fake.transferred == _size(remote)  # resumed, nothing fetched twice
    assert resolve_model(str(target), check_fit=False).kind == "local"
    assert hub.download(REPO, local_dir=target, progress=False) == target.resolve()  # already there: no-op
    assert fake.transferred == _size(remote)


def test_a_truncated_shard_is_not_accepted_as_a_finished_download(fake, remote):
    shard = sorted(remote.glob("*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[:-100])  # the server sends a short file
    with pytest.raises(hub.HubError, match="not a complete checkpoint.*again"):
        hub.download(REPO, progress=False)


def test_offline_or_unknown_repo_gives_a_clear_error(fake):
    fake.online = False
    with pytest.raises(hub.HubError, match="cannot download acme/tiny-moe.*--model /path"):
        hub.download(REPO, progress=False)
    fake.online = True
    with pytest.raises(hub.HubError, match="has no repo 'acme/nope'"):
        hub.download("acme/nope", progress=False)


def test_gated_and_disk_full_errors_say_what_to_do():
    import errno

    from huggingface_hub import errors

    gated = errors.GatedRepoError.__new__(errors.GatedRepoError)
    Exception.__init__(gated, "403 gated")
    assert "accept its terms" in str(hub.explain_hub_error(gated, "org/m"))
    full = OSError(errno.ENOSPC, "No space left on device")
    assert "disk filled up" in str(hub.explain_hub_error(full, "org/m"))


def test_cli_downloads_with_listing_and_disk_check(fake, tmp_path, capsys):
    target = tmp_path / "dl"
    assert main(["download", REPO, "--dir", str(target), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "Fit check" in err and "Ready" in err and f"--model {target}" in err
    assert main(["download", REPO, "--dir", str(target), "--quiet"]) == 0
    assert "Already downloaded" in capsys.readouterr().err


def test_cli_refuses_what_does_not_fit_unless_forced(fake, remote, monkeypatch, tmp_path, capsys):
    from qwenlocal.engine.probe.fake import fake_gpu_profile

    # The BF16 checkpoint on a 16 GB card with 32 GB of RAM: the 60 GiB bank cannot be held.
    monkeypatch.setattr("qwenlocal.app.models.machine_profile", lambda: fake_gpu_profile(ram_total=32.0))
    fake.repos["Qwen/Qwen3.6-35B-A3B"] = remote
    assert main(["download", "qwen3.6-35b-a3b", "--dir", str(tmp_path / "big"), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "does not fit" in err and "nvidia/Qwen3.6-35B-A3B-NVFP4" in err and "--force" in err
    assert not (tmp_path / "big").exists() and not hub.staging_dir(tmp_path / "big").exists()
    monkeypatch.setattr(hub, "free_disk_bytes", lambda path: 10**15)
    assert main(["download", "qwen3.6-35b-a3b", "--dir", str(tmp_path / "big"), "--quiet", "--force"]) == 0


def test_cli_checks_disk_space(fake, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(hub, "free_disk_bytes", lambda path: 1000)
    assert main(["download", REPO, "--dir", str(tmp_path / "x"), "--quiet"]) == 1
    assert "disk" in capsys.readouterr().err and not fake.transferred


def test_real_huggingface_hub_offline_is_mapped(tmp_path):
    """The real huggingface_hub (not the fake) with HF_HUB_OFFLINE=1: the CLI says how to use a local folder."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"), QWENLOCAL_HOME=str(tmp_path / "q"))
    out = subprocess.run([sys.executable, "-m", "qwenlocal.app.cli", "download", "qwen3.6-35b-a3b-nvfp4", "--quiet"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 1
    assert "HF_HUB_OFFLINE" in out.stderr and "--model" in out.stderr and "Traceback" not in out.stderr


def test_cli_validates_the_fit_options_before_the_hub(fake, tmp_path, capsys, monkeypatch):
    from qwenlocal.app import hub

    def no_hub(*a, **k):
        raise AssertionError("the hub was asked before the options were checked")

    monkeypatch.setattr(hub, "remote_listing", no_hub)
    target = tmp_path / "dl"
    assert main(["download", REPO, "--dir", str(target), "--vram-budget", "banana"]) == 1
    assert "vram_budget 'banana' is not a size" in capsys.readouterr().err
    assert main(["download", REPO, "--max-context", "0"]) == 1
    assert "max_context" in capsys.readouterr().err
