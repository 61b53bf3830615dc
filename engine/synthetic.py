"""`synthetic:NAME` models: a real geometry with seeded random weights made directly on the target device
(no disk, no download), loadable anywhere a checkpoint path is. For benchmarks and tests; the replies are
noise. The tokenizer is the small trained BPE of the tiny checkpoints (the embedding is larger; sampling is
limited to the tokenizer's ids).

`synthetic:NAME-nvfp4` has nvidia/Qwen3.6-35B-A3B-NVFP4's formats (quant/synthetic_formats.py): NVFP4 routed
experts, shared experts and lm_head, FP8 attention/GDN projections, BF16 rest, each quantized from the seeded
BF16 weights; `synthetic:NAME` is all BF16 (the BF16 checkpoint)."""
from __future__ import annotations

import tempfile
import weakref
from typing import Callable

import torch

from .config import ModelConfig, parse_model_config
from .errors import OptionError
from .load import FP32_SUFFIXES
from .quant.synthetic_formats import apply_real_formats, as_stored_bf16
from .quant.nvfp4_rows import dequant_expert_rows, quantize_expert_rows
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


NVFP4_SUFFIX = "-nvfp4"  # synthetic:NAME-nvfp4: the real NVFP4 checkpoint's formats (ModelOpt's recipe)
# (keep the FP8/NVFP4 dense linears as QuantLinear, their decode GEMV in Triton, FP8 prefill as W8A8)
Linears = tuple[bool, bool, bool]
DEQUANTIZED_LINEARS: Linears = (False, False, False)


def synthetic_nvfp4(ref: str) -> bool:
    return str(ref).endswith(NVFP4_SUFFIX)


def synthetic_geometry(ref: str) -> tuple[str, TinyGeometry, int | None]:
    name = ref[len(PREFIX):]
    if name.endswith(NVFP4_SUFFIX):
        name = name[: -len(NVFP4_SUFFIX)]
    if name not in SYNTHETIC:
        known = ", ".join(PREFIX + k for k in SYNTHETIC)
        raise OptionError(f"unknown synthetic model {ref!r}; known: {known} (each also as NAME{NVFP4_SUFFIX})")
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
                    seed: int = 0, expert_sink: Callable | None = None,
                    linears: Linears = DEQUANTIZED_LINEARS) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """ModelConfig + weights (canonical names, experts stacked) for `synthetic:NAME`, on `device`. With
    expert_sink(layer, gate_up, down), each layer's experts go there as they are made instead. A -nvfp4 model's
    dense weights are in the real checkpoint's formats; linears: (keep native, Triton GEMV, W8A8 prefill) as the engine config resolved them."""
    config = synthetic_config(ref, vocab_size)
    _, geometry, _ = synthetic_geometry(ref)
    weights = random_weights(geometry, config.vocab_size, seed, device=device, dtype=dtype, expert_sink=expert_sink)
    for name in list(weights):
        if name.endswith(FP32_SUFFIXES):
            weights[name] = weights[name].float()
    if synthetic_nvfp4(ref):
        keep, kernels, scaled_mm = linears
        apply_real_formats(weights, config, dtype, keep, use_kernels=kernels, fp8_scaled_mm=scaled_mm)
    return config, weights


class SharedSynthetic:
    """One synthetic model's weights and host bank, shared by the engines of this process that load the same
    synthetic model (read-only after loading). Bench arms of the full-size model then cost their own slots,
    KV and graphs only, not another 65 GB of weights or another pinned bank each."""

    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor], bank):
        self.config, self.weights, self.bank = config, weights, bank


_SHARED: dict[tuple, "weakref.ref[SharedSynthetic]"] = {}


def shared_synthetic(ref: str, device: torch.device, dtype: torch.dtype, vocab_size: int,
                     make_bank: Callable[[ModelConfig], object] | None, native_nvfp4: bool = False,
                     linears: Linears = DEQUANTIZED_LINEARS) -> SharedSynthetic:
    """The live SharedSynthetic for this model, device, dtype and expert placement, or a new one. make_bank:
    None keeps the experts with the weights (resident); else it makes the host bank the experts stream into.
    For a -nvfp4 model the experts are quantized as they are made and kept as NVFP4 rows (native_nvfp4) or
    dequantized back to the compute dtype: either way the model's values are the quantized ones. Its dense
    linears likewise."""
    key = (ref, str(device), dtype, vocab_size, make_bank is not None, native_nvfp4, tuple(linears))
    found = _SHARED.get(key)
    shared = found() if found is not None else None
    if shared is None:
        config = synthetic_config(ref, vocab_size)
        bank = make_bank(config) if make_bank is not None else None
        resident: dict[str, torch.Tensor] = {}
        h, inter = config.hidden_size, config.moe.intermediate_size

        def sink(layer: int, gate_up: torch.Tensor, down: torch.Tensor) -> None:
            p = f"layers.{layer}.mlp.experts."
            if synthetic_nvfp4(ref):
                rows = quantize_expert_rows(as_stored_bf16(gate_up), as_stored_bf16(down))  # from the bf16 values
                if native_nvfp4:
                    if bank is not None:
                        bank.put_rows(layer, rows)
                    else:
                        resident[p + "nvfp4_rows"] = rows
                    return
                gate_up, down = dequant_expert_rows(rows, h, inter, dtype)
            if bank is not None:
                bank.put(layer, gate_up, down)
            else:
                resident[p + "gate_up_proj"], resident[p + "down_proj"] = gate_up, down

        _, weights = synthetic_model(ref, device, dtype, vocab_size, expert_sink=sink, linears=linears)
        weights.update(resident)
        shared = SharedSynthetic(config, weights, bank)
        _SHARED[key] = weakref.ref(shared)
    return shared
