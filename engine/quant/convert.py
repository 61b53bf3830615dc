"""Turn a BF16 qwen3_5_moe checkpoint into nvidia/Qwen3.6-35B-A3B-NVFP4's mixed layout (tests and benches use
the real format): routed experts per expert, shared expert and lm_head in NVFP4 (W4A16); attention and GDN
projections in FP8 (with a static input_scale, as ModelOpt writes); router, gates, conv1d, norms, embedding in
BF16. The quantization block goes into config.json (`quantization_config`) and hf_quant_config.json."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from ..checkpoint import Checkpoint
from ..config import FULL_ATTENTION, load_model_config
from ..load import load_weights
from ..tiny import write_shards
from .formats import quantize_fp8, quantize_nvfp4

PREFIX = "model.language_model."
_COPY = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


def nvfp4_modules(cfg) -> list[str]:
    """The dense linears the real checkpoint stores in NVFP4 (W4A16): lm_head and the shared experts."""
    return ["lm_head"] + [f"layers.{i}.mlp.shared_expert.{n}" for i in range(cfg.num_layers)
                          for n in ("gate_proj", "up_proj", "down_proj")]


def fp8_modules(cfg) -> list[str]:
    """The dense linears the real checkpoint stores in FP8 (per-tensor scale): attention q/k/v/o, GDN qkv/z/out."""
    out = []
    for i, kind in enumerate(cfg.layer_types):
        names = ("q_proj", "k_proj", "v_proj", "o_proj") if kind == FULL_ATTENTION else ("in_proj_qkv", "in_proj_z", "out_proj")
        part = "self_attn" if kind == FULL_ATTENTION else "linear_attn"
        out += [f"layers.{i}.{part}.{n}" for n in names]
    return out


def quantize_checkpoint(src: str | Path, dst: str | Path, num_shards: int = 3) -> Path:
    src, dst = Path(src), Path(dst)
    cfg = load_model_config(src)
    weights = load_weights(Checkpoint(src), cfg, torch.float32)
    nvfp4, fp8 = nvfp4_modules(cfg), fp8_modules(cfg)
    stored: dict[str, torch.Tensor] = {}
    for module in nvfp4:
        key = module if module == "lm_head" else PREFIX + module
        packed, scale, scale2 = quantize_nvfp4(weights.pop(module + ".weight"))
        stored.update({key + ".weight": packed, key + ".weight_scale": scale, key + ".weight_scale_2": scale2})
    for module in fp8:
        w, scale = quantize_fp8(weights.pop(module + ".weight"))
        stored.update({PREFIX + module + ".weight": w, PREFIX + module + ".weight_scale": scale,
                       PREFIX + module + ".input_scale": torch.tensor(1.0 / 448)})
    inter = cfg.moe.intermediate_size
    for layer in range(cfg.num_layers):
        p = f"layers.{layer}.mlp.experts."
        gate_up, down = weights.pop(p + "gate_up_proj"), weights.pop(p + "down_proj")
        for e in range(cfg.moe.num_experts):
            for kind, w in (("gate_proj", gate_up[e, :inter]), ("up_proj", gate_up[e, inter:]), ("down_proj", down[e])):
                packed, scale, scale2 = quantize_nvfp4(w)
                key = f"{PREFIX}{p}{e}.{kind}"
                stored.update({key + ".weight": packed, key + ".weight_scale": scale, key + ".weight_scale_2": scale2})
    for name, t in weights.items():  # everything else stays BF16 (A_log/dt_bias too; the loader upcasts them)
        stored[name if name == "lm_head.weight" else PREFIX + name] = t.to(torch.bfloat16).contiguous()
    dst.mkdir(parents=True, exist_ok=True)
    write_shards({k: v.contiguous() for k, v in stored.items()}, dst, num_shards)
    quant = {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": None,
             "producer": {"name": "qwenlocal", "version": "quantize_nvfp4"}, "exclude_modules": ["mtp*"],
             "quantized_layers": {
                 **{(m if m == "lm_head" else PREFIX + m): {"quant_algo": "W4A16_NVFP4", "group_size": 16} for m in nvfp4},
                 **{f"{PREFIX}layers.{i}.mlp.experts": {"quant_algo": "W4A16_NVFP4", "group_size": 16}
                    for i in range(cfg.num_layers)},
                 **{PREFIX + m: {"quant_algo": "FP8"} for m in fp8}}}
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = quant
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    (dst / "hf_quant_config.json").write_text(json.dumps({"producer": quant["producer"], "quantization": quant}, indent=2))
    for name in _COPY:
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
    return dst
