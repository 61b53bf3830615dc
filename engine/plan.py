"""The machine plan: hardware profile + model sizes + user options -> what the machine affords, with reasons.

`resolve_plan` is the machine step of `resolve` (engine/resolve.py), which calls it once over the sizes at
the formats it chose and takes from it the VRAM budget, the context, the slot count that fits and the host
bank; its overlap and layer-major rules (`_auto_overlap`, `_auto_layer_major`) are the ones resolve applies.
The engine reads only resolve's EngineConfig. A pure function (no torch, no I/O): the same inputs give the
same Plan, so every policy branch is unit-tested with faked profiles. The arithmetic is engine/memory.py's. Every choice carries a one-line reason that `probe`, `bench` and
the chat's status show. A user option other than "auto" wins, and its reason says "overridden by user" and
what auto would have picked.

Policy, from the seeds (shared/seeds/) and the H200 figures (shared/device/README.md):
- Decode overlap pays only when experts miss (not all resident) and the GPU can copy while it computes.
  shared-side (the shared expert on a side stream, the miss copy right behind its ensure on the compute
  stream) where there is one copy engine or WDDM: there the copy-side split queued the copy behind the
  shared expert's launches and lost half the gain. copy-side (the miss copy on a side stream) otherwise.
  A measured micro-bench result in the profile (`overlap_microbench`) beats both rules.
- Layer-major prefill pays when PCIe is the bottleneck: chunked prefill streams every layer's experts once
  per chunk, layer-major once per prompt. On for prompts longer than one chunk; off when all experts are
  resident or on the CPU.
- Slots: the VRAM budget less dense weights, the KV cache for the planned context, the recurrent state and
  a workspace; at least one layer's experts, or the GPU is too small (a ResourceError with the numbers).
- The expert bank: pin all of it where it fits; under WSL2/Windows' cap (about half of RAM) pin what fits
  and leave the rest pageable; pageable alone when nothing can be pinned.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from .errors import FeatureUnavailableError, OptionError, ResourceError
from .memory import (BORROW_STREAM_MIN_LAYERS, GIB, KV_SHARE, MIB, MIN_AUTO_CONTEXT, VRAM_MARGIN,  # noqa: F401
                     WORKSPACE_BASE, WORKSPACE_PER_CHUNK_TOKEN, ModelFacts, VramBudget, auto_context, auto_vram_budget,
                     GPU_PREFILL_CHUNK, LARGE_CHUNK_SLOT_SHARE, capped_budget, gib as _gib, pow2_floor as _pow2_floor,
                     prefill_chunk_for, slot_fit, workspace_bytes)
from .engine_config import decisions_dict
from .options import EngineOptions

if TYPE_CHECKING:
    from .config import ModelConfig
    from .probe.profile import HardwareProfile

MICROBENCH_MIN_GAIN = 0.01  # a split must beat serial by 1 % in the micro-bench to be chosen
ASSUMED_PAGEABLE_GBPS = 6.0  # H200 measurement; used in reasons only when the profile has none


def _gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB"


# Qwen3.6-35B-A3B as nvidia/Qwen3.6-35B-A3B-NVFP4 stores it (shared/reference/model-formats.md §3.3, §5):
# dense weights as stored (FP8 projections, NVFP4 shared experts and lm_head, BF16 rest), experts in the
# bank layout (FP4 + FP8 block scales + one fp32 global per row), BF16 KV, fp32 GDN state.
QWEN36_35B_A3B_NVFP4 = ModelFacts(
    name="Qwen3.6-35B-A3B NVFP4", num_layers=40, num_experts=256, top_k=8, expert_bytes=1_781_760,
    dense_bytes=2_705_517_300, kv_bytes_per_token=20_480, state_bytes=30 * (32 * 128 * 128 * 4 + 8192 * 3 * 2),
    max_context=262_144,
)


@dataclass(frozen=True)
class Plan:
    device: str  # "cuda" | "cpu"
    vram_budget: int | None  # bytes the engine may use on the GPU
    context_tokens: int  # the KV cache is sized for this many tokens
    slots: int  # GPU expert slots (0 on the CPU)
    all_resident: bool  # every routed expert has a slot: no misses, no transfers
    bank: str  # "pin-all" | "pin-partial" | "pageable" | "resident" | "host"
    pinned_bytes: int
    overlap: str  # "off" | "copy-side" | "shared-side"
    layer_major: bool
    layer_major_min_tokens: int | None  # layer-major for prompts of at least this many uncached tokens
    prefill_chunk: int
    cuda_graphs: bool
    vram: VramBudget | None = None
    reasons: dict = field(default_factory=dict)  # decision name -> one line
    overridden: frozenset = frozenset()  # decision names the user set

    DECISIONS = ("device", "vram_budget", "context_tokens", "slots", "bank", "overlap", "layer_major",
                 "prefill_chunk", "cuda_graphs")

    def reason(self, name: str) -> str:
        return self.reasons[name]

    def display_value(self, name: str) -> str:
        if name == "vram_budget":
            return _gib(self.vram_budget) if self.vram_budget else "-"
        if name == "context_tokens":
            return f"{self.context_tokens:,} tokens"
        if name == "slots":
            return f"{self.slots:,}" + (" (all experts)" if self.all_resident else "")
        if name == "bank":
            return self.bank + (f" ({_gib(self.pinned_bytes)} pinned)" if self.bank == "pin-partial" else "")
        if name == "layer_major":
            return f"on (> {self.layer_major_min_tokens - 1:,} tokens)" if self.layer_major else "off"
        if name == "prefill_chunk":
            return f"{self.prefill_chunk:,} tokens"
        value = getattr(self, name)
        if isinstance(value, bool):
            return "on" if value else "off"
        return str(value)

    def rows(self) -> list[tuple[str, str, str, bool]]:
        """(decision, value, reason, overridden by the user) in a fixed order: for tables and status lines."""
        return [(n, self.display_value(n), self.reasons[n], n in self.overridden) for n in self.DECISIONS]

    def summary(self) -> str:
        if self.device == "cpu":
            return "cpu · no GPU offload"
        lm = f"layer-major >{self.layer_major_min_tokens - 1}" if self.layer_major else "chunked prefill"
        return (f"cuda · {self.slots} slots · overlap {self.overlap} · {lm} · {self.bank} · "
                f"graphs {'on' if self.cuda_graphs else 'off'}")

    def to_dict(self) -> dict[str, Any]:
        return decisions_dict(self)


class _Decisions:
    """Collects value + reason per decision; a user value replaces auto and says so."""

    def __init__(self) -> None:
        self.reasons: dict[str, str] = {}
        self.overridden: set[str] = set()

    def auto(self, name: str, reason: str) -> None:
        self.reasons[name] = reason

    def user(self, name: str, shown: str, auto_value: Any, auto_reason: str, note: str = "") -> None:
        self.overridden.add(name)
        extra = f"; {note}" if note else ""
        self.reasons[name] = f"overridden by user ({shown}){extra}; auto would pick {auto_value}: {auto_reason}"


def resolve_plan(profile: "HardwareProfile", model: ModelFacts, options: EngineOptions | dict | None = None, *,
                 device: str | None = None) -> Plan:
    """Decide what runs. Raises ResourceError (GPU or RAM too small, with numbers and what to do),
    FeatureUnavailableError (device="cuda" without a GPU) or OptionError (a value that cannot apply)."""
    opts = EngineOptions.coerce(options)
    d = _Decisions()
    dev = _device(profile, device, d)
    if opts.max_context is not None and opts.max_context > model.max_context:
        raise OptionError(f"max_context {opts.max_context:,} exceeds {model.name}'s {model.max_context:,} tokens; "
                          f"use at most {model.max_context:,}")

    if dev == "cpu":
        vram, budget, ctx, slots, all_resident = None, None, opts.max_context or model.max_context, 0, False
        d.auto("vram_budget", "no GPU: nothing on VRAM")
        if opts.max_context is not None:
            d.user("context_tokens", f"max_context={ctx}", f"{model.max_context:,}", "the model's maximum")
        else:
            d.auto("context_tokens", "the model's maximum; on the CPU the KV cache lives in host RAM")
        d.auto("slots", "CPU path: experts are read in place from host RAM, no GPU slot cache")
        bank, pinned = _cpu_bank(profile, model, d)
        auto_chunk = prefill_chunk_for(dev, None)
        chunk = opts.prefill_chunk or auto_chunk
    else:
        auto_chunk = prefill_chunk_for(dev, None, lambda c: _slots_at(profile, model, opts, c))
        chunk = opts.prefill_chunk or auto_chunk
        budget, ctx, slots, all_resident, vram = _vram(profile, model, opts, chunk, d)
        bank, pinned = _gpu_bank(profile, model, all_resident, d)
    _chunk_decision(opts, dev, chunk, d, auto_chunk)

    auto_overlap, why = _auto_overlap(profile, dev, all_resident)
    overlap = auto_overlap
    if opts.overlap != "auto":
        overlap = opts.overlap
        note = ""
        if dev == "cpu" and opts.overlap != "off":
            overlap, note = "off", "but the CPU path has no streams, so it runs off"
        elif all_resident and opts.overlap != "off":
            note = "all experts are resident, so there are no misses to hide"
        d.user("overlap", f"overlap={opts.overlap}", auto_overlap, why, note)
    else:
        d.auto("overlap", why)

    auto_lm, why = _auto_layer_major(profile, model, dev, all_resident, chunk)
    layer_major = auto_lm
    if opts.prefill_mode != "auto":
        layer_major = opts.prefill_mode == "layer-major"
        d.user("layer_major", f"prefill_mode={opts.prefill_mode}", "on" if auto_lm else "off", why)
    else:
        d.auto("layer_major", why)
    threshold = chunk + 1 if layer_major else None

    auto_graphs = dev == "cuda"
    why = ("the decode step is captured in one CUDA graph at batch 1 (fewer launches per token)" if auto_graphs
           else "no CUDA device")
    graphs = auto_graphs and opts.cuda_graphs
    if not opts.cuda_graphs:
        d.user("cuda_graphs", "cuda_graphs=false", "on" if auto_graphs else "off", why)
    else:
        d.auto("cuda_graphs", why)

    return Plan(device=dev, vram_budget=budget, context_tokens=ctx, slots=slots, all_resident=all_resident,
                bank=bank, pinned_bytes=pinned, overlap=overlap, layer_major=layer_major,
                layer_major_min_tokens=threshold, prefill_chunk=chunk, cuda_graphs=graphs, vram=vram,
                reasons=dict(d.reasons), overridden=frozenset(d.overridden))


def _chunk_reason(dev: str, chunk: int) -> str:
    if dev != "cuda":
        return f"{chunk:,} tokens per prefill chunk (the CPU path's)"
    if chunk == GPU_PREFILL_CHUNK:
        return (f"{chunk:,} tokens per prefill chunk: fewer, larger batches per expert (TTFT 0.57-0.61x of 2,048's "
                "at 16 GiB on the H200, decode 0.96-0.99x for its workspace)")
    return (f"{chunk:,} tokens per prefill chunk: {GPU_PREFILL_CHUNK:,}-token chunks' workspace would cost context or "
            f"more than {LARGE_CHUNK_SLOT_SHARE:.0%} of the expert slots, or does not fit the budget")


def _slots_at(profile, model: ModelFacts, opts: EngineOptions, chunk: int) -> tuple[int, bool, int] | None:
    """(slots, all resident, context) the budget leaves with this prefill chunk's workspace; None: it cannot
    hold it."""
    try:
        _, ctx, slots, all_resident, _ = _vram(profile, model, opts, chunk, _Decisions())
    except ResourceError:
        return None
    return (model.total_experts if slots is None else slots), all_resident, ctx


def _chunk_decision(opts: EngineOptions, dev: str, chunk: int, d: _Decisions, auto: int) -> None:
    """The reason for the chunk; auto: what the plan takes where none is asked."""
    if opts.prefill_chunk is not None:
        d.user("prefill_chunk", f"prefill_chunk={chunk}", f"{auto:,}", _chunk_reason(dev, auto))
    else:
        d.auto("prefill_chunk", _chunk_reason(dev, chunk))


def _device(profile: "HardwareProfile", device: str | None, d: _Decisions) -> str:
    why_not = profile.cuda_available.note or "no CUDA GPU found"
    if profile.has_cuda:
        gpu = profile.value("gpu_name", "CUDA GPU")
        auto_value, auto_why = "cuda", f"{gpu} (compute capability {profile.value('compute_capability', '?')})"
    else:
        auto_value, auto_why = "cpu", f"{why_not}; the CPU path runs (slowly)"
    if device is None:
        d.auto("device", auto_why)
        return auto_value
    if device not in ("cuda", "cpu"):
        raise OptionError(f"device {device!r} is not 'cuda' or 'cpu'")
    if device == "cuda" and not profile.has_cuda:
        raise FeatureUnavailableError(f"device='cuda' was asked, but {why_not}. Install an NVIDIA driver and a CUDA "
                                      "build of torch, or run with device='cpu' (slow)")
    d.user("device", f"device={device}", auto_value, auto_why)
    return device


def _vram(profile, model: ModelFacts, opts: EngineOptions, chunk: int, d: _Decisions):
    free, total = profile.value("vram_free"), profile.value("vram_total")
    gpu = profile.value("gpu_name", "this GPU")
    auto_budget, auto_why = auto_vram_budget(free, total)
    if opts.vram_budget is not None:
        budget, note = capped_budget(opts.vram_budget, free)
        d.user("vram_budget", f"vram_budget={_gib(opts.vram_budget)}",
               _gib(auto_budget) if auto_budget is not None else "?", auto_why, note)
    elif auto_budget is None:
        raise ResourceError(f"could not read how much VRAM {gpu} has; pass a VRAM budget (vram_budget='14GiB' / "
                            "--vram-budget 14GiB)")
    else:
        budget = auto_budget
        d.auto("vram_budget", auto_why)

    workspace = workspace_bytes(chunk)
    layer = model.layer_bytes
    auto_ctx = auto_context(model, budget, chunk)
    if auto_ctx == model.max_context:
        ctx_why = f"the model's maximum (KV {_gib(auto_ctx * model.kv_bytes_per_token)})"
    else:
        ctx_why = (f"the largest power of two whose KV cache ({_gib(auto_ctx * model.kv_bytes_per_token)}) takes at "
                   f"most 1/{KV_SHARE} of the VRAM left after the dense weights; set max_context to change")
    if opts.max_context is not None:
        ctx = opts.max_context
        d.user("context_tokens", f"max_context={ctx}", f"{auto_ctx:,}", ctx_why)
    else:
        ctx = auto_ctx
        d.auto("context_tokens", ctx_why)
    fit = slot_fit(model, budget, ctx, chunk)
    fixed, kv, stream = fit.fixed, fit.kv, fit.stream
    if not fit.slots_ok:
        need = fixed + kv + stream + layer
        tips = []
        ctx_fit = (budget - fixed - stream - layer) // model.kv_bytes_per_token
        if ctx_fit >= MIN_AUTO_CONTEXT:
            tips.append(f"set max_context to {_pow2_floor(ctx_fit):,} tokens or less")
        if opts.vram_budget is not None and (not free or opts.vram_budget < free):
            tips.append("raise vram_budget")
        if free and total and free < 0.9 * total:
            tips.append(f"close other programs using the GPU ({_gib(total - free)} of {_gib(total)} is in use)")
        tips.append("use a GPU with more memory, or run on the CPU (device='cpu', slow)")
        raise ResourceError(
            f"{gpu} is too small for {model.name} with {ctx:,} tokens of context: it needs {_gib(need)} of VRAM "
            f"(dense weights {_gib(model.dense_bytes)} + KV cache {_gib(kv)} + recurrent state {_gib(model.state_bytes)}"
            f" + workspace {_gib(workspace)} + two prefill stream buffers {_gib(stream)} + one layer of expert "
            f"slots, {model.num_experts} x "
            f"{model.expert_bytes / MIB:.2f} MiB = {_gib(layer)}), but the budget is {_gib(budget)}. "
            f"To run: {'; or '.join(tips)}.")
    all_resident, slots = fit.all_resident, fit.slots
    breakdown = (f"budget {_gib(budget)} - dense {_gib(model.dense_bytes)} - KV {_gib(kv)} - state "
                 f"{_gib(model.state_bytes)} - workspace {_gib(workspace)}"
                 + (f" - prefill stream buffers {_gib(stream)}" if stream else ""))
    if all_resident:
        d.auto("slots", f"all {model.total_experts:,} experts fit ({_gib(model.experts_total_bytes)}; {breakdown}): "
                        "no misses, no transfers")
    else:
        d.auto("slots", f"{slots:,} slots of {model.expert_bytes / MIB:.2f} MiB = "
                        f"{slots / model.total_experts:.0%} of the experts resident ({breakdown})")
    vram = VramBudget(budget=budget, dense=model.dense_bytes, kv=kv, state=model.state_bytes, workspace=workspace,
                      slots=slots * model.expert_bytes, stream=stream)
    return budget, ctx, slots, all_resident, vram


def _ram_check(profile, need: int, what: str) -> None:
    total = profile.value("host_ram_total")
    if total and need > total:
        raise ResourceError(f"{what} needs {_gib(need)} of host RAM, but this machine has {_gib(total)}. Add or "
                            "free RAM (under WSL2, raise memory= in .wslconfig), or use a smaller quantization")


def _cpu_bank(profile, model: ModelFacts, d: _Decisions) -> tuple[str, int]:
    _ram_check(profile, model.experts_total_bytes + model.dense_bytes, f"{model.name} on the CPU")
    d.auto("bank", f"CPU path: all {_gib(model.experts_total_bytes)} of experts stay in host RAM, unpinned")
    return "host", 0


def _gpu_bank(profile, model: ModelFacts, all_resident: bool, d: _Decisions) -> tuple[str, int]:
    bank = model.experts_total_bytes
    if all_resident:
        d.auto("bank", "every expert is resident on the GPU: no host bank, nothing crosses PCIe while decoding")
        return "resident", 0
    _ram_check(profile, bank, f"the expert bank of {model.name}")
    pinnable = profile.value("pinnable_bytes")
    capped = profile.wddm or profile.value("os_name") == "Windows"
    if pinnable is None:
        d.auto("bank", f"host RAM unknown: pin all {_gib(bank)} (the loader falls back to pageable if pinning fails)")
        return "pin-all", bank
    if bank <= pinnable:
        d.auto("bank", f"pin all {_gib(bank)} of experts (about {_gib(pinnable)} can be pinned here)")
        return "pin-all", bank
    pinned_gbps = profile.value("h2d_pinned_gbps")
    pageable_gbps = profile.value("h2d_pageable_gbps", ASSUMED_PAGEABLE_GBPS)
    speed = (f"~{pageable_gbps:.0f} GB/s" + (f" instead of ~{pinned_gbps:.0f} GB/s" if pinned_gbps else ""))
    limit = ("WSL2/Windows cap page-locked memory at about half of RAM" if capped
             else "not enough free RAM to pin all of it")
    n = pinnable // model.expert_bytes
    if n >= model.num_experts:
        pinned = n * model.expert_bytes
        d.auto("bank", f"{limit}: pin {_gib(pinned)} of {_gib(bank)} ({pinned / bank:.0%}), the rest stays pageable "
                       f"(misses there copy at {speed})")
        return "pin-partial", pinned
    d.auto("bank", f"{limit} ({_gib(pinnable)} pinnable): the bank stays pageable, misses copy at {speed}; "
                   "free host RAM to pin it")
    return "pageable", 0


def _auto_overlap(profile, dev: str, all_resident: bool) -> tuple[str, str]:
    if dev == "cpu":
        return "off", "CPU path: no CUDA streams"
    if all_resident:
        return "off", "all experts are resident: no miss copies to hide"
    bench = profile.value("overlap_microbench")
    if isinstance(bench, dict) and any(k in bench for k in ("copy-side", "shared-side")):
        splits = {k: float(v) for k, v in bench.items() if k in ("copy-side", "shared-side")}
        best = min(splits, key=splits.get)
        serial = bench.get("off")
        if serial is None:
            return best, f"micro-bench on this machine: {best} is the faster split ({splits[best]:g} us per layer)"
        gain = 1 - splits[best] / float(serial)
        if gain >= MICROBENCH_MIN_GAIN:
            return best, f"micro-bench on this machine: {best} {splits[best]:g} us vs serial {float(serial):g} us " \
                         f"per layer ({gain:.1%} faster)"
        return "off", f"micro-bench on this machine: no split beats serial by {MICROBENCH_MIN_GAIN:.0%} " \
                      f"(best {best} {splits[best]:g} us vs {float(serial):g} us)"
    engines = profile.value("copy_engines")
    if engines == 0:
        return "off", "the GPU reports no copy engine: a copy cannot run beside compute"
    if profile.h2d_overlaps_compute.known and profile.h2d_overlaps_compute.value is False:
        return "off", f"measured: an H2D copy does not overlap compute here ({profile.h2d_overlaps_compute.note})"
    if engines == 1 or profile.wddm:
        why = ("one copy engine" if engines == 1 else "") + (" and " if engines == 1 and profile.wddm else "")
        why += ("WDDM" + (" (WSL2)" if profile.value("wsl2") else "")) if profile.wddm else ""
        return "shared-side", (f"{why}: the shared expert goes to a side stream and the miss copy stays right behind "
                               "its ensure (copy-side queued the copy behind the shared expert's launches there)")
    if engines is None:
        return "shared-side", ("copy engines unknown: shared-side, which needs no second copy engine "
                               "(the miss copy stays on the compute stream)")
    return "copy-side", (f"{engines} copy engines on a native driver: the miss copy runs on a side stream beside the "
                         "shared expert; every slot write stays on the compute stream")


def _auto_layer_major(profile, model: ModelFacts, dev: str, all_resident: bool, chunk: int) -> tuple[bool, str]:
    if dev == "cpu":
        return False, "CPU path: no PCIe transfers to save"
    if all_resident:
        return False, "all experts are resident: prefill streams nothing"
    bank = model.experts_total_bytes
    layer = model.num_experts * model.expert_bytes
    tokens = 16384
    chunks = -(-tokens // chunk)
    gbps = profile.value("h2d_pinned_gbps")
    timing = ""
    if gbps:
        timing = f" ({chunks * bank / (gbps * 1e9):.1f} s vs {bank / (gbps * 1e9):.1f} s at {gbps:.0f} GB/s)"
    return True, (f"PCIe-bound prefill: chunked streams each layer's {model.num_experts} experts ({_gb(layer)}) once "
                  f"per {chunk:,}-token chunk, layer-major once per prompt; a 16K prompt moves {chunks} x {_gb(bank)} "
                  f"vs {_gb(bank)}{timing}; on for prompts longer than one chunk")
