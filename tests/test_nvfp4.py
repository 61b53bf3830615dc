"""NVFP4 / FP8: dequantization on hand-made bytes, the quantizer, the mixed-format checkpoint written by
scripts/quantize_nvfp4.py, and the CPU engine on it against transformers on the dequantized weights."""
import json

import pytest
import torch

from qwenlocal.engine import Engine
from qwenlocal.engine.checkpoint import Checkpoint
from qwenlocal.engine.config import load_model_config
from qwenlocal.engine.errors import CheckpointError, UnsupportedModelError
from qwenlocal.engine.load import load_weights
from qwenlocal.engine.quant.convert import quantize_checkpoint
from qwenlocal.engine.quant.formats import dequant_fp8, dequant_nvfp4, quantize_fp8, quantize_nvfp4
from qwenlocal.engine.quant.scheme import parse_quant_scheme
from qwenlocal.engine.tiny import GEOMETRIES, config_dict, stored_tensors, write_shards


def test_nvfp4_dequant_on_known_bytes():
    # Byte 0x21: element 0 = low nibble 1 (0.5), element 1 = high nibble 2 (1.0).
    # Byte 0x9F: element 2 = low nibble 15 (-6.0), element 3 = high nibble 9 (-0.5).
    row = [0x21, 0x9F, 0x70, 0x00, 0x00, 0x00, 0x00, 0x00]
    packed = torch.tensor([row, row], dtype=torch.uint8)
    scale = torch.tensor([[2.0], [0.25]], dtype=torch.float8_e4m3fn)  # one E4M3 scale per 16 inputs, per row
    w = dequant_nvfp4(packed, scale, torch.tensor(0.5))
    assert w[0, :6].tolist() == [0.5, 1.0, -6.0, -0.5, 0.0, 6.0]  # x 2.0 x 0.5 (0x70: high nibble 7 = 6.0)
    assert w[1, :6].tolist() == [0.0625, 0.125, -0.75, -0.0625, 0.0, 0.75]  # x 0.25 x 0.5
    assert w.shape == (2, 16)


def test_fp8_dequant_on_known_values():
    w = torch.tensor([[1.0, -2.0, 448.0]]).to(torch.float8_e4m3fn)
    assert dequant_fp8(w, torch.tensor(0.5)).tolist() == [[0.5, -1.0, 224.0]]


def test_quantizers_round_trip():
    w = torch.randn(48, 80, generator=torch.Generator().manual_seed(0))
    packed, scale, scale2 = quantize_nvfp4(w)
    assert packed.dtype == torch.uint8 and packed.shape == (48, 40)
    assert scale.dtype == torch.float8_e4m3fn and scale.shape == (48, 5) and scale2.shape == ()
    back = dequant_nvfp4(packed, scale, scale2)
    assert ((back - w).norm() / w.norm()).item() < 0.12  # E2M1 has 3 bits of magnitude
    assert torch.equal(dequant_nvfp4(*quantize_nvfp4(back)), back)  # representable values survive exactly
    q, s = quantize_fp8(w)
    assert ((dequant_fp8(q, s) - w).norm() / w.norm()).item() < 0.05


def test_scheme_parsing_errors():
    with pytest.raises(UnsupportedModelError, match="quant_algo"):
        parse_quant_scheme({"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION",
                            "quantized_layers": {"lm_head": {"quant_algo": "INT4_AWQ"}}})
    with pytest.raises(UnsupportedModelError, match="group_size"):
        parse_quant_scheme({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 32})
    with pytest.raises(UnsupportedModelError, match="quant_method"):
        parse_quant_scheme({"quant_method": "gptq"})


@pytest.fixture(scope="module")
def nvfp4_ckpt(tiny_ckpt, tmp_path_factory):
    return quantize_checkpoint(tiny_ckpt, tmp_path_factory.mktemp("nvfp4"))


def test_written_layout_is_the_real_mixed_format(nvfp4_ckpt):
    ckpt = Checkpoint(nvfp4_ckpt)
    e = ckpt.entry("layers.0.mlp.experts.3.gate_proj.weight")
    assert (e.dtype, e.shape) == ("U8", (32, 32))
    assert ckpt.entry("layers.0.mlp.experts.3.gate_proj.weight_scale").dtype == "F8_E4M3"
    assert ckpt.entry("lm_head.weight_scale_2").shape == ()
    assert ckpt.entry("layers.3.self_attn.q_proj.weight").dtype == "F8_E4M3"
    assert ckpt.entry("layers.0.linear_attn.in_proj_qkv.input_scale").dtype == "F32"
    assert ckpt.entry("layers.0.mlp.gate.weight").dtype == "BF16"  # router stays BF16
    cfg = json.loads((nvfp4_ckpt / "config.json").read_text())
    assert cfg["quantization_config"]["quant_algo"] == "MIXED_PRECISION"


def test_cpu_engine_on_nvfp4_matches_transformers_on_the_dequantized_weights(nvfp4_ckpt, tmp_path):
    transformers = pytest.importorskip("transformers", minversion="5.2")
    cfg = load_model_config(nvfp4_ckpt)
    dequantized = load_weights(Checkpoint(nvfp4_ckpt), cfg, torch.float32)
    g = GEOMETRIES["tiny"]
    ref_dir = tmp_path / "dequantized"
    ref_dir.mkdir()
    raw = config_dict(g, cfg.vocab_size, cfg.bos_token_id)
    (ref_dir / "config.json").write_text(json.dumps(raw))
    write_shards(stored_tensors(dequantized, g, "fused", torch.float32, 0), ref_dir, 2)
    hf = transformers.Qwen3_5MoeForCausalLM.from_pretrained(ref_dir, dtype=torch.float32).eval()
    engine = Engine.from_pretrained(nvfp4_ckpt, device="cpu", dtype=torch.float32, options={"prefill_chunk": 23})
    ids = torch.randint(0, cfg.vocab_size, (97,), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    assert ref.std() > 0.1
    for prefill in (None, 40):
        assert (engine.score(ids, prefill=prefill) - ref).abs().max().item() <= 1e-4


def test_config_and_weights_that_disagree_are_refused(nvfp4_ckpt, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(nvfp4_ckpt, broken)
    cfg = json.loads((broken / "config.json").read_text())
    del cfg["quantization_config"]["quantized_layers"]["lm_head"]
    (broken / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match="lm_head"):
        Engine.from_pretrained(broken, device="cpu")
    cfg["quantization_config"]["quantized_layers"]["lm_head"] = {"quant_algo": "FP8"}
    (broken / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="lm_head"):
        Engine.from_pretrained(broken, device="cpu")
