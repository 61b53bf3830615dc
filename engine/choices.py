"""The torch side of the engine configuration: what `resolve` needs to know of this process (which kernel
packages import, FP8 tensor cores, the probe's profile) and the objects built from an EngineConfig (the host
bank, the decode overlap). Nothing here decides: every choice is in engine/resolve.py."""
from __future__ import annotations

import torch

from .config import ModelConfig
from .engine_config import EngineConfig, Software
from .offload.bank import DENSE, HostExpertBank
from .offload.overlap import CudaStreams, DecodeOverlap
from .quant.nvfp4_rows import NVFP4_ROWS

DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
TORCH_DTYPES = {v: k for k, v in DTYPE_NAMES.items()}


def detect_software(device: torch.device) -> Software:
    """Which optional kernel packages import here (an install that fails at import counts as absent)."""
    from .kernels.fp8_scaled_mm import fp8_tensor_cores
    from .kernels.gdn_fla import fla_available
    from .model.attention_backends import flashinfer_available
    from .model.kernels import _triton_available

    gpu = device.type == "cuda"
    return Software(triton=_triton_available(), flashinfer=gpu and flashinfer_available(), fla=gpu and fla_available(),
                    fp8_tensor_cores=fp8_tensor_cores(device))


def hardware_profile(device: torch.device):
    """The probe's profile of this GPU (measured once, cached); None on the CPU (no probe: nothing to plan)."""
    if device.type != "cuda":
        return None
    from .probe.cache import get_profile

    return get_profile().profile


def offload_bank(config: EngineConfig, model_cfg: ModelConfig, dtype: torch.dtype) -> HostExpertBank | None:
    """The host bank the config asks for (None with every expert resident)."""
    if not config.offloaded:
        return None
    return HostExpertBank(model_cfg, dtype, pin=config.bank_pinned, fmt=NVFP4_ROWS if config.experts == "nvfp4" else DENSE)


def build_overlap(config: EngineConfig, device: torch.device) -> DecodeOverlap:
    """The decode overlap split the config names, with its named streams on a GPU."""
    if config.overlap == "off":
        return DecodeOverlap("off")
    return DecodeOverlap(config.overlap, CudaStreams(device))


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
