"""A linear layer whose weight stays on the device in the checkpoint's FP8 or NVFP4 bytes.

Why: nvidia/Qwen3.6-35B-A3B-NVFP4's dense part is ~2.7 GB in its own formats and ~4.9 GB dequantized to
BF16; on a 16 GB card the 2.2 GB difference is ~1,200 more NVFP4 expert slots. One token (the decode step)
goes through a W8A16 / W4A16 GEMV that dequantizes on the fly (Triton, graph-capturable); more tokens (prefill)
dequantize the weight in row blocks of at most BLOCK_BYTES into a transient buffer and run a dense matmul
(compute-bound there, so the dequantization is a small extra). Without the kernels (the CPU reference
path) every call dequantizes, which is exactly what loading dequantized weights would compute.
With fp8_scaled_mm, an FP8 layer's prefill (more than one token) runs W8A8 on the tensor cores instead
(kernels/fp8_scaled_mm.py: activations quantized per token, the weight bytes used as stored).
Layer-major prefill runs every chunk of a window through one layer before the next: inside `dequantized_once()`
a layer's weights are dequantized for its first chunk and reused by the others (the same values, so the bytes
equal chunked prefill's), instead of once per chunk (at 16K that was 24 dequantizations per layer, most of
TTFT's host time: docs/RESULTS.md, session 7).
"""
from __future__ import annotations

import contextlib
import contextvars

import torch
import torch.nn.functional as F

from ..kernels.fp8_scaled_mm import fp8_linear_w8a8, rowwise_supported, shapes_supported
from .formats import dequant_fp8, dequant_nvfp4
from .scheme import FP8, NVFP4

BLOCK_BYTES = 64 * 2**20  # transient dequantized rows per block in prefill (the lm_head alone is ~1 GB in BF16)
MEMO_BYTES = 2 * BLOCK_BYTES  # at most this much of one layer's dequantized weights is kept for its next chunks

# (linear id, start, stop) -> dequantized rows, and the bytes held; None outside dequantized_once().
_memo: contextvars.ContextVar[dict | None] = contextvars.ContextVar("qwenlocal_dequant_memo", default=None)


@contextlib.contextmanager
def dequantized_once():
    """Inside: each QuantLinear's dequantized rows are computed once and reused (up to MEMO_BYTES in all, then
    per call again); released on exit. For one layer of layer-major prefill, whose chunks share the weights."""
    token = _memo.set({"bytes": 0})
    try:
        yield
    finally:
        _memo.reset(token)


class QuantLinear:
    def __init__(self, fmt: str, tensors: dict[str, torch.Tensor], dtype: torch.dtype, use_kernels: bool,
                 fp8_scaled_mm: bool = False):
        """fmt FP8: tensors weight (float8_e4m3fn [N, K]) and weight_scale; NVFP4: weight (uint8 [N, K/2]),
        weight_scale (float8_e4m3fn [N, K/16]) and weight_scale_2. dtype: what the dequantized weight is.
        fp8_scaled_mm: FP8 prefill as W8A8 on tensor cores (ignored for NVFP4 and for unaligned shapes)."""
        if fmt not in (FP8, NVFP4):
            raise ValueError(f"no quantized linear for format {fmt!r}")
        self.fmt, self.dtype, self.use_kernels = fmt, dtype, use_kernels
        self.tensors = tensors
        w = tensors["weight"]
        self.out_features = w.shape[0]
        self.in_features = w.shape[1] * (2 if fmt == NVFP4 else 1)
        self.nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
        row_bytes = self.in_features * torch.finfo(dtype).bits // 8
        self.block_rows = max(1, BLOCK_BYTES // row_bytes)
        self.scaled_mm = fp8_scaled_mm and fmt == FP8 and shapes_supported(self.in_features, self.out_features)
        self.rowwise = self.scaled_mm and rowwise_supported(w.device)

    @property
    def device(self) -> torch.device:
        return self.tensors["weight"].device

    def dequantize(self, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Rows start:stop of the weight in self.dtype: quant.formats' torch reference, or with the kernels on a
        GPU its one-pass Triton twin (byte-equal to it: tests/test_kernels_dequant.py); reused inside
        dequantized_once()."""
        memo = _memo.get()
        key = (id(self), start, stop)
        if memo is not None and key in memo:
            return memo[key]
        w = self._dequantize(slice(start, stop))
        if memo is not None and memo["bytes"] + w.numel() * w.element_size() <= MEMO_BYTES:
            memo[key] = w
            memo["bytes"] += w.numel() * w.element_size()
        return w

    def _dequantize(self, rows: slice) -> torch.Tensor:
        t = self.tensors
        fast = self.use_kernels and t["weight"].is_cuda
        if self.fmt == NVFP4:
            if fast:
                from ..kernels.nvfp4_triton import nvfp4_dequant

                return nvfp4_dequant(t["weight"][rows], t["weight_scale"][rows], t["weight_scale_2"], self.dtype)
            return dequant_nvfp4(t["weight"][rows], t["weight_scale"][rows], t["weight_scale_2"], self.dtype)
        if fast:
            from ..kernels.fp8_triton import fp8_dequant

            return fp8_dequant(t["weight"][rows], t["weight_scale"], self.dtype)
        return dequant_fp8(t["weight"][rows], t["weight_scale"], self.dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        flat = x.reshape(-1, self.in_features)
        if flat.shape[0] == 1 and self.use_kernels:
            t = self.tensors
            if self.fmt == NVFP4:
                from ..kernels.nvfp4_triton import nvfp4_gemv

                y = nvfp4_gemv(flat[0], t["weight"], t["weight_scale"], t["weight_scale_2"])
            else:
                from ..kernels.fp8_triton import fp8_gemv

                y = fp8_gemv(flat[0], t["weight"], t["weight_scale"])
            return y.to(x.dtype).view(*lead, self.out_features)
        if self.scaled_mm and flat.shape[0] > 1:
            t = self.tensors
            return fp8_linear_w8a8(flat, t["weight"], t["weight_scale"], self.rowwise).view(*lead, self.out_features)
        if self.block_rows >= self.out_features:
            return F.linear(x, self.dequantize())
        parts = [F.linear(flat, self.dequantize(r, r + self.block_rows))
                 for r in range(0, self.out_features, self.block_rows)]
        return torch.cat(parts, dim=-1).view(*lead, self.out_features)


def linear(x: torch.Tensor, weight) -> torch.Tensor:
    """F.linear for a plain weight tensor; the quantized layer's own path for a QuantLinear."""
    if isinstance(weight, QuantLinear):
        return weight(x)
    return F.linear(x, weight)
