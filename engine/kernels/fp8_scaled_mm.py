"""FP8 W8A8 matmul on tensor cores (torch._scaled_mm, sm_89 and newer) for prefill, and its torch reference.

The checkpoint's FP8 projections (E4M3 weights, one fp32 weight_scale) feed the tensor cores as they are; the
activations are quantized to E4M3 per token: scale = amax(row) / 448, so no row clips. The checkpoint's static
`input_scale` is not used: it was calibrated on other text, and a prompt whose activations exceed that range
would clip, while the per-token scale is exact at each row's maximum. Where the GPU has no row-wise scaled
matmul the scale is one amax over the whole chunk (per tensor). Error against the BF16-activation path: the
E4M3 rounding of the activations (3 mantissa bits), a few per cent per matmul on random data; measured numbers
are in docs/RESULTS.md. The weight is never dequantized (W8A16 prefill dequantizes it for every chunk).
"""
from __future__ import annotations

import functools

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
_TINY = 1e-12  # an all-zero row: any positive scale quantizes it to zeros


def quantize_activations(x: torch.Tensor, rowwise: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (E4M3 [M, K], fp32 scale [M, 1] per row, or [] per tensor) with x ~ q * scale."""
    # Four passes over x-sized data: max |x| (one reduction, no |x| copy), x / scale (promoted to fp32 in the
    # division itself), the clamp in place, the cast.
    amax = torch.linalg.vector_norm(x, ord=float("inf"), dim=-1, keepdim=True) if rowwise else x.abs().max()
    scale = amax.float().clamp(min=_TINY) / FP8_MAX
    # (a 0-dim fp32 divisor would not promote a bf16 x: the per-tensor scale divides as [1, 1])
    q = torch.div(x, scale if rowwise else scale.reshape(1, 1)).clamp_(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale


def fp8_linear_w8a8(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, rowwise: bool) -> torch.Tensor:
    """x [M, K] (bf16/fp16/fp32), weight E4M3 [N, K], weight_scale fp32 [] -> x @ W^T [M, N] in x.dtype."""
    q, scale_a = quantize_activations(x, rowwise)
    n = weight.shape[0]
    scale_b = weight_scale.float().reshape(1, 1).expand(1, n).contiguous() if rowwise else weight_scale.float()
    # weight.t() is the column-major [K, N] operand _scaled_mm wants, without a copy.
    return torch._scaled_mm(q, weight.t(), scale_a=scale_a, scale_b=scale_b, out_dtype=x.dtype)


def fp8_linear_w8a8_reference(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                              rowwise: bool) -> torch.Tensor:
    """The same quantization, dequantized and multiplied in fp32."""
    q, scale_a = quantize_activations(x, rowwise)
    return (q.float() * scale_a) @ (weight.float() * weight_scale.float()).t()


def shapes_supported(in_features: int, out_features: int) -> bool:
    return in_features % 16 == 0 and out_features % 16 == 0  # _scaled_mm's operand alignment


@functools.cache
def rowwise_supported(device: torch.device) -> bool:
    """One tiny row-wise _scaled_mm on this device (once per process): False where only per-tensor exists."""
    a = torch.zeros(16, 16, device=device, dtype=FP8)
    try:
        torch._scaled_mm(a, a.t(), scale_a=torch.ones(16, 1, device=device),
                         scale_b=torch.ones(1, 16, device=device), out_dtype=torch.bfloat16)
    except (RuntimeError, NotImplementedError):
        return False
    return True


def fp8_tensor_cores(device: torch.device) -> bool:
    """FP8 tensor-core matmul: Ada (sm_89), Hopper (sm_90), Blackwell; any CPU (torch's own kernel)."""
    if device.type != "cuda":
        return True
    return torch.cuda.get_device_capability(device) >= (8, 9)
