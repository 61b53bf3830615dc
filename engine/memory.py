"""The memory arithmetic, in one place: bytes of weights, expert slots, KV cache, recurrent state and
workspaces against a VRAM budget, and the host RAM a model needs. No torch, no I/O.

Used by the plan (engine/plan.py, engine/resolve.py), by `qwenlocal download`'s fit check (app/fit.py) and by
`qwenlocal probe`, so the three cannot disagree on what fits. The sizes of a model come as `ModelFacts` (as
one format stores them) or from `ModelInfo` (geometry + storage formats) at the formats the engine resolved.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .config import ModelConfig

GIB = 2**30
MIB = 2**20
VRAM_MARGIN = 256 * MIB  # kept free when the budget comes from free VRAM (allocator slack, other processes)
WORKSPACE_BASE = 768 * MIB  # activations, CUDA graphs, kernel workspaces (an estimate, not a measurement)
WORKSPACE_PER_CHUNK_TOKEN = 128 * 1024  # prefill activations grow with the chunk
# The prefill chunk where none is asked. On a GPU 8,192 tokens: against 2,048 at a 16 GiB budget on the H200, TTFT
# 0.61x at 16K and 0.57x at 120K (bigger batches per expert, a quarter of the per-chunk calls), decode 0.96-0.99x
# (its workspace is 455 expert slots fewer); docs/RESULTS.md session 11, call 3. A budget that cannot hold that
# workspace, or that would lose context or more than LARGE_CHUNK_SLOT_SHARE of its slots to it (an 8 GB card: half
# its context), gets SMALL_PREFILL_CHUNK. The CPU path keeps 2,048 (not measured there).
GPU_PREFILL_CHUNK = 8192
SMALL_PREFILL_CHUNK = 2048
LARGE_CHUNK_SLOT_SHARE = 0.10  # a 16 GiB budget: 7.6 % (6,019 -> 5,564 slots), decode 0.96-0.99x measured
# With at least this many layers' worth of expert slots, prefill's two stream buffers borrow slots (lent for
# the prefill, refilled after) instead of taking VRAM of their own (offload/cache.py).
BORROW_STREAM_MIN_LAYERS = 3
KV_SHARE = 3  # auto context: the KV cache takes at most 1/KV_SHARE of the VRAM left after dense + workspace
MIN_AUTO_CONTEXT = 4096
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def pow2_floor(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def nvfp4_row_bytes(hidden: int, inter: int) -> int:
    """One routed expert as the engine's NVFP4 row (quant/nvfp4_rows.py, the same formula; a test holds them
    equal): packed FP4 gate_up and down, their FP8 block scales (one per 16), three fp32 global scales."""
    return 2 * inter * hidden // 2 + 2 * inter * hidden // 16 + hidden * inter // 2 + hidden * inter // 16 + 12


def nvfp4_row_stride(hidden: int, inter: int) -> int:
    """What one such row takes in the engine's bank and slots: rounded up to 16 bytes (quant/nvfp4_rows.py
    nvfp4_expert_row_stride; a test holds them equal)."""
    return -(-nvfp4_row_bytes(hidden, inter) // 16) * 16


@dataclass(frozen=True)
class ModelFacts:
    """What the memory arithmetic needs to know about a model: sizes only."""

    name: str
    num_layers: int
    num_experts: int  # routed experts per layer
    top_k: int
    expert_bytes: int  # one routed expert as the bank stores it
    dense_bytes: int  # everything that is not a routed expert (lives on the GPU)
    kv_bytes_per_token: int  # all full-attention layers, K and V
    state_bytes: int  # recurrent (GatedDeltaNet) state + conv state of one sequence
    max_context: int

    @property
    def experts_total_bytes(self) -> int:
        return self.num_layers * self.num_experts * self.expert_bytes

    @property
    def total_experts(self) -> int:
        return self.num_layers * self.num_experts

    @property
    def layer_bytes(self) -> int:
        """One layer's routed experts: one prefill stream buffer, the smallest useful slot cache."""
        return self.num_experts * self.expert_bytes

    @classmethod
    def from_config(cls, cfg: "ModelConfig", *, expert_dtype_bytes: float = 2.0, block_scale_group: int | None = None,
                    dense_dtype_bytes: float = 2.0, dense_bytes: int | None = None, kv_dtype_bytes: int = 2,
                    state_dtype_bytes: int = 4, conv_dtype_bytes: int = 2, name: str = "model") -> "ModelFacts":
        """Sizes from a ModelConfig. expert_dtype_bytes: 2 for BF16, 1 for FP8, 0.5 for FP4. block_scale_group:
        with FP4, one FP8 scale per this many weights plus one fp32 global per output row (the bank layout;
        16 reproduces the seeds' 1,781,760 B NVFP4 expert). dense_bytes: pass the real figure for mixed-precision
        checkpoints; otherwise every dense weight is counted at dense_dtype_bytes (exact for BF16)."""
        h, moe, att, lin = cfg.hidden_size, cfg.moe, cfg.attention, cfg.linear
        i = moe.intermediate_size
        weights = 3 * h * i
        expert = weights * expert_dtype_bytes
        if block_scale_group:
            expert += weights // block_scale_group + (2 * i + h) * 4
        n_full, n_lin = len(cfg.full_attention_layers), len(cfg.linear_attention_layers)
        if dense_bytes is None:
            dense_bytes = int(dense_params(cfg) * dense_dtype_bytes)
        kv = n_full * 2 * att.num_kv_heads * att.head_dim * kv_dtype_bytes
        state = n_lin * (lin.num_value_heads * lin.key_head_dim * lin.value_head_dim * state_dtype_bytes
                         + lin.conv_dim * (lin.conv_kernel - 1) * conv_dtype_bytes)
        return cls(name=name, num_layers=cfg.num_layers, num_experts=moe.num_experts, top_k=moe.top_k,
                   expert_bytes=int(expert), dense_bytes=int(dense_bytes), kv_bytes_per_token=kv, state_bytes=state,
                   max_context=cfg.max_position_embeddings)


def dense_params(cfg: "ModelConfig") -> int:
    """Parameters of everything that is not a routed expert (embedding, LM head, norms, attention, GDN, router,
    shared expert)."""
    h, moe, att, lin = cfg.hidden_size, cfg.moe, cfg.attention, cfg.linear
    n_full, n_lin = len(cfg.full_attention_layers), len(cfg.linear_attention_layers)
    params = cfg.vocab_size * h * (1 if cfg.tie_word_embeddings else 2) + h  # embed, lm_head, final norm
    params += cfg.num_layers * (2 * h + moe.num_experts * h + 3 * h * moe.shared_intermediate_size + h)
    q_out, kv_out = att.num_heads * att.head_dim, att.num_kv_heads * att.head_dim
    params += n_full * (h * 2 * q_out + 2 * h * kv_out + q_out * h + 2 * att.head_dim)
    nv = lin.num_value_heads
    params += n_lin * (h * lin.conv_dim + h * lin.value_dim + 2 * h * nv + lin.conv_dim * lin.conv_kernel
                       + 2 * nv + lin.value_head_dim + lin.value_dim * h)
    return params


@dataclass(frozen=True)
class ModelInfo:
    """What `resolve` knows of a model before any weight is read: its geometry and how it is stored."""

    name: str
    num_layers: int
    num_experts: int
    top_k: int
    hidden_size: int
    moe_intermediate: int
    dense_params: int  # parameters outside the routed experts
    kv_bytes_per_token: int  # BF16 K and V of every full-attention layer
    state_bytes: int  # GDN + conv state of one sequence
    max_context: int
    attention_head_dim: int
    gdn_head_dims: tuple[int, int]  # (key, value) head dims of the GatedDeltaNet layers
    expert_format: str = "bf16"  # the routed experts as stored: "bf16" | "nvfp4" | "fp8"
    quantized_linears: bool = False  # FP8/NVFP4 dense linears in the checkpoint
    stored_dense_bytes: int | None = None  # the dense tensors' bytes as stored (native linears keep these)

    @property
    def expert_params(self) -> int:
        return 3 * self.hidden_size * self.moe_intermediate

    @property
    def total_experts(self) -> int:
        return self.num_layers * self.num_experts

    @property
    def params(self) -> int:
        return self.total_experts * self.expert_params + self.dense_params

    @classmethod
    def from_config(cls, cfg: "ModelConfig", name: str = "model", *, expert_format: str = "bf16",
                    quantized_linears: bool = False, stored_dense_bytes: int | None = None) -> "ModelInfo":
        sizes = ModelFacts.from_config(cfg)
        lin = cfg.linear
        return cls(name=name, num_layers=cfg.num_layers, num_experts=cfg.moe.num_experts, top_k=cfg.moe.top_k,
                   hidden_size=cfg.hidden_size, moe_intermediate=cfg.moe.intermediate_size,
                   dense_params=dense_params(cfg), kv_bytes_per_token=sizes.kv_bytes_per_token,
                   state_bytes=sizes.state_bytes, max_context=cfg.max_position_embeddings,
                   attention_head_dim=cfg.attention.head_dim, gdn_head_dims=(lin.key_head_dim, lin.value_head_dim),
                   expert_format=expert_format, quantized_linears=quantized_linears,
                   stored_dense_bytes=stored_dense_bytes)

    def facts(self, dtype: str, native_experts: bool, native_linears: bool) -> ModelFacts:
        """The sizes the engine holds at these formats: NVFP4 rows or compute-dtype experts; the stored dense
        bytes (native FP8/NVFP4 linears) or every dense weight at the compute dtype."""
        width = DTYPE_BYTES[dtype]
        expert = (nvfp4_row_stride(self.hidden_size, self.moe_intermediate) if native_experts
                  else self.expert_params * width)
        dense = (self.stored_dense_bytes if native_linears and self.stored_dense_bytes is not None
                 else self.dense_params * width)
        return ModelFacts(name=self.name, num_layers=self.num_layers, num_experts=self.num_experts, top_k=self.top_k,
                          expert_bytes=expert, dense_bytes=dense, kv_bytes_per_token=self.kv_bytes_per_token,
                          state_bytes=self.state_bytes, max_context=self.max_context)


@dataclass(frozen=True)
class VramBudget:
    budget: int
    dense: int
    kv: int
    state: int
    workspace: int
    slots: int  # bytes of expert slots
    stream: int = 0  # the two whole-layer prefill stream buffers (offloaded experts only)

    @property
    def fixed(self) -> int:
        return self.dense + self.kv + self.state + self.workspace + self.stream


def auto_vram_budget(free: int | None, total: int | None) -> tuple[int | None, str]:
    """The budget when none is asked: free VRAM less a margin, else 90% of the card, else unknown."""
    if free:
        return max(0, free - VRAM_MARGIN), f"free VRAM {gib(free)} less a {VRAM_MARGIN // MIB} MiB margin"
    if total:
        return int(total * 0.9), f"90% of {gib(total)} (free VRAM was not read)"
    return None, "the GPU's memory size is unknown"


def capped_budget(asked: int, free: int | None) -> tuple[int, str]:
    """A user's budget, capped by what is free (less the margin)."""
    if free and asked > free:
        budget = max(0, free - VRAM_MARGIN)
        return budget, f"only {gib(free)} is free, so {gib(budget)} is used"
    return asked, ""


def prefill_chunk_for(device: str, asked: int | None, slots_at=None) -> int:
    """The prefill chunk: the one asked; on a GPU, GPU_PREFILL_CHUNK where its larger workspace leaves the
    context SMALL_PREFILL_CHUNK gets and costs at most LARGE_CHUNK_SLOT_SHARE of its expert slots (or every expert
    stays resident), else SMALL_PREFILL_CHUNK. slots_at(chunk) -> (slots, all_resident, context), or None where
    the budget cannot hold that chunk's minimum; slots_at None: the GPU's chunk."""
    if asked is not None:
        return asked
    if device != "cuda":
        return SMALL_PREFILL_CHUNK
    if slots_at is None:
        return GPU_PREFILL_CHUNK
    large, small = slots_at(GPU_PREFILL_CHUNK), slots_at(SMALL_PREFILL_CHUNK)
    if large is None:
        return SMALL_PREFILL_CHUNK
    if small is None or (large[2] >= small[2] and (large[1] or large[0] >= (1 - LARGE_CHUNK_SLOT_SHARE) * small[0])):
        return GPU_PREFILL_CHUNK
    return SMALL_PREFILL_CHUNK


def workspace_bytes(chunk: int) -> int:
    return WORKSPACE_BASE + chunk * WORKSPACE_PER_CHUNK_TOKEN


def auto_context(facts: ModelFacts, budget: int, chunk: int) -> int:
    """The largest power of two whose KV cache takes at most 1/KV_SHARE of what the dense weights, state and
    workspace leave (at least MIN_AUTO_CONTEXT, at most the model's maximum)."""
    fixed = facts.dense_bytes + facts.state_bytes + workspace_bytes(chunk)
    share = max(0, budget - fixed) // KV_SHARE
    return min(facts.max_context, max(MIN_AUTO_CONTEXT, pow2_floor(share // facts.kv_bytes_per_token)))


def borrows_stream(num_experts: int, slots: int) -> bool:
    """Whether prefill's two stream buffers borrow slots (enough of them) or need VRAM of their own."""
    return slots >= BORROW_STREAM_MIN_LAYERS * num_experts


def stream_buffer_bytes(facts: ModelFacts, slots: int | None) -> int:
    """VRAM of prefill's two whole-layer stream buffers for this slot count (None: resident, none)."""
    if slots is None or borrows_stream(facts.num_experts, slots):
        return 0
    return 2 * facts.layer_bytes


@dataclass(frozen=True)
class SlotFit:
    slots: int  # expert slots that fit (all of them when all_resident)
    all_resident: bool
    stream: int  # bytes of dedicated stream buffers reserved
    fixed: int  # dense + state + workspace (no KV, no stream)
    kv: int
    slots_ok: bool  # at least one layer of slots fits: the model can run


def slot_fit(facts: ModelFacts, budget: int, context: int, chunk: int) -> SlotFit:
    """How many expert slots fit the budget after dense weights, state, workspace and the KV cache for
    `context` tokens; with few slots, prefill's two stream buffers come out of the budget first."""
    fixed = facts.dense_bytes + facts.state_bytes + workspace_bytes(chunk)
    kv = context * facts.kv_bytes_per_token
    room = budget - fixed - kv
    fit_all = max(0, room) // facts.expert_bytes
    stream = 0
    if fit_all < facts.total_experts and fit_all < BORROW_STREAM_MIN_LAYERS * facts.num_experts:
        stream = 2 * facts.layer_bytes
        room -= stream
    fit = max(0, room) // facts.expert_bytes
    all_resident = fit >= facts.total_experts
    slots = facts.total_experts if all_resident else int(fit)
    return SlotFit(slots=slots, all_resident=all_resident, stream=stream, fixed=fixed, kv=kv,
                   slots_ok=fit >= facts.num_experts)


def vram_minimum(facts: ModelFacts, chunk: int, context: int) -> dict[str, int]:
    """What must be on the GPU for `context` tokens with one layer of expert slots (the plan's minimum: below
    it, resolve raises ResourceError). With experts offloaded, prefill streams whole layers through two device
    buffers."""
    stream = 2 * facts.layer_bytes if facts.total_experts > facts.num_experts else 0
    return {"dense": facts.dense_bytes, "state": facts.state_bytes, "workspace": workspace_bytes(chunk),
            "kv": context * facts.kv_bytes_per_token, "prefill stream buffers": stream,
            "one layer of slots": facts.layer_bytes}


def cpu_ram_bytes(facts: ModelFacts) -> int:
    """The CPU path holds every weight in host RAM at the sizes `facts` gives (the compute dtype there)."""
    return facts.experts_total_bytes + facts.dense_bytes

