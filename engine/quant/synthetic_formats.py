"""nvidia/Qwen3.6-35B-A3B-NVFP4's formats applied in memory to canonical weights (the synthetic `-nvfp4` models),
so a benchmark on random weights reads and computes what a user of that checkpoint gets.

The module lists and the quantizers are quant/convert.py's (the export that writes such a checkpoint from
BF16); what becomes of the quantized tensors is what load.py makes of the stored ones: QuantLinear layers
holding the bytes (native linears) or weights dequantized to the compute dtype (the CPU reference path).

Formats (shared/reference/model-formats.md §3.1): routed experts (quant/nvfp4_rows.py, not here), the shared
expert's gate/up/down and lm_head NVFP4 W4A16 (group 16, fp32 global scale per tensor); attention q/k/v/o and
GatedDeltaNet in_proj_qkv/in_proj_z/out_proj FP8 E4M3 (fp32 per-tensor scale); every other tensor BF16 (router,
shared_expert_gate, in_proj_a/b, conv1d, A_log, dt_bias, norms, embed_tokens).
"""
from __future__ import annotations

import math

import torch

from ..config import ModelConfig
from ..load import dense_shapes
from .convert import fp8_modules, nvfp4_modules
from .formats import GROUP, dequant_fp8, dequant_nvfp4, nvfp4_global_scale, quantize_fp8, quantize_nvfp4
from .linear import QuantLinear
from .scheme import BF16, FP8, NVFP4

# fp32 transient of one row block in quantize_nvfp4's nearest-code search (64 B per weight): the full-size
# lm_head in one call would take 32 GB of device memory.
QUANT_BLOCK_BYTES = 256 * 2**20


def as_stored_bf16(t: torch.Tensor) -> torch.Tensor:
    """The value a BF16 checkpoint holds, in t's dtype (no-op for a bf16 tensor; A_log/dt_bias stay fp32)."""
    return t if t.dtype == torch.bfloat16 else t.to(torch.bfloat16).to(t.dtype)


def dense_formats(cfg: ModelConfig) -> dict[str, str]:
    """Canonical name of every dense weight the real checkpoint quantizes -> NVFP4 | FP8 (the rest is BF16)."""
    return {**{m + ".weight": NVFP4 for m in nvfp4_modules(cfg)}, **{m + ".weight": FP8 for m in fp8_modules(cfg)}}


def quantize_nvfp4_blocked(w: torch.Tensor, block_bytes: int = QUANT_BLOCK_BYTES
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """quantize_nvfp4 over blocks of rows, byte-equal to one call (only the global scale spans rows)."""
    rows = max(1, block_bytes // (w.shape[1] * 64))
    if rows >= w.shape[0]:
        return quantize_nvfp4(w)
    scale2 = nvfp4_global_scale(w)
    parts = [quantize_nvfp4(w[r:r + rows], scale2) for r in range(0, w.shape[0], rows)]
    packed = torch.cat([p for p, _, _ in parts])
    scale = torch.cat([s.view(torch.uint8) for _, s, _ in parts]).view(torch.float8_e4m3fn)
    return packed, scale, scale2


def quantize_linear(w: torch.Tensor, fmt: str) -> dict[str, torch.Tensor]:
    """One weight -> its stored tensors under load.py's names (NVFP4: weight, weight_scale, weight_scale_2;
    FP8: weight, weight_scale), on w's device."""
    if fmt == NVFP4:
        packed, scale, scale2 = quantize_nvfp4_blocked(w)
        return {"weight": packed, "weight_scale": scale, "weight_scale_2": scale2}
    q, scale = quantize_fp8(w)
    return {"weight": q, "weight_scale": scale}


def apply_real_formats(weights: dict[str, torch.Tensor], cfg: ModelConfig, dtype: torch.dtype, native: bool,
                       use_kernels: bool = False, fp8_scaled_mm: bool = False) -> None:
    """In place, on the dense weights (canonical names; routed experts untouched): BF16 tensors rounded to their
    bf16 values (in their own dtype), FP8/NVFP4 linears quantized from their bf16 values, then kept as QuantLinear
    (native; use_kernels: Triton decode GEMV) or dequantized to `dtype`, exactly as load.py treats the checkpoint."""
    formats = dense_formats(cfg)
    for name in dense_shapes(cfg):
        fmt = formats.get(name, BF16)
        w = as_stored_bf16(weights[name])
        if fmt == BF16:
            weights[name] = w
            continue
        del weights[name]  # the compute-dtype copy goes before the next one is quantized (full size: 1 GB lm_head)
        tensors = quantize_linear(w, fmt)
        del w
        if native:
            weights[name] = QuantLinear(fmt, tensors, dtype, use_kernels=use_kernels, fp8_scaled_mm=fp8_scaled_mm)
        elif fmt == NVFP4:
            weights[name] = dequant_nvfp4(tensors["weight"], tensors["weight_scale"], tensors["weight_scale_2"], dtype)
        else:
            weights[name] = dequant_fp8(tensors["weight"], tensors["weight_scale"], dtype)


def stored_dense_bytes_of(cfg: ModelConfig) -> int:
    """Bytes of the non-expert text tensors as a ModelOpt export of this geometry stores them (quant/convert.py's
    layout; choices.stored_dense_bytes of such a checkpoint): FP8 linears with their scale and static input_scale,
    NVFP4 packed codes + E4M3 block scales + the global scale, everything else (A_log and dt_bias too) BF16."""
    formats = dense_formats(cfg)
    total = 0
    for name, shape in dense_shapes(cfg).items():
        n, fmt = math.prod(shape), formats.get(name, BF16)
        if fmt == NVFP4:
            total += n // 2 + n // GROUP + 4
        elif fmt == FP8:
            total += n + 4 + 4
        else:
            total += 2 * n
    return total
