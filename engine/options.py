"""User-facing engine options: one frozen dataclass, validated once. No torch here."""
from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace
from typing import Any, Mapping

from .errors import OptionError

PREFILL_MODES = ("auto", "chunked", "layer-major")
OVERLAP_MODES = ("auto", "off", "copy-side", "shared-side")
EXPERT_FORMATS = ("auto", "dense", "nvfp4")
LINEAR_FORMATS = ("auto", "native", "dequantized")
FP8_PREFILL = ("auto", "dequantize", "scaled-mm")
DECODE_KERNELS = ("auto", "fused", "fused-pdl", "reference")
PREFILL_KERNELS = ("auto", "fused", "torch")
GDN_GRAPHS = ("auto", "on", "off")
ATTENTION_PAIRS = ("auto", "on", "off")
PREFILL_ATTENTION = ("auto", "ragged", "paged")
MOE_PREFILL_BLOCKS = ("auto", "standard", "large")
_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 10**3, "kib": 2**10, "m": 2**20, "mb": 10**6, "mib": 2**20,
          "g": 2**30, "gb": 10**9, "gib": 2**30, "t": 2**40, "tb": 10**12, "tib": 2**40}


def parse_bytes(text: str | int | None, what: str = "size") -> int | None:
    """'16GiB' / '16G' / '15.5 GB' / 17179869184 -> bytes. None stays None."""
    if text is None or isinstance(text, int) and not isinstance(text, bool):
        if isinstance(text, int) and text <= 0:
            raise OptionError(f"{what} must be positive, got {text}")
        return text
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
    if not match or match.group(2).lower() not in _UNITS:
        raise OptionError(f"{what} {text!r} is not a size; write it like 16GiB, 15.5GB or 800MiB")
    value = int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    if value <= 0:
        raise OptionError(f"{what} must be positive, got {text!r}")
    return value


@dataclass(frozen=True)
class EngineOptions:
    """What the user (or a test, or the bench) asks of the engine. "auto" lets the plan decide."""

    prefill_chunk: int | None = None  # tokens per prefill chunk; None: the plan's (memory.prefill_chunk_for)
    prefill_mode: str = "auto"  # "auto" | "chunked" | "layer-major"
    overlap: str = "auto"  # "auto" | "off" | "copy-side" | "shared-side"
    cuda_graphs: bool = True  # capture the decode step in a CUDA graph where the device allows
    routing: Any = None  # None, or a synthetic-trace spec (benchmarks only)
    max_context: int | None = None  # tokens; None = the model's max_position_embeddings
    vram_budget: int | None = None  # bytes the engine may allocate on the GPU; None = what is free
    expert_slots: int | None = None  # offload the routed experts to host RAM with this many GPU slots
    prefill_window: int | None = None  # layer-major: tokens whose activations are parked at once (None = all)
    # NVFP4 experts: "nvfp4" keeps the checkpoint's 4-bit bytes in bank and slots (W4A16 kernels); "dense"
    # dequantizes them at load; "auto" = nvfp4 on a GPU with Triton, dense on the CPU.
    expert_format: str = "auto"
    # FP8/NVFP4 dense linears (attention, GDN, shared expert, lm_head): "native" keeps the checkpoint's bytes on
    # the device (W8A16/W4A16 GEMV in decode); "dequantized" expands them at load; "auto" = native on a GPU.
    linear_format: str = "auto"
    # Offloaded experts: a prompt of at most this many new tokens prefills through the slot cache (only its
    # missing experts cross PCIe) instead of streaming every layer's bank; 0 always streams.
    slot_prefill_tokens: int = 64
    # FP8 linears in prefill: "dequantize" = W8A16 (the weight dequantized per chunk, BF16 activations: the
    # decode GEMV's numbers); "scaled-mm" = W8A8 on FP8 tensor cores (activations quantized per token; a few
    # per cent error per matmul); "auto" = dequantize (choices.fp8_scaled_mm says why).
    fp8_prefill: str = "auto"
    # The batch-1 decode step: "fused" = the fused Triton decode kernels (fewer, larger launches: merged
    # projections, fused norms/router/GDN step/attention prologue, all-SM expert GEMVs); "reference" = the
    # unfused torch/Triton path they are tested against; "fused-pdl" = the fused kernels launched with
    # programmatic dependent launch (sm_90+: each launch overlaps the previous kernel's tail; the same bytes);
    # "auto" = fused-pdl on sm_90+, fused on other GPUs with Triton, reference on the CPU.
    decode_kernels: str = "auto"
    # Prefill's small kernels around its matmuls (the residual add + RMSNorms, GatedDeltaNet's gated norm and
    # causal conv): "fused" = one Triton launch each (GPU, Triton); "torch" = the reference path's torch ops
    # (~10 a norm); "auto" = torch until the fused kernels' GPU A/B has been measured.
    prefill_kernels: str = "auto"
    # GatedDeltaNet's chunked core (fla) over each full prefill chunk: "on" = one CUDA graph replayed for every
    # layer and chunk (kernels/gdn_graph.py: no host time for fla's ~8 launches a call); "off" = the plain
    # call; "auto" = off until its GPU A/B.
    gdn_graphs: str = "auto"
    # Layer-major prefill's attention over two adjacent chunks in one FlashInfer call, where the plans show it
    # gives each chunk its own call's bytes (model/attention_pairs.py): "on", "off"; "auto" = off (no gain measured
    # at 8,192-token chunks on the H200).
    attention_pairs: str = "auto"
    # How FlashInfer's prefill reads the KV cache: "ragged" = the pages as contiguous rows (one sequence owns
    # them in order; FA3 loads them with TMA), "paged" = through the page table; "auto" = ragged.
    prefill_attention: str = "auto"
    # The grouped prefill MoE kernels' row blocks at many pairs an expert (an 8,192-token chunk has 256):
    # "large" = 256-row blocks for NVFP4 experts, 64-row blocks for BF16 ones, from 192 pairs an expert (faster
    # per call on the H200, not yet paired in the engine); "standard" = the block rule of choose_config (NVFP4) /
    # 32 rows (BF16); "auto" = standard.
    moe_prefill_blocks: str = "auto"
    # CPU threads for torch (set once when a CPU engine is built); None = physical cores less one, at most 8.
    threads: int | None = None

    def __post_init__(self) -> None:
        chunk = self.prefill_chunk
        if chunk is not None and (not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1):
            raise OptionError(f"prefill_chunk must be a positive number of tokens, got {self.prefill_chunk!r}")
        if self.prefill_mode not in PREFILL_MODES:
            raise OptionError(f"prefill_mode {self.prefill_mode!r} is not one of {', '.join(PREFILL_MODES)}")
        if self.overlap not in OVERLAP_MODES:
            raise OptionError(f"overlap {self.overlap!r} is not one of {', '.join(OVERLAP_MODES)}")
        if not isinstance(self.cuda_graphs, bool):
            raise OptionError(f"cuda_graphs must be true or false, got {self.cuda_graphs!r}")
        if self.max_context is not None and (not isinstance(self.max_context, int) or self.max_context < 1):
            raise OptionError(f"max_context must be a positive number of tokens, got {self.max_context!r}")
        if self.expert_slots is not None and (not isinstance(self.expert_slots, int) or self.expert_slots < 1):
            raise OptionError(f"expert_slots must be a positive number of slots, got {self.expert_slots!r}")
        if self.prefill_window is not None and (not isinstance(self.prefill_window, int) or self.prefill_window < 1):
            raise OptionError(f"prefill_window must be a positive number of tokens, got {self.prefill_window!r}")
        if self.expert_format not in EXPERT_FORMATS:
            raise OptionError(f"expert_format {self.expert_format!r} is not one of {', '.join(EXPERT_FORMATS)}")
        if not isinstance(self.slot_prefill_tokens, int) or self.slot_prefill_tokens < 0:
            raise OptionError(f"slot_prefill_tokens must be a number of tokens >= 0, got {self.slot_prefill_tokens!r}")
        if self.linear_format not in LINEAR_FORMATS:
            raise OptionError(f"linear_format {self.linear_format!r} is not one of {', '.join(LINEAR_FORMATS)}")
        if self.fp8_prefill not in FP8_PREFILL:
            raise OptionError(f"fp8_prefill {self.fp8_prefill!r} is not one of {', '.join(FP8_PREFILL)}")
        if self.decode_kernels not in DECODE_KERNELS:
            raise OptionError(f"decode_kernels {self.decode_kernels!r} is not one of {', '.join(DECODE_KERNELS)}")
        if self.prefill_kernels not in PREFILL_KERNELS:
            raise OptionError(f"prefill_kernels {self.prefill_kernels!r} is not one of {', '.join(PREFILL_KERNELS)}")
        if self.gdn_graphs not in GDN_GRAPHS:
            raise OptionError(f"gdn_graphs {self.gdn_graphs!r} is not one of {', '.join(GDN_GRAPHS)}")
        if self.prefill_attention not in PREFILL_ATTENTION:
            raise OptionError(f"prefill_attention {self.prefill_attention!r} is not one of {', '.join(PREFILL_ATTENTION)}")
        if self.attention_pairs not in ATTENTION_PAIRS:
            raise OptionError(f"attention_pairs {self.attention_pairs!r} is not one of {', '.join(ATTENTION_PAIRS)}")
        if self.moe_prefill_blocks not in MOE_PREFILL_BLOCKS:
            raise OptionError(f"moe_prefill_blocks {self.moe_prefill_blocks!r} is not one of "
                              f"{', '.join(MOE_PREFILL_BLOCKS)}")
        if self.threads is not None and (not isinstance(self.threads, int) or isinstance(self.threads, bool)
                                         or self.threads < 1):
            raise OptionError(f"threads must be a positive number of CPU threads, got {self.threads!r}")
        if self.fp8_prefill == "scaled-mm" and self.linear_format == "dequantized":
            raise OptionError("fp8_prefill=scaled-mm multiplies the checkpoint's FP8 bytes; it cannot run with "
                              "linear_format=dequantized (use linear_format=auto or native)")
        object.__setattr__(self, "vram_budget", parse_bytes(self.vram_budget, "vram_budget"))

    @classmethod
    def coerce(cls, value: "EngineOptions | Mapping[str, Any] | None", **overrides: Any) -> "EngineOptions":
        """None, a dict of fields or an EngineOptions -> EngineOptions; unknown keys are an error."""
        if value is None:
            base = cls()
        elif isinstance(value, cls):
            base = value
        elif isinstance(value, Mapping):
            known = {f.name for f in fields(cls)}
            unknown = sorted(set(value) - known)
            if unknown:
                raise OptionError(f"unknown engine option(s) {unknown}; known: {sorted(known)}")
            base = cls(**dict(value))
        else:
            raise OptionError(f"options must be an EngineOptions or a dict, got {type(value).__name__}")
        overrides = {k: v for k, v in overrides.items() if v is not None}
        return replace(base, **overrides) if overrides else base
