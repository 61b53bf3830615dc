"""Which kernel runs each part of the model, chosen once per engine, with a reason for each choice."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Callable

import torch

from ..config import ModelConfig
from ..kernels.gdn_torch import gdn_core_torch
from .attention_backends import FlashInferAttention, SdpaAttention, flashinfer_available
from .moe import (nvfp4_experts_decode_reference, nvfp4_experts_reference, routed_experts_decode_reference,
                  routed_experts_reference)


@dataclass(frozen=True)
class Kernels:
    attention: object  # SdpaAttention | FlashInferAttention
    gdn: Callable
    experts_prefill: Callable
    experts_decode: Callable
    graph_safe: bool  # every decode-path kernel can be captured in a CUDA graph (no host sync, fixed shapes)
    choices: dict = field(default_factory=dict)  # part -> (name, reason)
    # The same two over native NVFP4 expert rows: f(x, weights, ids, rows).
    experts_prefill_nvfp4: Callable | None = None
    experts_decode_nvfp4: Callable | None = None
    fused_decode: bool = False  # the batch-1 decode step runs the fused Triton kernels (options.decode_kernels)


# Head sizes FlashInfer ships/compiles attention kernels for, and fla's GDN kernels handle.
FLASHINFER_HEAD_DIMS = (64, 128, 256)
FLA_HEAD_DIMS = (16, 32, 64, 128, 256)


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


def select_kernels(cfg: ModelConfig, device: torch.device, dtype: torch.dtype, max_len: int,
                   attention: str = "auto", fused_decode: bool = False) -> Kernels:
    a = cfg.attention
    choices = {}
    if device.type != "cuda":
        attn = SdpaAttention(a.num_heads, a.num_kv_heads, a.head_dim)
        choices["attention"] = ("sdpa", "CPU: torch SDPA over a contiguous KV cache (the reference path)")
        choices["gdn"] = ("torch", "CPU: the torch chunked/recurrent gated delta rule (the reference path)")
        choices["moe"] = ("torch", "CPU: per-expert loop over the chosen experts (the reference path)")
        return Kernels(attn, gdn_core_torch, routed_experts_reference, routed_experts_decode_reference, False, choices,
                       *_nvfp4_references(cfg))

    fi_ok = a.head_dim in FLASHINFER_HEAD_DIMS and dtype in (torch.bfloat16, torch.float16)
    if attention in ("auto", "flashinfer") and fi_ok and flashinfer_available():
        attn = FlashInferAttention(a.num_heads, a.num_kv_heads, a.head_dim, dtype, device, max_len)
        choices["attention"] = ("flashinfer", "GPU: FlashInfer paged prefill and CUDA-graph decode")
    else:
        attn = SdpaAttention(a.num_heads, a.num_kv_heads, a.head_dim)
        why = ("forced by the attention option" if attention == "sdpa" else
               f"FlashInfer has no kernels for head_dim {a.head_dim} in {dtype}" if not fi_ok else
               "FlashInfer is not installed")
        choices["attention"] = ("sdpa", f"torch SDPA: {why} (no CUDA graphs with this backend)")

    from ..kernels.gdn_fla import fla_available, gdn_core_fla

    lin = cfg.linear
    fla_ok = lin.key_head_dim in FLA_HEAD_DIMS and lin.value_head_dim in FLA_HEAD_DIMS
    if fla_ok and fla_available():
        gdn, choices["gdn"] = gdn_core_fla, ("fla", "fla-core chunked rule (prefill) and fused recurrent (decode)")
    else:
        why = "fla-core is not installed" if fla_ok else f"fla does not take head dims {lin.key_head_dim}/{lin.value_head_dim}"
        gdn, choices["gdn"] = gdn_core_torch, ("torch", f"{why}: torch reference rule")

    if _triton_available():
        from ..kernels.moe_triton import moe_decode, moe_grouped
        from ..kernels.nvfp4_grouped import nvfp4_moe_grouped
        from ..kernels.nvfp4_triton import nvfp4_moe_decode

        prefill, decode = moe_grouped, moe_decode
        h, i = cfg.hidden_size, cfg.moe.intermediate_size
        nvfp4 = (partial(nvfp4_moe_grouped, hidden=h, inter=i), partial(nvfp4_moe_decode, hidden=h, inter=i))
        choices["moe"] = ("triton", "Triton grouped GEMM (prefill) and a k-expert GEMV (decode); NVFP4 experts "
                                    "dequantized on the fly (W4A16)")
    else:
        prefill, decode = routed_experts_reference, routed_experts_decode_reference
        nvfp4 = _nvfp4_references(cfg)
        choices["moe"] = ("torch", "Triton is not available: per-expert loop (syncs; no CUDA graphs)")
    graph_safe = attn.graph_safe and decode is not routed_experts_decode_reference
    fused = fused_decode and decode is not routed_experts_decode_reference
    choices["decode"] = (("fused", "fused Triton batch-1 decode kernels") if fused else
                         ("reference", "the unfused decode path" + ("" if not fused_decode else
                                                                    " (Triton is not available)")))
    return Kernels(attn, gdn, prefill, decode, graph_safe, choices, *nvfp4, fused_decode=fused)


def _nvfp4_references(cfg: ModelConfig) -> tuple[Callable, Callable]:
    h, i = cfg.hidden_size, cfg.moe.intermediate_size
    return (partial(nvfp4_experts_reference, hidden=h, inter=i),
            partial(nvfp4_experts_decode_reference, hidden=h, inter=i))
