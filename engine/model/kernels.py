"""Which kernel runs each part of the model, chosen once per engine, with a reason for each choice."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Callable

import torch

from ..config import ModelConfig
from ..kernels.gdn_torch import gdn_core_torch
from .attention_backends import FlashInferAttention, SdpaAttention
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
    pdl: bool = False  # ... launched with programmatic dependent launch (decode "fused-pdl", sm_90+)
    fused_prefill: bool = False  # prefill's norms, GDN conv, q/k RoPE in a Triton launch each (prefill_kernels)


# Head sizes FlashInfer ships/compiles attention kernels for, and fla's GDN kernels handle (resolve decides).
from ..kernel_rules import FLA_HEAD_DIMS, FLASHINFER_HEAD_DIMS  # noqa: E402,F401

KERNEL_PARTS = ("attention", "gdn", "moe", "decode", "prefill_kernels")


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


def select_kernels(cfg: ModelConfig, device: torch.device, dtype: torch.dtype, max_len: int,
                   attention: str = "auto", fused_decode: bool = False, *, config=None) -> Kernels:
    """The kernels an EngineConfig names (config.attention/gdn/moe/decode, with their reasons); it decides
    nothing. Without a config (tools, old callers) the names come from kernel_rules.kernel_choices for this
    process; attention="sdpa" then forces SDPA and fused_decode asks for the fused decode step."""
    if config is not None:
        choices = {part: (getattr(config, part), config.reason(part)) for part in KERNEL_PARTS}
    else:
        from ..choices import DTYPE_NAMES, detect_software
        from ..memory import ModelInfo
        from ..kernel_rules import kernel_choices

        choices = kernel_choices(ModelInfo.from_config(cfg), device.type, DTYPE_NAMES[dtype],
                                 "auto" if fused_decode else "reference", detect_software(device))
        if attention == "sdpa" and choices["attention"][0] != "sdpa":
            choices["attention"] = ("sdpa", "torch SDPA: forced by the attention option (no CUDA graphs with this "
                                            "backend)")
    return build_kernels(cfg, device, dtype, max_len, choices,
                         config.prefill_chunk if config is not None else None,
                         config.attention_pairs if config is not None else False,
                         config.prefill_attention if config is not None else "ragged",
                         config.moe_prefill_blocks == "large" if config is not None else False)


def build_kernels(cfg: ModelConfig, device: torch.device, dtype: torch.dtype, max_len: int,
                  choices: dict[str, tuple[str, str]], prefill_chunk: int | None = None,
                  attention_pairs: bool = False, prefill_attention: str = "ragged",
                  large_moe_blocks: bool = False) -> Kernels:
    a = cfg.attention
    if choices["attention"][0] == "flashinfer":
        attn = FlashInferAttention(a.num_heads, a.num_kv_heads, a.head_dim, dtype, device, max_len,
                                   pairs=attention_pairs, prefill_kv=prefill_attention)
    else:
        attn = SdpaAttention(a.num_heads, a.num_kv_heads, a.head_dim)
    if choices["gdn"][0] in ("fla", "fla-graphs"):
        from ..kernels.gdn_fla import gdn_core_fla

        gdn = gdn_core_fla
        if choices["gdn"][0] == "fla-graphs":  # resolve gives it only on a GPU, with the plan's prefill chunk
            from ..kernels.gdn_graph import ChunkGraphs

            gdn = ChunkGraphs(gdn_core_fla, prefill_chunk)
    else:
        gdn = gdn_core_torch
    if choices["moe"][0] == "triton":
        from ..kernels.moe_triton import moe_decode, moe_grouped
        from ..kernels.nvfp4_grouped import nvfp4_moe_grouped
        from ..kernels.nvfp4_triton import nvfp4_moe_decode

        # large_moe_blocks: the grouped kernels' large-block rule (config.moe_prefill_blocks; the same for chunked
        # and layer-major prefill, whose chunks are the same shapes: their bytes stay equal)
        prefill = partial(moe_grouped, large_blocks=True) if large_moe_blocks else moe_grouped
        decode = moe_decode
        h, i = cfg.hidden_size, cfg.moe.intermediate_size
        nvfp4 = (partial(nvfp4_moe_grouped, hidden=h, inter=i, large_blocks=large_moe_blocks),
                 partial(nvfp4_moe_decode, hidden=h, inter=i))
    else:
        prefill, decode = routed_experts_reference, routed_experts_decode_reference
        nvfp4 = _nvfp4_references(cfg)
    graph_safe = attn.graph_safe and decode is not routed_experts_decode_reference
    fused = choices["decode"][0] in ("fused", "fused-pdl") and decode is not routed_experts_decode_reference
    return Kernels(attn, gdn, prefill, decode, graph_safe, dict(choices), *nvfp4, fused_decode=fused,
                   pdl=fused and choices["decode"][0] == "fused-pdl",
                   fused_prefill=choices.get("prefill_kernels", ("torch", ""))[0] == "fused")


def _nvfp4_references(cfg: ModelConfig) -> tuple[Callable, Callable]:
    h, i = cfg.hidden_size, cfg.moe.intermediate_size
    return (partial(nvfp4_experts_reference, hidden=h, inter=i),
            partial(nvfp4_experts_decode_reference, hidden=h, inter=i))
