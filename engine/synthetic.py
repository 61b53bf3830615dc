"""`synthetic:NAME` models: a real geometry with seeded random weights made directly on the target device
(no disk, no download), loadable anywhere a checkpoint path is. For benchmarks and tests; the replies are
noise. The tokenizer is the small trained BPE of the tiny checkpoints (the embedding is larger; sampling is
limited to the tokenizer's ids)."""
from __future__ import annotations

import tempfile
import torch

from .config import ModelConfig, parse_model_config
from .errors import OptionError
from .load import FP32_SUFFIXES
from .tiny import GEOMETRIES, TinyGeometry, config_dict, random_weights

PREFIX = "synthetic:"
# The geometry of shared/reference/model-formats.md section 1 (Qwen3.6-35B-A3B).
QWEN36_35B_A3B = TinyGeometry(
    hidden_size=2048, num_layers=40, full_attention_interval=4, num_heads=16, num_kv_heads=2, head_dim=256,
    partial_rotary_factor=0.25, linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
    linear_value_head_dim=128, conv_kernel=4, num_experts=256, top_k=8, moe_intermediate_size=512,
    shared_intermediate_size=512, tokenizer_vocab=600, max_position_embeddings=262144,
)
SYNTHETIC = {"qwen3.6-35b-a3b": (QWEN36_35B_A3B, 248320), **{k: (g, None) for k, g in GEOMETRIES.items()}}


def is_synthetic(ref) -> bool:
    return isinstance(ref, str) and ref.startswith(PREFIX)


def synthetic_geometry(ref: str) -> tuple[str, TinyGeometry, int | None]:
    name = ref[len(PREFIX):]
    if name not in SYNTHETIC:
        raise OptionError(f"unknown synthetic model {ref!r}; known: {', '.join(PREFIX + k for k in SYNTHETIC)}")
    geometry, vocab = SYNTHETIC[name]
    return name, geometry, vocab


def synthetic_tokenizer_dir(geometry: TinyGeometry) -> str:
    from .tokenizer_train import default_corpus, train_tokenizer, write_tokenizer_files

    path = tempfile.mkdtemp(prefix="qwenlocal-synthetic-tok-")
    write_tokenizer_files(path, train_tokenizer(default_corpus(), geometry.tokenizer_vocab))
    return path


def synthetic_config(ref: str, vocab_size: int) -> ModelConfig:
    _, geometry, fixed_vocab = synthetic_geometry(ref)
    return parse_model_config(config_dict(geometry, fixed_vocab or vocab_size, 0))


def synthetic_model(ref: str, device: torch.device, dtype: torch.dtype, vocab_size: int,
                    seed: int = 0) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """ModelConfig + weights (canonical names, experts stacked) for `synthetic:NAME`, on `device`."""
    config = synthetic_config(ref, vocab_size)
    _, geometry, _ = synthetic_geometry(ref)
    weights = random_weights(geometry, config.vocab_size, seed, device=device, dtype=dtype)
    for name in list(weights):
        if name.endswith(FP32_SUFFIXES):
            weights[name] = weights[name].float()
    return config, weights
