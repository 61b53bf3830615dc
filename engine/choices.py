"""What an engine is built with, decided once before any weight is read: the machine plan (slots, context),
the expert format (NVFP4 rows or dense), the host bank, the decode overlap split, the context limit."""
from __future__ import annotations

from dataclasses import replace

import torch

from .config import ModelConfig
from .errors import OptionError
from .offload.bank import DENSE, HostExpertBank
from .offload.overlap import CudaStreams, DecodeOverlap
from .options import EngineOptions
from .quant.nvfp4_rows import NVFP4_ROWS, nvfp4_expert_row_bytes
from .quant.scheme import NVFP4


def check_slots(config: ModelConfig, opts: EngineOptions) -> bool:
    """Whether the experts are offloaded (options.expert_slots); a bad slot count fails before any loading."""
    if opts.expert_slots is None:
        return False
    total = config.num_layers * config.moe.num_experts
    if not config.moe.top_k <= opts.expert_slots <= total:
        raise OptionError(f"expert_slots must be between top_k={config.moe.top_k} and the {total} experts of the "
                          f"model, got {opts.expert_slots}; leave it unset to keep every expert resident")
    return True


def offload_bank(config: ModelConfig, opts: EngineOptions, dtype: torch.dtype,
                  device: torch.device, native_nvfp4: bool = False) -> HostExpertBank | None:
    """The host bank when the experts are offloaded, checked before any loading."""
    if not check_slots(config, opts):
        return None
    return HostExpertBank(config, dtype, pin=device.type == "cuda", fmt=NVFP4_ROWS if native_nvfp4 else DENSE)


def native_nvfp4_experts(opts: EngineOptions, experts_format: str, device: torch.device) -> bool:
    """Whether the routed experts stay in NVFP4 bytes (bank, slots, W4A16 kernels) or are dequantized at load."""
    if opts.expert_format == "dense" or (opts.expert_format == "auto" and experts_format != NVFP4):
        return False
    if experts_format != NVFP4:
        raise OptionError(f"expert_format='nvfp4' needs a checkpoint whose routed experts are NVFP4 (e.g. "
                          f"nvidia/Qwen3.6-35B-A3B-NVFP4, or make one with scripts/quantize_nvfp4.py); this "
                          f"checkpoint's experts are {experts_format}")
    if opts.expert_format == "nvfp4":
        return True
    from .model.kernels import _triton_available

    return device.type == "cuda" and _triton_available()


def placement_of(weights: dict[str, torch.Tensor], bank) -> dict:
    def nbytes(ts) -> int:
        return sum(t.numel() * t.element_size() for t in ts)

    experts = [t for n, t in weights.items() if ".mlp.experts." in n]
    dense = [t for n, t in weights.items() if ".mlp.experts." not in n and isinstance(t, torch.Tensor)]
    quantized = sum(w.nbytes for n, w in weights.items() if not isinstance(w, torch.Tensor))
    out = {"dense_weights": nbytes(dense) + quantized, "experts_resident": nbytes(experts)}
    if quantized:
        out["quantized_linears"] = quantized  # (part of dense_weights) FP8/NVFP4 bytes kept native
    if bank is not None:
        out["host_expert_bank"] = bank.bytes
    return out


def apply_plan(opts: EngineOptions, plan) -> EngineOptions:
    """What a GPU engine runs with: the plan's slot count when not every expert fits the VRAM budget (the
    experts then live in the host bank), and its context when none was asked for. User values stay."""
    changes = {}
    if opts.expert_slots is None and not plan.all_resident:
        changes["expert_slots"] = plan.slots
    if opts.max_context is None:
        changes["max_context"] = plan.context_tokens
    return replace(opts, **changes) if changes else opts


_DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "BF16": 2, "F16": 2, "I16": 2, "F32": 4,
                "I32": 4, "F64": 8, "I64": 8}


def stored_dense_bytes(ckpt) -> int:
    """Bytes of the text model's non-expert tensors as the checkpoint stores them (headers only): what the
    device holds when quantized linears stay native."""
    total = 0
    for name, entry in ckpt.entries.items():
        if ".mlp.experts." in f".{name}":
            continue
        n = _DTYPE_BYTES.get(entry.dtype, 2)
        for dim in entry.shape:
            n *= dim
        total += n
    return total


def native_linears(opts: EngineOptions, device: torch.device) -> tuple[bool, bool]:
    """(keep FP8/NVFP4 dense weights in their bytes, run their decode GEMV in Triton)."""
    from .model.kernels import _triton_available

    kernels = device.type == "cuda" and _triton_available()
    if opts.linear_format == "dequantized":
        return False, False
    return (opts.linear_format == "native" or opts.fp8_prefill == "scaled-mm" or kernels), kernels


def fp8_scaled_mm(opts: EngineOptions, device: torch.device) -> bool:
    """FP8 prefill as W8A8 on tensor cores, only when asked. "auto" keeps W8A16: on the H200 W8A8 took 32.2 ms
    per 2,048-token chunk over the model's FP8 projections against W8A16's 21.4 ms (the per-token activation
    quantization runs as torch ops), and its E4M3 activations move prefill's numbers away from the decode
    GEMV's (tiny model: top-1 agreement with W8A16 0.78-0.88); docs/RESULTS.md, session 4."""
    from .kernels.fp8_scaled_mm import fp8_tensor_cores

    if opts.fp8_prefill != "scaled-mm":
        return False
    if not fp8_tensor_cores(device):
        major, minor = torch.cuda.get_device_capability(device)
        raise OptionError(f"fp8_prefill=scaled-mm needs FP8 tensor cores (sm_89 or newer); this GPU is "
                          f"sm_{major}{minor}. Use fp8_prefill=auto (dequantize).")
    return True


def machine_plan(config: ModelConfig, opts: EngineOptions, dtype: torch.dtype, native_nvfp4: bool = False,
                 dense_bytes: int | None = None):
    """The probe's profile of this GPU (cached) and the policy's plan for this model; raises ResourceError
    with the numbers when the model cannot fit, before any weight is read."""
    from .plan import ModelFacts, resolve_plan
    from .probe.cache import get_profile

    facts = ModelFacts.from_config(config, expert_dtype_bytes=torch.finfo(dtype).bits / 8,
                                   dense_dtype_bytes=torch.finfo(dtype).bits / 8)
    if dense_bytes is not None:  # quantized linears kept native: the stored size, not a BF16 estimate
        facts = replace(facts, dense_bytes=dense_bytes)
    if native_nvfp4:  # a slot and a bank row hold the expert's 4-bit bytes
        facts = replace(facts, expert_bytes=nvfp4_expert_row_bytes(config.hidden_size, config.moe.intermediate_size))
    return resolve_plan(get_profile().profile, facts, opts, device="cuda")


def choose_overlap(opts: EngineOptions, device: torch.device, cache, plan=None) -> tuple[DecodeOverlap, str]:
    """The decode overlap split, decided once before any graph capture, with its reason. "auto" takes the
    machine plan's split (its rule: copy-side with several copy engines on a native driver, shared-side on
    one copy engine or WDDM; a measured micro-bench wins over both). Both splits passed the GPU byte-equality
    gate (tests/test_gpu_overlap.py, H200) and measured +2.0 % / +1.4 % decode at 120K (docs/RESULTS.md)."""
    if opts.overlap == "off":
        return DecodeOverlap("off"), "off by option"
    if device.type != "cuda":
        return DecodeOverlap("off"), "CPU decode: one stream, nothing to overlap"
    if cache is None:
        return DecodeOverlap("off"), "experts all resident: no miss copies to hide"
    if opts.overlap == "auto":
        if plan is None or plan.overlap == "off":
            why = plan.reason("overlap") if plan is not None else "no machine plan"
            return DecodeOverlap("off"), f"auto: off ({why})"
        return DecodeOverlap(plan.overlap, CudaStreams(device)), f"auto: {plan.reason('overlap')}"
    return DecodeOverlap(opts.overlap, CudaStreams(device)), f"{opts.overlap} forced by option"


def fused_decode(opts: EngineOptions, device: torch.device) -> bool:
    """Whether the decode step runs the fused Triton kernels: "auto" on a GPU, "fused" refused on the CPU (the
    interpreter would take minutes per token), "reference" never."""
    if opts.decode_kernels == "reference":
        return False
    if device.type != "cuda":
        if opts.decode_kernels == "fused":
            raise OptionError("decode_kernels=fused needs a CUDA GPU with Triton; on the CPU use decode_kernels=auto "
                              "or reference")
        return False
    return True


def context_limit(config: ModelConfig, options: EngineOptions) -> int:
    return min(options.max_context or config.max_position_embeddings, config.max_position_embeddings)
