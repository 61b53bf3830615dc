"""Checkpoint loading: both expert layouts, both prefixes, and every bad-input path is a clear error."""
import json
import shutil

import pytest
import torch
from safetensors.torch import save_file

from qwenlocal.engine import tiny
from qwenlocal.engine.checkpoint import Checkpoint
from qwenlocal.engine.config import load_model_config
from qwenlocal.engine.errors import CheckpointError, UnsupportedModelError
from qwenlocal.engine.load import load_weights

GEO = tiny.GEOMETRIES["tiny"]
VOCAB = 640


def write(path, layout="fused", shards=3, dtype=torch.bfloat16, rename=None):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(tiny.config_dict(GEO, VOCAB, 1)))
    stored = tiny.stored_tensors(tiny.random_weights(GEO, VOCAB, 0), GEO, layout, dtype, 0)
    if rename:
        stored = {rename(k): v for k, v in stored.items()}
    tiny.write_shards(stored, path, shards)
    return path


def load(path, dtype=torch.float32):
    return load_weights(Checkpoint(path), load_model_config(path), dtype)


def test_fused_and_per_expert_layouts_load_to_the_same_tensors(tmp_path):
    fused = load(write(tmp_path / "f", "fused"))
    per_expert = load(write(tmp_path / "p", "per-expert", shards=4))
    assert fused.keys() == per_expert.keys()
    for name in fused:
        assert torch.equal(fused[name], per_expert[name]), name
    w = tiny.random_weights(GEO, VOCAB, 0)
    # Stored in bf16: the loaded fp32 tensor is exactly the bf16 rounding of the source.
    assert torch.equal(fused["layers.0.mlp.experts.gate_up_proj"], w["layers.0.mlp.experts.gate_up_proj"].bfloat16().float())
    assert fused["layers.0.linear_attn.A_log"].dtype == torch.float32


def test_plain_model_prefix_and_single_file_load(tmp_path):
    a = load(write(tmp_path / "a"))
    b = write(tmp_path / "b", shards=1, rename=lambda k: k.replace("model.language_model.", "model."))
    (b / "model.safetensors.index.json").unlink()
    (b / "model-00001-of-00001.safetensors").rename(b / "model.safetensors")
    loaded = load(b)
    assert all(torch.equal(a[n], loaded[n]) for n in a)


def test_vision_and_mtp_tensors_are_skipped(tmp_path):
    ckpt = Checkpoint(write(tmp_path / "m"))
    assert not any(n.startswith(("mtp.", "visual", "model.visual")) for n in ckpt.entries)
    assert "layers.0.input_layernorm.weight" in ckpt


def test_missing_shard_names_the_shard(tmp_path):
    path = write(tmp_path / "s")
    (path / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model-00002-of-00003.safetensors"):
        Checkpoint(path)


def test_truncated_shard_is_caught_before_loading(tmp_path):
    path = write(tmp_path / "t")
    shard = path / "model-00003-of-00003.safetensors"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) - 100])
    with pytest.raises(CheckpointError, match="model-00003-of-00003.safetensors is truncated"):
        Checkpoint(path)
    shard.write_bytes(data[:5])
    with pytest.raises(CheckpointError, match="truncated"):
        Checkpoint(path)


def test_wrong_shape_names_tensor_and_file(tmp_path):
    path = write(tmp_path / "w")
    index = json.loads((path / "model.safetensors.index.json").read_text())
    key = "model.language_model.layers.1.linear_attn.in_proj_z.weight"
    shard = path / index["weight_map"][key]
    from safetensors.torch import load_file
    tensors = load_file(str(shard))
    tensors[key] = torch.zeros(3, 3, dtype=torch.bfloat16)
    save_file(tensors, str(shard))
    with pytest.raises(CheckpointError, match=rf"{key} in {shard.name} has shape \[3, 3\]"):
        load(path)


def test_missing_tensor_is_named(tmp_path):
    path = write(tmp_path / "x", rename=lambda k: k.replace("post_attention_layernorm", "post_norm"))
    with pytest.raises(CheckpointError, match="layers.0.post_attention_layernorm.weight is missing"):
        load(path)


def test_missing_experts_are_named(tmp_path):
    path = write(tmp_path / "e", rename=lambda k: k.replace("layers.2.mlp.experts", "layers.2.mlp.exp"))
    with pytest.raises(CheckpointError, match="layer 2: routed experts are missing"):
        load(path)


def test_no_weights_and_corrupt_index(tmp_path):
    with pytest.raises(CheckpointError, match="no model.safetensors.index.json"):
        Checkpoint(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="malformed"):
        Checkpoint(tmp_path)


def test_quantized_checkpoints_are_refused_clearly(tmp_path):
    path = write(tmp_path / "q")
    cfg = json.loads((path / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION"}
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match="MIXED_PRECISION"):
        load(path)


def test_copy_of_a_checkpoint_still_loads(tmp_path):
    src = write(tmp_path / "src")
    dst = tmp_path / "dst"
    shutil.copytree(src, dst)
    assert load(dst).keys() == load(src).keys()
