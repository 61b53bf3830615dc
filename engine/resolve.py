"""resolve: user options + model facts + hardware profile + device (+ software) -> one frozen EngineConfig.

The one place the engine decides what runs. Pure (no torch, no I/O): the same inputs give the same config, so
every branch is tested with faked profiles and software (tests/test_resolve.py). The machine arithmetic
(VRAM budget, context, slots, host bank, the overlap and layer-major rules) is `plan.resolve_plan` over the
sizes at the formats chosen here (engine/memory.py); the rest (formats, kernels, the offload the user asked
for, graphs) is decided below, each decision with its reason. A value that cannot apply raises OptionError
naming the option, before anything is loaded.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .cpu_threads import default_threads, physical_cores
from .engine_config import EngineConfig, Software
from .errors import FeatureUnavailableError, OptionError
from .memory import DTYPE_BYTES, ModelInfo, VramBudget, borrows_stream, gib, prefill_chunk_for, stream_buffer_bytes
from .kernel_rules import attention_choices, kernel_choices, moe_block_choice
from .options import EngineOptions
from .plan import (_auto_layer_major, _auto_overlap, _chunk_decision, _Decisions, _device, _gpu_bank,
                   resolve_plan)

if TYPE_CHECKING:
    from .probe.profile import HardwareProfile

NVFP4 = "nvfp4"


def resolve(options: EngineOptions | dict | None, model: ModelInfo, profile: "HardwareProfile | None",
            device: str | None = None, software: Software | None = None, *, dtype: str | None = None,
            routing: str | None = None, device_asked: bool | None = None, device_why: str = "",
            cpu_cores: int | None = None) -> EngineConfig:
    """Decide everything. profile: the probe's HardwareProfile (needed on a GPU; on the CPU it adds the host
    RAM check). device: "cuda" | "cpu" | None (the profile decides). routing: the described synthetic
    routing trace, if any. cpu_cores: physical cores for the thread default (None: this machine's). Raises OptionError (a value that cannot apply, naming it), ResourceError (too
    little VRAM or RAM, with the numbers) or FeatureUnavailableError (CUDA asked for, none present)."""
    opts = EngineOptions.coerce(options)
    sw = software or Software()
    d = _Decisions()
    dev = _choose_device(profile, device, device_asked, device_why, d)
    dt = _choose_dtype(dtype, dev, d)
    if opts.max_context is not None and opts.max_context > model.max_context:
        raise OptionError(f"max_context {opts.max_context:,} exceeds {model.name}'s {model.max_context:,} tokens; "
                          f"use at most {model.max_context:,}")
    experts = _experts(opts, model, dev, sw, d)
    linears, linear_kernels = _linears(opts, model, dev, dt, sw, d)
    fp8 = _fp8_prefill(opts, model, dev, sw, profile, d)
    facts = model.facts(dt, experts == NVFP4, linears == "native")
    if dev == "cuda" and profile is None:
        raise FeatureUnavailableError("a GPU engine needs the hardware profile (engine/probe) to plan its memory")
    machine = resolve_plan(profile, facts, opts, device=dev) if profile is not None else None
    if machine is not None:  # the plan chose it with the memory (a budget too small for the GPU's takes less)
        chunk = machine.prefill_chunk
        _copy(d, machine, "prefill_chunk", "prefill_chunk")
    else:
        chunk = prefill_chunk_for(dev, opts.prefill_chunk)
        _chunk_decision(opts, dev, chunk, d, prefill_chunk_for(dev, None))

    # Memory: budget, context, slots.
    if dev == "cuda":
        budget = machine.vram_budget
        _copy(d, machine, "vram_budget", "vram_budget")
        context = machine.context_tokens
        _copy(d, machine, "context_tokens", "max_context")
    else:
        budget, context = None, opts.max_context or model.max_context
        if opts.vram_budget is not None:
            d.user("vram_budget", f"vram_budget={gib(opts.vram_budget)}", "-", "no GPU: nothing on VRAM",
                   "the CPU path has no VRAM, so it does not apply")
        else:
            d.auto("vram_budget", "no GPU: nothing on VRAM")
        if opts.max_context is not None:
            d.user("max_context", f"max_context={context}", f"{model.max_context:,}", "the model's maximum")
        else:
            d.auto("max_context", "the model's maximum; on the CPU the KV cache lives in host RAM")
    slots = _slots(opts, model, dev, machine, d)
    bank, pinned = _bank(profile, facts, dev, slots, machine, d)
    stream = _stream_buffers(facts, slots, d)
    vram = None
    if dev == "cuda":
        v = machine.vram
        vram = VramBudget(budget=v.budget, dense=v.dense, kv=v.kv, state=v.state, workspace=v.workspace,
                          slots=(facts.total_experts if slots is None else slots) * facts.expert_bytes,
                          stream=stream_buffer_bytes(facts, slots))

    kernels = kernel_choices(model, dev, dt, opts.decode_kernels, sw, _capability(profile) if dev == "cuda" else None,
                             opts.prefill_kernels, opts.gdn_graphs)
    # The fused step runs the NVFP4 shared expert inside the routed experts' two kernels; apart from them (on
    # its stream beside the miss copy) it costs more launches than the copy it hides.
    shared_in_experts = kernels["decode"][0] in ("fused", "fused-pdl") and experts == "nvfp4" and linears == "native"
    overlap = _overlap(opts, profile, dev, slots, d, shared_in_experts)
    mode, threshold = _prefill_mode(opts, profile, facts, dev, slots, chunk, d)
    _prefill_window(opts, mode, d)
    slot_prefill = _slot_prefill(opts, slots, d)
    for part, (name, why) in kernels.items():
        d.auto(part, why)
    if opts.decode_kernels != "auto":
        d.overridden.add("decode")
        d.reasons["decode"] = f"overridden by user (decode_kernels={opts.decode_kernels}); " + d.reasons["decode"]
    if opts.prefill_kernels != "auto":
        d.overridden.add("prefill_kernels")
        d.reasons["prefill_kernels"] = f"overridden by user (prefill_kernels={opts.prefill_kernels}); " + d.reasons["prefill_kernels"]
    if opts.gdn_graphs != "auto":
        d.overridden.add("gdn")
        d.reasons["gdn"] = f"overridden by user (gdn_graphs={opts.gdn_graphs}); " + d.reasons["gdn"]
    prefill_attention, pairs, blocks = _prefill_kernel_options(opts, kernels, mode, d)
    graphs = _cuda_graphs(opts, dev, kernels, d)
    if routing is None and opts.routing is not None:
        routing = str(opts.routing)  # the engine passes RoutingSpec.describe(); a bare spec is shown as given
    if routing is not None:
        d.user("routing", "routing=" + routing, "the model's router", "the router's top-k picks the experts",
               "synthetic expert ids for benchmarks (the router's weights are kept)")
    else:
        d.auto("routing", "the model's router picks the experts (its top-k)")
    threads = _threads(opts, dev, cpu_cores, d)
    return EngineConfig(
        device=dev, dtype=dt, vram_budget=budget, max_context=context, prefill_chunk=chunk, experts=experts,
        linears=linears, linear_kernels=linear_kernels, fp8_prefill=fp8, slots=slots, bank=bank, bank_pinned=pinned,
        stream_buffers=stream, overlap=overlap, prefill_mode=mode, layer_major_min_tokens=threshold,
        prefill_window=opts.prefill_window, slot_prefill_tokens=slot_prefill, attention=kernels["attention"][0],
        gdn=kernels["gdn"][0], moe=kernels["moe"][0], decode=kernels["decode"][0], cuda_graphs=graphs,
        routing=routing, threads=threads, prefill_kernels=kernels["prefill_kernels"][0], attention_pairs=pairs,
        prefill_attention=prefill_attention, moe_prefill_blocks=blocks, vram=vram, reasons=dict(d.reasons),
        overridden=frozenset(d.overridden))


def _copy(d: _Decisions, machine, name: str, as_name: str) -> None:
    d.reasons[as_name] = machine.reason(name)
    if name in machine.overridden:
        d.overridden.add(as_name)


def _choose_device(profile, device: str | None, asked: bool | None, why: str, d: _Decisions) -> str:
    if device is not None and device not in ("cuda", "cpu"):
        raise OptionError(f"device {device!r} is not 'cuda' or 'cpu'")
    if profile is not None and (device is None or asked is None):
        return _device(profile, device, d)
    if device is None:
        raise OptionError("resolve needs a device or a hardware profile to choose one")
    if device == "cuda" and profile is not None and not profile.has_cuda:
        _device(profile, device, d)  # raises FeatureUnavailableError with what to do
    if profile is not None and device == "cuda":
        why = why or f"{profile.value('gpu_name', 'CUDA GPU')} (compute capability " \
                     f"{profile.value('compute_capability', '?')})"
    why = why or ("a CUDA GPU" if device == "cuda" else "no CUDA GPU visible: the CPU path runs (slowly)")
    if asked:
        d.overridden.add("device")
        d.reasons["device"] = f"overridden by user (device={device}); {why}"
    else:
        d.auto("device", why)
    return device


def _choose_dtype(dtype: str | None, dev: str, d: _Decisions) -> str:
    auto = "bfloat16" if dev == "cuda" else "float32"
    why = ("bfloat16 on a GPU: the checkpoint's precision, tensor cores" if dev == "cuda" else
           "float32 on the CPU: the reference path (matches transformers to 1e-4)")
    if dtype is None:
        d.auto("dtype", why)
        return auto
    if dtype not in DTYPE_BYTES:
        raise OptionError(f"dtype must be float32, bfloat16 or float16, got {dtype}")
    if dtype == auto:
        d.auto("dtype", why)
    else:
        d.user("dtype", f"dtype={dtype}", auto, why)
    return dtype


def _experts(opts: EngineOptions, model: ModelInfo, dev: str, sw: Software, d: _Decisions) -> str:
    stored = model.expert_format
    if stored != NVFP4 and opts.expert_format == "nvfp4":
        raise OptionError(f"expert_format='nvfp4' needs a checkpoint whose routed experts are NVFP4 (e.g. "
                          f"nvidia/Qwen3.6-35B-A3B-NVFP4, or make one with scripts/quantize_nvfp4.py); this "
                          f"checkpoint's experts are {stored}")
    if stored != NVFP4:
        auto, why = "dense", f"the checkpoint's experts are {stored}: compute-dtype rows"
    elif dev == "cuda" and sw.triton:
        auto, why = NVFP4, "the checkpoint's 4-bit bytes in bank and slots, dequantized in the kernels (W4A16)"
    else:
        auto, why = "dense", ("NVFP4 experts dequantized at load: the W4A16 kernels need a GPU with Triton"
                              if dev == "cuda" else "CPU: NVFP4 experts dequantized at load (the reference path)")
    if opts.expert_format == "auto":
        d.auto("experts", why)
        return auto
    value = opts.expert_format
    d.user("experts", f"expert_format={value}", auto, why)
    return value


def _linears(opts: EngineOptions, model: ModelInfo, dev: str, dt: str, sw: Software,
             d: _Decisions) -> tuple[str, bool]:
    kernels = dev == "cuda" and sw.triton
    if not model.quantized_linears:
        why = "no FP8/NVFP4 linears in the checkpoint: compute-dtype weights"
        if opts.linear_format != "auto":
            d.user("linears", f"linear_format={opts.linear_format}", "dense", why, "nothing to keep or expand")
        else:
            d.auto("linears", why)
        return "dense", kernels
    native_why = ("the checkpoint's FP8/NVFP4 bytes on the device; W8A16/W4A16 GEMV in decode"
                  + (" (Triton)" if kernels else " (torch, dequantized per call)"))
    auto = "native" if kernels else "dequantized"
    auto_why = native_why if kernels else f"FP8/NVFP4 weights expanded to {dt} at load (the reference path)"
    if opts.linear_format == "dequantized":
        d.user("linears", "linear_format=dequantized", auto, auto_why,
               f"FP8/NVFP4 weights expanded to {dt} at load")
        return "dequantized", kernels
    if opts.linear_format == "native":
        d.user("linears", "linear_format=native", auto, auto_why, native_why)
        return "native", kernels
    if opts.fp8_prefill == "scaled-mm" and auto != "native":
        d.user("linears", "fp8_prefill=scaled-mm", auto, auto_why,
               "kept native: the W8A8 prefill multiplies the stored FP8 bytes; " + native_why)
        return "native", kernels
    d.auto("linears", auto_why)
    return auto, kernels


def _fp8_prefill(opts: EngineOptions, model: ModelInfo, dev: str, sw: Software, profile, d: _Decisions) -> str:
    why = ("W8A16: the FP8 weight dequantized per chunk with BF16 activations, the decode GEMV's numbers (W8A8 "
           "took 32.2 ms against 21.4 ms per 2,048-token chunk on the H200 and moves prefill's numbers; "
           "docs/RESULTS.md, session 4)")
    if not model.quantized_linears:
        why += "; this checkpoint has no FP8 linears"
    if opts.fp8_prefill != "scaled-mm":
        d.auto("fp8_prefill", why)
        return "dequantize"
    if dev == "cuda" and not sw.fp8_tensor_cores:
        cc = str(profile.value("compute_capability", "?") if profile is not None else "?").replace(".", "")
        raise OptionError(f"fp8_prefill=scaled-mm needs FP8 tensor cores (sm_89 or newer); this GPU is sm_{cc}. "
                          "Use fp8_prefill=auto (dequantize).")
    d.user("fp8_prefill", "fp8_prefill=scaled-mm", "dequantize", why,
           "W8A8 on FP8 tensor cores, activations quantized per token")
    return "scaled-mm"


def _slots(opts: EngineOptions, model: ModelInfo, dev: str, machine, d: _Decisions) -> int | None:
    total = model.total_experts
    if dev == "cuda":
        auto = None if machine.all_resident else machine.slots
        auto_shown, why = (machine.display_value("slots"), machine.reason("slots"))
    else:
        auto, auto_shown = None, "all experts resident"
        why = "CPU path: every expert stays with the weights in host RAM (expert_slots offloads them)"
    if opts.expert_slots is None:
        d.auto("slots", why)
        return auto
    n = opts.expert_slots
    if not model.top_k <= n <= total:
        raise OptionError(f"expert_slots must be between top_k={model.top_k} and the {total} experts of the "
                          f"model, got {n}; leave it unset to keep every expert resident")
    d.user("slots", f"expert_slots={n}", auto_shown, why, "the experts are offloaded to a slot cache of that size")
    return n


def _bank(profile, facts, dev: str, slots: int | None, machine, d: _Decisions) -> tuple[str, bool]:
    if slots is None:
        d.auto("bank", "every expert is resident on the GPU: no host bank, nothing crosses PCIe while decoding"
               if dev == "cuda" else "CPU path: the experts stay with the weights in host RAM, no bank")
        return "resident", False
    if dev == "cpu":
        d.auto("bank", "offloaded on the CPU: the bank is pageable host RAM and the slots are host tensors")
        return "host", False
    if machine.bank != "resident":
        strategy, why = machine.bank, machine.reason("bank")
    else:  # the user offloads experts that would all fit: the bank rule applies as for any offload
        scratch = _Decisions()
        strategy, _ = _gpu_bank(profile, facts, False, scratch)
        why = scratch.reasons["bank"]
    if strategy != "pin-all":
        why += "; the loader pins the whole bank today (a partly pinned bank is not built yet)"
    d.auto("bank", why)
    return strategy, True


def _stream_buffers(facts, slots: int | None, d: _Decisions) -> str:
    if slots is None:
        d.auto("stream_buffers", "experts resident: prefill streams nothing")
        return "none"
    if borrows_stream(facts.num_experts, slots):
        d.auto("stream_buffers", f"{slots:,} slots hold three or more layers of experts: prefill lends the trailing "
                                 f"2 x {facts.num_experts} slots as its two stream buffers and refills them after")
        return "borrowed"
    d.auto("stream_buffers", f"fewer than three layers of slots: two dedicated one-layer buffers "
                             f"({gib(2 * facts.layer_bytes)}) for prefill's bank streaming")
    return "dedicated"


# Measured on the H200 (docs/RESULTS.md, 2026-12-01, 16 GiB budget, calibrated-28, fused decode step):
FUSED_OVERLAP_WHY = ("the fused decode step runs the shared expert inside the routed experts' kernels; split off "
                     "beside the miss copy it measured slower: 160.5 tok/s serial vs 147.4 copy-side / 150.6 "
                     "shared-side at 16K, 129.7 vs 123.9 / 120.0 at 120K (H200, 16 GiB)")


def _overlap(opts: EngineOptions, profile, dev: str, slots: int | None, d: _Decisions,
             shared_in_experts: bool = False) -> str:
    if dev == "cpu":
        auto, why = "off", "CPU decode: one stream, nothing to overlap"
    elif slots is None:
        auto, why = "off", "experts all resident: no miss copies to hide"
    elif shared_in_experts:
        auto, why = "off", FUSED_OVERLAP_WHY
    else:
        auto, why = _auto_overlap(profile, "cuda", False)
    if opts.overlap == "auto":
        d.auto("overlap", why)
        return auto
    if opts.overlap == "off" or auto == "off" and (dev == "cpu" or slots is None):
        note = "" if opts.overlap == "off" else f"but {why}, so it runs off"
        d.user("overlap", f"overlap={opts.overlap}", auto, why, note)
        return "off"
    d.user("overlap", f"overlap={opts.overlap}", auto, why)
    return opts.overlap


def _prefill_mode(opts: EngineOptions, profile, facts, dev: str, slots: int | None, chunk: int,
                  d: _Decisions) -> tuple[str, int | None]:
    if slots is None:
        auto, why = False, ("all experts are resident: prefill streams nothing" if dev == "cuda"
                            else "CPU path, experts resident: nothing to stream")
    elif dev == "cuda":
        auto, why = _auto_layer_major(profile, facts, "cuda", False, chunk)
    else:
        auto, why = True, ("offloaded experts (expert_slots): chunked prefill copies each layer's bank once per "
                           "chunk, layer-major once per prompt; on for prompts longer than one chunk")
    if opts.prefill_mode == "auto":
        d.auto("prefill_mode", why)
        layer_major = auto
    else:
        layer_major = opts.prefill_mode == "layer-major"
        d.user("prefill_mode", f"prefill_mode={opts.prefill_mode}", "layer-major" if auto else "chunked", why)
    return ("layer-major", chunk + 1) if layer_major else ("chunked", None)


def _prefill_window(opts: EngineOptions, mode: str, d: _Decisions) -> None:
    applies = "" if mode == "layer-major" else "; it applies to layer-major prefill only, and this engine prefills chunked"
    if opts.prefill_window is None:
        d.auto("prefill_window", "layer-major parks the whole prompt's activations at once" + applies)
    else:
        d.user("prefill_window", f"prefill_window={opts.prefill_window}", "whole prompt",
               "layer-major parks the whole prompt's activations at once",
               f"activations of {opts.prefill_window:,} tokens parked at a time" + applies)


def _slot_prefill(opts: EngineOptions, slots: int | None, d: _Decisions) -> int:
    default = EngineOptions().slot_prefill_tokens
    n = opts.slot_prefill_tokens
    if slots is None:
        why = "experts resident: no slot cache to prefill through"
        if n != default:
            d.user("slot_prefill_tokens", f"slot_prefill_tokens={n}", 0, why, "it does not apply")
        else:
            d.auto("slot_prefill_tokens", why)
        return 0
    why = (f"a prompt of at most {default} new tokens prefills through the slot cache (only its missing experts "
           "cross PCIe) instead of streaming every layer's bank")
    if n != default:
        d.user("slot_prefill_tokens", f"slot_prefill_tokens={n}", default, why,
               "0: every prefill streams the banks" if n == 0 else "")
    else:
        d.auto("slot_prefill_tokens", why)
    return n


def _prefill_kernel_options(opts: EngineOptions, kernels: dict, mode: str, d: _Decisions) -> tuple[str, bool, str]:
    """How FlashInfer's prefill reads the KV cache, whether layer-major pairs its chunks, and the grouped MoE
    kernels' row blocks (kernel_rules)."""
    out = []
    rules = attention_choices(kernels["attention"][0], mode, opts.prefill_attention, opts.attention_pairs)
    rules["moe_prefill_blocks"] = moe_block_choice(kernels["moe"][0], opts.moe_prefill_blocks)
    for name, (value, auto, why, note) in rules.items():
        asked = getattr(opts, name)
        if asked != "auto":
            d.user(name, f"{name}={asked}", auto, why, note)
        else:
            d.auto(name, why)
        out.append(value)
    return out[0], out[1], out[2]


def _capability(profile) -> tuple[int, int] | None:
    """The GPU's compute capability from the hardware profile ("9.0" -> (9, 0)); None where not probed."""
    value = profile.value("compute_capability", None) if profile is not None else None
    try:
        major, minor = str(value).split(".")
        return int(major), int(minor)
    except (TypeError, ValueError):
        return None


def _cuda_graphs(opts: EngineOptions, dev: str, kernels: dict, d: _Decisions) -> bool:
    safe = kernels["attention"][0] == "flashinfer" and kernels["moe"][0] == "triton"
    if dev != "cuda":
        why, auto = "no CUDA device", False
    elif not safe:
        why, auto = (f"needs FlashInfer attention and the Triton MoE kernels (here {kernels['attention'][0]} and "
                     f"{kernels['moe'][0]}, which sync or change shape)"), False
    else:
        why, auto = "the decode step is captured in one CUDA graph at batch 1 (fewer launches per token)", True
    if not opts.cuda_graphs:
        d.user("cuda_graphs", "cuda_graphs=false", "on" if auto else "off", why)
        return False
    d.auto("cuda_graphs", why)
    return auto


def _threads(opts: EngineOptions, dev: str, cpu_cores: int | None, d: _Decisions) -> int | None:
    if dev != "cpu":
        why = "the GPU computes; torch's CPU threads are left as they are"
        if opts.threads is not None:
            d.user("threads", f"threads={opts.threads}", "torch's default", why, "it applies to the CPU path only")
        else:
            d.auto("threads", why)
        return None
    auto, why = default_threads(cpu_cores if cpu_cores is not None else physical_cores())
    if opts.threads is not None:
        d.user("threads", f"threads={opts.threads}", auto, why)
        return opts.threads
    d.auto("threads", why)
    return auto


def describe_options(opts: EngineOptions) -> dict[str, Any]:
    """The options as plain data (logs, bench JSON)."""
    return {k: getattr(opts, k) for k in opts.__dataclass_fields__ if k != "routing"}
