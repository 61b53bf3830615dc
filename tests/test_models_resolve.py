"""Model resolution, every kind of reference: demo, folder, synthetic, registry alias and hub id (from the
local HF cache, read by the real huggingface_hub), and the fit check that runs before loading."""
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from fakehub import make_cached_snapshot
from qwenlocal.app.models import ResolvedModel, fit_check, resolve_model
from qwenlocal.engine.errors import CheckpointError, ResourceError
from qwenlocal.engine.plan import QWEN36_35B_A3B_NVFP4
from qwenlocal.engine.probe.fake import fake_cpu_profile, fake_gpu_profile, h200, wsl2_rtx5070ti
from qwenlocal.engine.registry import QWEN36_35B_A3B_BF16, find_known


@pytest.fixture()
def hf_cache(monkeypatch, tmp_path):
    from huggingface_hub import constants

    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("QWENLOCAL_HOME", str(tmp_path / "home"))
    return cache


def test_no_model_is_the_demo(monkeypatch, tmp_path):
    monkeypatch.setenv("QWENLOCAL_HOME", str(tmp_path))
    got = resolve_model(None)
    assert got.is_demo and got.kind == "demo" and (got.path / "config.json").is_file()
    assert got.ref == str(got.path) and got.target == got.path


def test_a_folder(tiny_ckpt):
    got = resolve_model(str(tiny_ckpt))
    assert (got.kind, got.path, got.is_demo, got.ref) == ("local", Path(tiny_ckpt), False, str(tiny_ckpt))
    assert got.facts().num_experts == 16  # read from its config and headers


def test_old_style_construction_still_works(tmp_path):
    got = ResolvedModel(tmp_path, "x", False)  # app/commands/generate.py and the chat build on these fields
    assert got.ref == str(tmp_path) and got.target == tmp_path and got.kind == "local"


def test_bad_folders(tiny_ckpt, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no config.json"):
        resolve_model(str(tmp_path / "empty"))
    partial = tmp_path / "partial"
    shutil.copytree(tiny_ckpt, partial)
    next(partial.glob("*.safetensors")).unlink()
    with pytest.raises(CheckpointError, match="incomplete checkpoint"):
        resolve_model(str(partial))
    with pytest.raises(CheckpointError, match="not a folder, a known model or a hub id"):
        resolve_model(str(tmp_path / "nope"))
    with pytest.raises(CheckpointError, match="not a folder"):
        resolve_model("no-such-thing")


def test_synthetic_passes_through_with_its_sizes():
    got = resolve_model("synthetic:qwen3.6-35b-a3b", check_fit=False)
    assert got.path is None and got.ref == "synthetic:qwen3.6-35b-a3b" and got.target == got.ref
    assert got.kind == "synthetic" and got.facts() == QWEN36_35B_A3B_BF16  # BF16 experts and dense weights
    tiny = resolve_model("synthetic:tiny")
    assert tiny.ref == "synthetic:tiny" and tiny.facts() is None
    assert resolve_model("Synthetic:Qwen3.6-35B-A3B", check_fit=False).ref == "synthetic:qwen3.6-35b-a3b"
    with pytest.raises(CheckpointError, match="needs a name"):
        resolve_model("synthetic:")


def test_alias_and_hub_id_from_the_cache(hf_cache, tiny_ckpt):
    snap = make_cached_snapshot(hf_cache, "nvidia/Qwen3.6-35B-A3B-NVFP4", tiny_ckpt)
    for ref in ("qwen3.6-35b-a3b-nvfp4", "nvidia/Qwen3.6-35B-A3B-NVFP4", "QWEN3.6-35B-A3B-NVFP4"):
        got = resolve_model(ref, check_fit=False)
        assert got.kind == "hub" and got.path == snap and got.repo_id == "nvidia/Qwen3.6-35B-A3B-NVFP4"
        assert got.known is find_known("qwen3.6-35b-a3b-nvfp4") and got.facts() == QWEN36_35B_A3B_NVFP4
    other = make_cached_snapshot(hf_cache, "acme/other-moe", tiny_ckpt)
    got = resolve_model("acme/other-moe")
    assert got.path == other and got.known is None and got.facts().num_layers == 4


def test_hub_id_not_downloaded_or_incomplete(hf_cache, tiny_ckpt):
    with pytest.raises(CheckpointError, match=r"not downloaded yet: run `qwenlocal download Qwen/Qwen3.6-35B-A3B`"):
        resolve_model("qwen3.6-35b-a3b")
    with pytest.raises(CheckpointError, match="not downloaded yet"):
        resolve_model("acme/missing")
    shard = sorted(p.name for p in tiny_ckpt.glob("*.safetensors"))[1]
    make_cached_snapshot(hf_cache, "acme/half", tiny_ckpt, skip=(shard,))
    with pytest.raises(CheckpointError, match=f"incomplete.*{shard}.*download acme/half.*resumes"):
        resolve_model("acme/half")


def test_fit_check_before_loading_says_what_to_do():
    small = fake_gpu_profile(vram_total=8.0, vram_free=7.6, ram_total=32.0, ram_available=28.0)
    bf16 = ResolvedModel(Path("/models/bf16"), "bf16", False, kind="hub", known=find_known("qwen3.6-35b-a3b"))
    assert bf16.facts() == QWEN36_35B_A3B_BF16
    with pytest.raises(ResourceError) as err:
        fit_check(bf16, profile=small)
    msg = str(err.value)
    assert "host RAM" in msg and "60.0 GiB" in msg and "nvidia/Qwen3.6-35B-A3B-NVFP4" in msg
    nvfp4 = resolve_model("synthetic:qwen3.6-35b-a3b", check_fit=False)
    assert fit_check(nvfp4, profile=wsl2_rtx5070ti(ram_total=64.0, ram_available=58.0)).ok
    with pytest.raises(ResourceError, match="VRAM"):
        resolve_model("synthetic:qwen3.6-35b-a3b", profile=h200(), options={"vram_budget": "3GiB"})
    assert resolve_model("synthetic:qwen3.6-35b-a3b", profile=h200(), options={"vram_budget": "16GiB"}).ref


def test_cpu_path_counts_every_weight_at_its_compute_width():
    # The full-size synthetic model on a CPU-only 23 GiB machine: 34.7 G params x 4 B = 129.1 GiB.
    cpu = fake_cpu_profile(ram_total=23.0, ram_available=22.0)
    with pytest.raises(ResourceError, match=r"(?s)synthetic:qwen3.6-35b-a3b.*32-bit: 129.1 GiB.*23.0 GiB.*NVIDIA GPU"):
        resolve_model("synthetic:qwen3.6-35b-a3b", profile=cpu)
    with pytest.raises(ResourceError, match="16-bit: 64.6 GiB"):
        resolve_model("synthetic:qwen3.6-35b-a3b", profile=cpu, dtype="bf16")


def test_params_read_from_a_checkpoint(tiny_ckpt):
    from qwenlocal.app.fit import params_from_checkpoint

    got = resolve_model(str(tiny_ckpt))
    assert got.params() == params_from_checkpoint(tiny_ckpt) > 0


def test_small_models_skip_the_probe(monkeypatch, tiny_ckpt):
    def boom():
        raise AssertionError("the probe must not run for a tiny model")

    monkeypatch.setattr("qwenlocal.app.models.machine_profile", boom)
    assert resolve_model(str(tiny_ckpt)).kind == "local"
    assert resolve_model("synthetic:tiny").kind == "synthetic"


def test_synthetic_sizes_are_what_the_engine_places():
    """The fit check's sizes of the full-size synthetic models equal the engine's own (plan) arithmetic."""
    from qwenlocal.engine.plan import ModelFacts
    from qwenlocal.engine.quant.nvfp4_rows import nvfp4_expert_row_stride
    from qwenlocal.engine.quant.synthetic_formats import stored_dense_bytes_of
    from qwenlocal.engine.synthetic import synthetic_config

    for ref, nvfp4 in (("synthetic:qwen3.6-35b-a3b", False), ("synthetic:qwen3.6-35b-a3b-nvfp4", True)):
        cfg = synthetic_config(ref, 0)
        want = ModelFacts.from_config(cfg, expert_dtype_bytes=2, dense_dtype_bytes=2)
        if nvfp4:  # native linears (the GPU): the dense weights as the NVFP4 checkpoint stores them
            want = replace(want, expert_bytes=nvfp4_expert_row_stride(cfg.hidden_size, cfg.moe.intermediate_size),
                           dense_bytes=stored_dense_bytes_of(cfg))
        got = resolve_model(ref, check_fit=False).facts()
        assert replace(got, name=want.name) == want
