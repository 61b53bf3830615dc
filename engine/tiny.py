"""Write small qwen3_5_moe checkpoints in the real on-disk layout (tests, the demo model, CPU smoke runs).

The layout follows the real Qwen3.6-35B-A3B files: config.json with the text model under `text_config`,
`model.language_model.` prefixed text tensors, top-level `lm_head.weight`, routed experts fused per layer
(`experts.gate_up_proj` / `experts.down_proj`, as in the BF16 checkpoint) or per expert (as in the NVFP4
checkpoint and transformers' own save), sharded safetensors with an index, vision and MTP tensors to skip,
a trained byte-level BPE tokenizer with Qwen's special tokens, the chat template and generation_config.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from typing import Callable

import torch
from safetensors.torch import save_file

from .errors import OptionError


@dataclass(frozen=True)
class TinyGeometry:
    hidden_size: int = 64
    num_layers: int = 4
    full_attention_interval: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    partial_rotary_factor: float = 0.25
    linear_num_key_heads: int = 2
    linear_num_value_heads: int = 4
    linear_key_head_dim: int = 16
    linear_value_head_dim: int = 16
    conv_kernel: int = 4
    num_experts: int = 16
    top_k: int = 4
    moe_intermediate_size: int = 32
    shared_intermediate_size: int = 32
    tokenizer_vocab: int = 600  # BPE merges budget; the embedding is padded above the tokenizer's size
    max_position_embeddings: int = 4096


GEOMETRIES = {
    "tiny": TinyGeometry(),
    # Odd, non-power-of-two sizes everywhere (a kernel that assumes 2^n or divisibility fails here).
    "odd": TinyGeometry(
        hidden_size=72, num_layers=5, full_attention_interval=2, num_heads=3, num_kv_heads=1, head_dim=24,
        partial_rotary_factor=0.25, linear_num_key_heads=3, linear_num_value_heads=6, linear_key_head_dim=12,
        linear_value_head_dim=10, conv_kernel=3, num_experts=13, top_k=5, moe_intermediate_size=20,
        shared_intermediate_size=28, tokenizer_vocab=517,
    ),
    # The real model's head sizes scaled down, inside what FlashInfer and fla compile for (head_dim 64,
    # k/v head dim 64): the GPU tier runs the fast kernels and CUDA graphs on it.
    "small": TinyGeometry(
        hidden_size=256, num_layers=4, full_attention_interval=2, num_heads=4, num_kv_heads=2, head_dim=64,
        partial_rotary_factor=0.25, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64,
        linear_value_head_dim=64, conv_kernel=4, num_experts=32, top_k=4, moe_intermediate_size=64,
        shared_intermediate_size=64, tokenizer_vocab=600,
    ),
}


def config_dict(g: TinyGeometry, vocab_size: int, bos_id: int) -> dict:
    text = {
        "model_type": "qwen3_5_moe_text", "dtype": "bfloat16", "attention_bias": False, "attention_dropout": 0.0,
        "attn_output_gate": True, "bos_token_id": bos_id, "eos_token_id": bos_id, "pad_token_id": None,
        "full_attention_interval": g.full_attention_interval, "head_dim": g.head_dim, "hidden_act": "silu",
        "hidden_size": g.hidden_size, "initializer_range": 0.02,
        "layer_types": ["linear_attention" if (i + 1) % g.full_attention_interval else "full_attention"
                        for i in range(g.num_layers)],
        "linear_conv_kernel_dim": g.conv_kernel, "linear_key_head_dim": g.linear_key_head_dim,
        "linear_num_key_heads": g.linear_num_key_heads, "linear_num_value_heads": g.linear_num_value_heads,
        "linear_value_head_dim": g.linear_value_head_dim, "mamba_ssm_dtype": "float32",
        "max_position_embeddings": g.max_position_embeddings, "moe_intermediate_size": g.moe_intermediate_size,
        "shared_expert_intermediate_size": g.shared_intermediate_size, "num_experts": g.num_experts,
        "num_experts_per_tok": g.top_k, "mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": False,
        "num_attention_heads": g.num_heads, "num_hidden_layers": g.num_layers, "num_key_value_heads": g.num_kv_heads,
        "output_router_logits": False, "router_aux_loss_coef": 0.001, "partial_rotary_factor": g.partial_rotary_factor,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {"mrope_interleaved": True, "mrope_section": [11, 11, 10],
                            "partial_rotary_factor": g.partial_rotary_factor, "rope_theta": 10000000,
                            "rope_type": "default"},
        "tie_word_embeddings": False, "use_cache": True, "vocab_size": vocab_size,
    }
    return {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
        "tie_word_embeddings": False, "transformers_version": "5.2.0", "text_config": text,
        "vision_config": {"model_type": "qwen3_5_moe", "depth": 1, "hidden_size": 16, "num_heads": 2,
                          "out_hidden_size": g.hidden_size},
    }


def random_weights(g: TinyGeometry, vocab_size: int, seed: int, device: str | torch.device = "cpu",
                   dtype: torch.dtype = torch.float32,
                   expert_sink: Callable[[int, torch.Tensor, torch.Tensor], None] | None = None
                   ) -> dict[str, torch.Tensor]:
    """Seeded weights at scales that keep activations O(1), so logits differ visibly between tokens.

    The decay (A, in_proj_a), beta (in_proj_b) and router scales are moderate on purpose: with A up to 16 and
    sharp betas the model amplified float32 noise ~10x per layer, and transformers' own chunked-with-cache run
    differed from its one-shot run by 1.0e-4 (measured), which would make a 1e-4 gate test the test model's
    conditioning rather than the engine.
    expert_sink(layer, gate_up, down) takes each layer's experts as they are made (same random stream, so the
    same bytes) instead of keeping them: the full-size model's 65 GB of experts never exist on the device at once.
    """
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    h, i_moe, i_sh = g.hidden_size, g.moe_intermediate_size, g.shared_intermediate_size

    def randn(*shape: int) -> torch.Tensor:
        # Generated in place on the target device and dtype: the full-size synthetic model never exists in fp32.
        return torch.randn(*shape, generator=gen, device=device, dtype=dtype)

    def mat(out: int, inp: int, *lead: int) -> torch.Tensor:
        return randn(*lead, out, inp).div_(math.sqrt(inp))

    def vec(n: int, scale: float = 0.1) -> torch.Tensor:
        return randn(n).mul_(scale)

    w: dict[str, torch.Tensor] = {"embed_tokens.weight": randn(vocab_size, h),
                                  "norm.weight": vec(h), "lm_head.weight": mat(vocab_size, h)}
    k_dim = g.linear_num_key_heads * g.linear_key_head_dim
    v_dim = g.linear_num_value_heads * g.linear_value_head_dim
    for layer in range(g.num_layers):
        p = f"layers.{layer}."
        w[p + "input_layernorm.weight"], w[p + "post_attention_layernorm.weight"] = vec(h), vec(h)
        if (layer + 1) % g.full_attention_interval:
            w[p + "linear_attn.in_proj_qkv.weight"] = mat(2 * k_dim + v_dim, h)
            w[p + "linear_attn.in_proj_z.weight"] = mat(v_dim, h)
            w[p + "linear_attn.in_proj_b.weight"] = mat(g.linear_num_value_heads, h) * 0.5
            w[p + "linear_attn.in_proj_a.weight"] = mat(g.linear_num_value_heads, h) * 0.5
            w[p + "linear_attn.conv1d.weight"] = randn(2 * k_dim + v_dim, 1, g.conv_kernel).mul_(0.35)
            w[p + "linear_attn.dt_bias"] = vec(g.linear_num_value_heads).add_(1.0).float()
            a = torch.empty(g.linear_num_value_heads, device=device).uniform_(1, 4, generator=gen)
            w[p + "linear_attn.A_log"] = torch.log(a)
            w[p + "linear_attn.norm.weight"] = vec(g.linear_value_head_dim).add_(1.0)
            w[p + "linear_attn.out_proj.weight"] = mat(h, v_dim)
        else:
            w[p + "self_attn.q_proj.weight"] = mat(g.num_heads * g.head_dim * 2, h)
            w[p + "self_attn.k_proj.weight"] = mat(g.num_kv_heads * g.head_dim, h)
            w[p + "self_attn.v_proj.weight"] = mat(g.num_kv_heads * g.head_dim, h)
            w[p + "self_attn.o_proj.weight"] = mat(h, g.num_heads * g.head_dim)
            w[p + "self_attn.q_norm.weight"], w[p + "self_attn.k_norm.weight"] = vec(g.head_dim), vec(g.head_dim)
        # Router logits scaled up so that top-k choices are decisive and vary between tokens.
        w[p + "mlp.gate.weight"] = mat(g.num_experts, h).mul_(1.5)
        gate_up, down = mat(2 * i_moe, h, g.num_experts), mat(h, i_moe, g.num_experts)
        if expert_sink is None:
            w[p + "mlp.experts.gate_up_proj"], w[p + "mlp.experts.down_proj"] = gate_up, down
        else:
            expert_sink(layer, gate_up, down)
            del gate_up, down
        w[p + "mlp.shared_expert.gate_proj.weight"] = mat(i_sh, h)
        w[p + "mlp.shared_expert.up_proj.weight"] = mat(i_sh, h)
        w[p + "mlp.shared_expert.down_proj.weight"] = mat(h, i_sh)
        w[p + "mlp.shared_expert_gate.weight"] = mat(1, h)
    return w


def stored_tensors(weights: dict[str, torch.Tensor], g: TinyGeometry, expert_layout: str, dtype: torch.dtype,
                   seed: int) -> dict[str, torch.Tensor]:
    """Canonical weights -> names and layout as stored on disk, plus vision/MTP tensors the loader must skip."""
    out: dict[str, torch.Tensor] = {}
    for name, t in weights.items():
        key = name if name == "lm_head.weight" else "model.language_model." + name
        if expert_layout == "per-expert" and name.endswith("mlp.experts.gate_up_proj"):
            base = key[: -len("gate_up_proj")]
            for e in range(g.num_experts):
                out[f"{base}{e}.gate_proj.weight"] = t[e, : g.moe_intermediate_size]
                out[f"{base}{e}.up_proj.weight"] = t[e, g.moe_intermediate_size:]
            continue
        if expert_layout == "per-expert" and name.endswith("mlp.experts.down_proj"):
            base = key[: -len("down_proj")]
            for e in range(g.num_experts):
                out[f"{base}{e}.down_proj.weight"] = t[e]
            continue
        out[key] = t
    gen = torch.Generator().manual_seed(seed + 1)
    out["model.visual.patch_embed.proj.weight"] = torch.randn(16, 3, 2, 4, 4, generator=gen)
    out["mtp.fc.weight"] = torch.randn(g.hidden_size, 2 * g.hidden_size, generator=gen)
    out["mtp.layers.0.mlp.experts.gate_up_proj"] = torch.randn(g.num_experts, 2, g.hidden_size, generator=gen)
    return {k: v.to(dtype).contiguous() for k, v in out.items()}


def write_shards(tensors: dict[str, torch.Tensor], out_dir: Path, num_shards: int) -> None:
    names = sorted(tensors)
    per = math.ceil(len(names) / num_shards)
    weight_map, total = {}, 0
    for s in range(num_shards):
        part = names[s * per:(s + 1) * per]
        fname = f"model-{s + 1:05d}-of-{num_shards:05d}.safetensors"
        save_file({n: tensors[n] for n in part}, str(out_dir / fname), metadata={"format": "pt"})
        for n in part:
            weight_map[n] = fname
            total += tensors[n].numel() * tensors[n].element_size()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def make_tiny_checkpoint(out_dir: str | Path, geometry: str | TinyGeometry = "tiny", *, seed: int = 0,
                         expert_layout: str = "fused", num_shards: int = 3, dtype: torch.dtype = torch.bfloat16,
                         weights: dict[str, torch.Tensor] | None = None) -> Path:
    """Write a complete checkpoint folder; returns its path. `weights` (canonical names) overrides the random init."""
    from .tokenizer_train import default_corpus, train_tokenizer, write_tokenizer_files

    g = GEOMETRIES[geometry] if isinstance(geometry, str) else geometry
    if expert_layout not in ("fused", "per-expert"):
        raise OptionError(f"expert_layout must be 'fused' or 'per-expert', got {expert_layout!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(default_corpus(), g.tokenizer_vocab)
    vocab_size = -(-tok.get_vocab_size(with_added_tokens=True) // 64) * 64
    bos = tok.token_to_id("<|endoftext|>")
    eos = [tok.token_to_id("<|im_end|>"), bos]
    cfg = config_dict(g, vocab_size, bos)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    gen_cfg = {"bos_token_id": bos, "do_sample": True, "eos_token_id": eos, "pad_token_id": bos,
               "temperature": 1.0, "top_k": 20, "top_p": 0.95}
    (out / "generation_config.json").write_text(json.dumps(gen_cfg, indent=2))
    write_tokenizer_files(out, tok)
    w = weights if weights is not None else random_weights(g, vocab_size, seed)
    write_shards(stored_tensors(w, g, expert_layout, dtype, seed), out, num_shards)
    return out
