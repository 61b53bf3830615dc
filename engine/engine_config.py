"""EngineConfig: every decision the engine runs with, each with its value and the reason, frozen.

Made once by `resolve` (engine/resolve.py) before any weight is read; loading, the model, the runner and the
kernel selection read it and decide nothing; `Engine.plan` is it, rendered. No torch.
"""
from __future__ import annotations

import importlib.util
from dataclasses import asdict, dataclass, field
from typing import Any

from .memory import VramBudget, gib

# Every decision, in display order. The names are also the keys of `Engine.plan` and of `to_dict()`.
DECISIONS = ("device", "dtype", "vram_budget", "max_context", "prefill_chunk", "experts", "linears", "fp8_prefill",
             "slots", "bank", "stream_buffers", "overlap", "prefill_mode", "prefill_window", "slot_prefill_tokens",
             "attention", "prefill_attention", "attention_pairs", "gdn", "moe", "moe_prefill_blocks", "decode", "prefill_kernels",
             "cuda_graphs", "routing", "threads")
# EngineOptions field -> the decision that reports it (a test holds every field to one).
OPTION_DECISIONS = {"prefill_chunk": "prefill_chunk", "prefill_mode": "prefill_mode", "overlap": "overlap",
                    "cuda_graphs": "cuda_graphs", "routing": "routing", "max_context": "max_context",
                    "vram_budget": "vram_budget", "expert_slots": "slots", "prefill_window": "prefill_window",
                    "expert_format": "experts", "linear_format": "linears", "slot_prefill_tokens": "slot_prefill_tokens",
                    "fp8_prefill": "fp8_prefill", "decode_kernels": "decode", "prefill_kernels": "prefill_kernels",
                    "gdn_graphs": "gdn", "attention_pairs": "attention_pairs",
                    "prefill_attention": "prefill_attention", "moe_prefill_blocks": "moe_prefill_blocks",
                    "threads": "threads"}


def decisions_dict(decided) -> dict[str, Any]:
    """A Plan or EngineConfig as JSON-ready data: its values, the VRAM breakdown, reasons and overrides."""
    out = {k: v for k, v in asdict(decided).items() if k not in ("reasons", "overridden", "vram")}
    out["vram"] = asdict(decided.vram) if decided.vram else None
    out["reasons"] = dict(decided.reasons)
    out["overridden"] = sorted(decided.overridden)
    return out


@dataclass(frozen=True)
class Software:
    """Which optional kernel packages this process can use (the engine imports them to be sure)."""

    triton: bool = False
    flashinfer: bool = False
    fla: bool = False
    fp8_tensor_cores: bool = True  # FP8 tensor-core matmul (sm_89+); the CPU has torch's own kernel

    @classmethod
    def installed(cls, fp8_tensor_cores: bool = True) -> "Software":
        """What is installed, without importing anything (probe, fit checks): find_spec only."""
        def has(name: str) -> bool:
            try:
                return importlib.util.find_spec(name) is not None
            except (ImportError, ValueError):
                return False

        return cls(triton=has("triton"), flashinfer=has("flashinfer"), fla=has("fla"),
                   fp8_tensor_cores=fp8_tensor_cores)


@dataclass(frozen=True)
class EngineConfig:
    device: str  # "cpu" | "cuda"
    dtype: str  # compute dtype: "float32" | "bfloat16" | "float16"
    vram_budget: int | None  # bytes the engine may use on the GPU (None on the CPU)
    max_context: int  # tokens: the KV cache, and every context check
    prefill_chunk: int  # tokens per prefill chunk
    experts: str  # routed experts in bank, slots and kernels: "dense" (compute dtype) | "nvfp4" (4-bit rows)
    linears: str  # FP8/NVFP4 dense linears: "native" (stored bytes) | "dequantized" | "dense" (none quantized)
    linear_kernels: bool  # native linears run their decode GEMV in Triton
    fp8_prefill: str  # "dequantize" (W8A16) | "scaled-mm" (W8A8)
    slots: int | None  # expert slots of the offload cache; None = every expert resident with the weights
    bank: str  # "resident" | "host" (CPU, unpinned) | "pin-all" | "pin-partial" | "pageable"
    bank_pinned: bool  # the loader allocates the host bank in page-locked memory
    stream_buffers: str  # prefill's two whole-layer buffers: "none" | "borrowed" (trailing slots) | "dedicated"
    overlap: str  # decode overlap split: "off" | "copy-side" | "shared-side"
    prefill_mode: str  # "chunked" | "layer-major"
    layer_major_min_tokens: int | None  # layer-major for prompts of at least this many new tokens
    prefill_window: int | None  # layer-major: tokens parked at once (None = the whole prompt)
    slot_prefill_tokens: int  # prompts up to this long prefill through the slot cache (0: never)
    attention: str  # "flashinfer" | "sdpa"
    gdn: str  # "fla" | "fla-graphs" (each full prefill chunk's core one CUDA graph replay) | "torch"
    moe: str  # "triton" | "torch"
    decode: str  # "fused-pdl" | "fused" | "reference"
    cuda_graphs: bool  # the decode step replays one captured CUDA graph
    routing: str | None  # a synthetic routing trace (benchmarks), described; None = the model's router
    threads: int | None  # torch CPU threads, set at engine build on the CPU; None on a GPU (left as torch has it)
    prefill_kernels: str = "torch"  # prefill's small kernels (norms, GDN conv): "fused" (Triton) | "torch"
    attention_pairs: bool = False  # layer-major prefill attends two adjacent chunks in one call where byte-identical
    prefill_attention: str = "ragged"  # FlashInfer prefill over the KV as "ragged" rows | "paged"; "sdpa" without it
    moe_prefill_blocks: str = "standard"  # the grouped prefill MoE kernels' row blocks: "standard" | "large"
    vram: VramBudget | None = None  # the VRAM arithmetic on a GPU
    reasons: dict = field(default_factory=dict)  # decision -> one line
    overridden: frozenset = frozenset()  # decisions the user set

    @property
    def offloaded(self) -> bool:
        return self.slots is not None

    @property
    def layer_major(self) -> bool:
        return self.prefill_mode == "layer-major"

    def reason(self, name: str) -> str:
        return self.reasons[name]

    def display_value(self, name: str) -> Any:
        """The value as Engine.plan shows it (plain data: str, int, bool)."""
        value = getattr(self, name)
        if name == "vram_budget":
            return gib(value) if value else "-"
        if name == "experts":
            return "nvfp4 rows (W4A16)" if value == "nvfp4" else "dense"
        if name == "linears":
            return "native fp8/nvfp4" if value == "native" else "dense"
        if name == "slots":
            return "all experts resident" if value is None else value
        if name == "prefill_mode":
            return f"layer-major above {self.layer_major_min_tokens - 1} tokens" if self.layer_major else "chunked"
        if name == "prefill_window":
            return "whole prompt" if value is None else value
        if name == "routing":
            return value or "the model's router"
        if name == "attention_pairs":
            return "pairs of chunks where byte-identical" if value else "one call per chunk"
        if name == "threads":
            return "torch's default" if value is None else value
        return value

    def rows(self) -> list[tuple[str, Any, str, bool]]:
        """(decision, shown value, reason, set by the user) in DECISIONS order."""
        return [(n, self.display_value(n), self.reasons[n], n in self.overridden) for n in DECISIONS]

    def render(self) -> dict:
        """Engine.plan: decision -> {"value", "reason", "by"}."""
        return {n: {"value": v, "reason": r, "by": "user" if u else "auto"} for n, v, r, u in self.rows()}

    def summary(self) -> str:
        slots = "experts resident" if self.slots is None else f"{self.slots} slots"
        lm = f"layer-major >{self.layer_major_min_tokens - 1}" if self.layer_major else "chunked prefill"
        return (f"{self.device} {self.dtype} · {slots} · overlap {self.overlap} · {lm} · attention {self.attention} "
                f"· moe {self.moe} · decode {self.decode} · graphs {'on' if self.cuda_graphs else 'off'} · "
                f"context {self.max_context:,}" + (f" · {self.threads} threads" if self.threads else ""))

    def to_dict(self) -> dict[str, Any]:
        return decisions_dict(self)
