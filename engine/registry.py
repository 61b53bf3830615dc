"""Known checkpoints and synthetic models: names, aliases, sizes and expert formats. No torch, no I/O.

The sizes come from shared/reference/model-formats.md (§2.7, §3.3-3.4, §5) and are what the fit checks use
before anything is downloaded or loaded. A checkpoint not listed here still works (`qwenlocal download
owner/name`, `--model /folder`); its sizes are then read from its own config.json and safetensors headers.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .memory import ModelInfo
from .plan import QWEN36_35B_A3B_NVFP4, ModelFacts

SYNTHETIC_PREFIX = "synthetic:"

# The BF16 checkpoint: experts fused per layer, 6 MiB each (model-formats §2.4); every dense weight in BF16
# (§2.7 "non-expert text"). KV cache and GDN state do not depend on the weight format.
QWEN36_35B_A3B_BF16 = replace(QWEN36_35B_A3B_NVFP4, name="Qwen3.6-35B-A3B BF16", expert_bytes=6_291_456,
                              dense_bytes=4_896_711_936)
QWEN35_35B_A3B_BF16 = replace(QWEN36_35B_A3B_BF16, name="Qwen3.5-35B-A3B BF16")
# synthetic:qwen3.6-35b-a3b-nvfp4: the NVFP4 checkpoint's formats made in memory (quant/synthetic_formats.py):
# its stored dense bytes (2,705,517,300, what the engine's plan gets with native linears) and the experts as the
# engine's native NVFP4 rows (quant/nvfp4_rows.py: 1,769,484 B, held at a 16-byte stride: 1,769,488 B); the plain
# synthetic model is the BF16 checkpoint's.
SYNTHETIC_QWEN36_NVFP4_EXPERTS = replace(QWEN36_35B_A3B_NVFP4, name="Qwen3.6-35B-A3B NVFP4 (synthetic)",
                                         expert_bytes=1_769_488)
# Text-tower parameters (model-formats §2.7): routed experts + everything else. What the CPU path holds in its
# compute dtype (float32 by default), whatever the checkpoint's storage format.
QWEN36_TEXT_PARAMS = 32_212_254_720 + 2_448_355_968
# What `resolve` needs of nvidia/Qwen3.6-35B-A3B-NVFP4 before a download (geometry: model-formats §1; stored
# dense bytes §3.3): `qwenlocal probe` plans it with the same resolve and memory arithmetic the engine uses.
QWEN36_35B_A3B_NVFP4_INFO = ModelInfo(
    name="Qwen3.6-35B-A3B NVFP4", num_layers=40, num_experts=256, top_k=8, hidden_size=2048, moe_intermediate=512,
    dense_params=2_448_355_968, kv_bytes_per_token=20_480, state_bytes=QWEN36_35B_A3B_NVFP4.state_bytes,
    max_context=262_144, attention_head_dim=256, gdn_head_dims=(128, 128), expert_format="nvfp4",
    quantized_linears=True, stored_dense_bytes=QWEN36_35B_A3B_NVFP4.dense_bytes)


@dataclass(frozen=True)
class KnownModel:
    repo_id: str  # the Hugging Face repo
    aliases: tuple[str, ...]  # lower-case short names accepted by --model and `download`
    expert_format: str  # "bf16" | "nvfp4": how the routed experts are stored
    download_bytes: int  # the whole repo as published (vision tower and MTP included: they share the shards)
    facts: ModelFacts  # what the engine keeps: text tower only
    size_source: str  # where download_bytes comes from
    note: str = ""
    params: int = QWEN36_TEXT_PARAMS  # text tower, for the CPU path's RAM

    @property
    def name(self) -> str:
        return self.repo_id


KNOWN_MODELS: tuple[KnownModel, ...] = (
    KnownModel(
        repo_id="Qwen/Qwen3.6-35B-A3B", aliases=("qwen3.6-35b-a3b", "qwen3.6-35b-a3b-bf16"), expert_format="bf16",
        download_bytes=71_903_645_408, facts=QWEN36_35B_A3B_BF16,
        size_source="model.safetensors.index.json total_size (model-formats §2.7)",
        note="needs 64+ GB of RAM; most machines want the NVFP4 one",
    ),
    KnownModel(
        repo_id="nvidia/Qwen3.6-35B-A3B-NVFP4", aliases=("qwen3.6-35b-a3b-nvfp4",), expert_format="nvfp4",
        download_bytes=23_407_457_492, facts=QWEN36_35B_A3B_NVFP4,
        size_source="byte arithmetic, matches the published 23.4 GB (model-formats §3.4)",
        note="recommended for a 16 GB GPU and 32 GB of RAM",
    ),
    KnownModel(
        repo_id="Qwen/Qwen3.5-35B-A3B", aliases=("qwen3.5-35b-a3b", "qwen3.5-35b-a3b-bf16"), expert_format="bf16",
        download_bytes=71_903_645_408, facts=QWEN35_35B_A3B_BF16,
        size_source="assumed equal to Qwen3.6-35B-A3B (same text config; model-formats §1)",
        note="the previous release, same sizes",
    ),
)

# `synthetic:NAME` models are built by the engine (engine/synthetic.py) with seeded random weights in a real
# geometry, no download. name -> (the facts of the checkpoint it imitates on the GPU, text params); (None, None)
# for the small ones, which need no fit check. The full-size one is sized as the NVFP4 checkpoint (DESIGN.md:
# the bench simulates the 16 GB card with it); on the CPU it holds every weight in the compute dtype.
SYNTHETIC_MODELS: dict[str, tuple[ModelFacts | None, int | None]] = {
    "qwen3.6-35b-a3b": (QWEN36_35B_A3B_BF16, QWEN36_TEXT_PARAMS),
    "qwen3.6-35b-a3b-nvfp4": (SYNTHETIC_QWEN36_NVFP4_EXPERTS, QWEN36_TEXT_PARAMS),
    "tiny": (None, None),
    "odd": (None, None),
    "small": (None, None),
    "tiny-nvfp4": (None, None),
    "small-nvfp4": (None, None),
}


def find_known(name: str) -> KnownModel | None:
    """A registry entry by alias or repo id (case-insensitive), else None."""
    key = name.strip().lower()
    for entry in KNOWN_MODELS:
        if key == entry.repo_id.lower() or key in entry.aliases:
            return entry
    return None


def synthetic_name(ref: str) -> str | None:
    """'synthetic:NAME' -> 'NAME' (lower-case); None for any other reference."""
    if not ref.lower().startswith(SYNTHETIC_PREFIX):
        return None
    return ref[len(SYNTHETIC_PREFIX):].strip().lower()


def synthetic_facts(ref: str) -> ModelFacts | None:
    """The sizes a synthetic model imitates, for the fit check; None when unknown or small."""
    return SYNTHETIC_MODELS.get(synthetic_name(ref) or "", (None, None))[0]


def synthetic_params(ref: str) -> int | None:
    return SYNTHETIC_MODELS.get(synthetic_name(ref) or "", (None, None))[1]


def smaller_alternatives(entry_or_facts: KnownModel | ModelFacts) -> list[KnownModel]:
    """Known checkpoints of the same geometry whose expert bank is smaller (for "what to do" advice)."""
    facts = entry_or_facts.facts if isinstance(entry_or_facts, KnownModel) else entry_or_facts
    same = [e for e in KNOWN_MODELS if e.facts.num_layers == facts.num_layers
            and e.facts.num_experts == facts.num_experts and e.facts.experts_total_bytes < facts.experts_total_bytes]
    return sorted(same, key=lambda e: e.facts.experts_total_bytes)
