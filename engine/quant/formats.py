"""NVFP4 and FP8 weight formats (ModelOpt's, as in nvidia/Qwen3.6-35B-A3B-NVFP4), torch references.

NVFP4 (W4A16): two E2M1 codes per byte, element 2j in the LOW nibble and 2j+1 in the high nibble; bit 3 is
the sign, bits 0-2 index {0, 0.5, 1, 1.5, 2, 3, 4, 6}; one FP8 E4M3 scale per 16 inputs (plain row-major
[out, in/16]); one FP32 global scale `weight_scale_2` = amax / (6 * 448).
    W[r, c] = e2m1(code[r, c]) * float(weight_scale[r, c // 16]) * weight_scale_2
FP8: W = float(fp8) * weight_scale (scalar). The checkpoint's static `input_scale` is for W8A8 kernels; the
reference path keeps activations in the compute dtype (weight-only dequantization).
"""
from __future__ import annotations

import torch

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
GROUP = 16
FP8_MAX = 448.0
FP4_MAX = 6.0


_TABLES: dict[str, torch.Tensor] = {}


def e2m1_table(device=None) -> torch.Tensor:
    """The 16 code values, made once per device: a fresh host-to-device tensor each call waits for the GPU (960
    such waits in one 16K prefill: docs/RESULTS.md, session 7)."""
    key = str(torch.device(device) if device is not None else torch.device("cpu"))
    table = _TABLES.get(key)
    if table is None:
        pos = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=device)
        table = _TABLES[key] = torch.cat([pos, -pos])  # codes 8-15 are the negatives
    return table


def dequant_nvfp4(packed: torch.Tensor, scale: torch.Tensor, scale2: torch.Tensor,
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """packed uint8 [out, in/2], scale float8_e4m3fn [out, in/16], scale2 fp32 [] -> [out, in]."""
    table = e2m1_table(packed.device)
    low, high = (packed & 0x0F).long(), (packed >> 4).long()
    codes = torch.stack([low, high], dim=-1).reshape(packed.shape[0], packed.shape[1] * 2)
    values = table[codes]
    block = scale.float().repeat_interleave(GROUP, dim=1)
    return (values * block * scale2.float()).to(dtype)


def nvfp4_global_scale(w: torch.Tensor) -> torch.Tensor:
    """weight_scale_2 = amax(W) / (6 * 448), fp32 []."""
    return (w.float().abs().max().clamp(min=1e-12) / (FP4_MAX * FP8_MAX)).reshape(())


def quantize_nvfp4(w: torch.Tensor, scale2: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ModelOpt's recipe: -> (packed uint8 [out, in/2], scale float8_e4m3fn [out, in/16], scale2 fp32 []).
    scale2: the whole tensor's global scale when `w` is a block of its rows (every other step is per row)."""
    out, inp = w.shape
    if inp % GROUP:
        raise ValueError(f"NVFP4 needs the input dimension to be a multiple of {GROUP}, got {inp}")
    w = w.float()
    scale2 = nvfp4_global_scale(w) if scale2 is None else scale2.float().reshape(())
    blocks = w.reshape(out, inp // GROUP, GROUP)
    block_amax = blocks.abs().amax(dim=-1)
    scale = (block_amax / (FP4_MAX * scale2)).clamp(2.0 ** -9, FP8_MAX).to(torch.float8_e4m3fn)
    scaled = blocks / (scale.float() * scale2)[..., None]
    table = e2m1_table(w.device)
    codes = (scaled.reshape(out, inp, 1) - table).abs().argmin(dim=-1).to(torch.uint8)  # nearest E2M1 value
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return packed, scale, scale2.reshape(())


def dequant_fp8(w: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (w.float() * scale.float()).to(dtype)


def quantize_fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor FP8 E4M3: -> (float8_e4m3fn weights, fp32 scale [])."""
    scale = w.float().abs().max().clamp(min=1e-12) / FP8_MAX
    return (w.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale.reshape(())
