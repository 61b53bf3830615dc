"""Which format each linear weight of a checkpoint is stored in, from its quantization config.

Reads ModelOpt's `quantization_config` (config.json) / hf_quant_config.json: `quant_algo` MIXED_PRECISION with a
`quantized_layers` map {module: {"quant_algo": "W4A16_NVFP4", "group_size": 16} | {"quant_algo": "FP8"}}, or a
uniform `quant_algo` with `exclude_modules`. Module names are matched without the text prefix. Anything else
is a clear error, never a silent BF16 fallback.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

from ..checkpoint import canonical_name
from ..errors import UnsupportedModelError

BF16, NVFP4, FP8 = "bf16", "nvfp4", "fp8"
_ALGOS = {"W4A16_NVFP4": NVFP4, "NVFP4": NVFP4, "FP8": FP8}


@dataclass(frozen=True)
class QuantScheme:
    layers: dict = field(default_factory=dict)  # canonical module name -> format
    default: str = BF16  # for modules not listed (uniform configs)
    exclude: tuple = ()

    @property
    def quantized(self) -> bool:
        return bool(self.layers) or self.default != BF16

    def format_of(self, module: str) -> str:
        """module: canonical name without `.weight`, e.g. `layers.3.mlp.experts` or `lm_head`."""
        if module in self.layers:
            return self.layers[module]
        if any(fnmatch.fnmatch(module, pat) or fnmatch.fnmatch("model.language_model." + module, pat)
               for pat in self.exclude):
            return BF16
        return self.default if module.endswith(_LINEAR_SUFFIXES) else BF16


_LINEAR_SUFFIXES = ("q_proj", "k_proj", "v_proj", "o_proj", "in_proj_qkv", "in_proj_z", "out_proj", "gate_proj",
                    "up_proj", "down_proj", "experts", "lm_head")


def _format(algo, where: str, group) -> str:
    fmt = _ALGOS.get(algo)
    if fmt is None:
        raise UnsupportedModelError(f"{where}: quant_algo {algo!r} is not supported (supported: {', '.join(_ALGOS)})")
    if fmt == NVFP4 and group not in (None, 16):
        raise UnsupportedModelError(f"{where}: NVFP4 group_size {group} is not supported (only 16)")
    return fmt


def parse_quant_scheme(quantization: dict | None) -> QuantScheme:
    if not quantization:
        return QuantScheme()
    method = quantization.get("quant_method", "modelopt")
    if method != "modelopt":
        raise UnsupportedModelError(f"quantization_config.quant_method {method!r} is not supported (only ModelOpt's "
                                    "NVFP4/FP8 checkpoints, e.g. nvidia/Qwen3.6-35B-A3B-NVFP4)")
    algo = quantization.get("quant_algo")
    exclude = tuple(quantization.get("exclude_modules") or ())
    if algo == "MIXED_PRECISION":
        listed = quantization.get("quantized_layers")
        if not isinstance(listed, dict) or not listed:
            raise UnsupportedModelError("quantization_config: MIXED_PRECISION without a quantized_layers map")
        layers = {}
        for name, entry in listed.items():
            if not isinstance(entry, dict):
                raise UnsupportedModelError(f"quantization_config.quantized_layers[{name!r}] must be an object")
            canon = canonical_name(name)
            if canon is None:  # vision / MTP modules: the text engine never loads them
                continue
            layers[canon] = _format(entry.get("quant_algo"), f"quantized_layers[{name!r}]", entry.get("group_size"))
        return QuantScheme(layers=layers, exclude=exclude)
    return QuantScheme(default=_format(algo, "quantization_config", quantization.get("group_size")), exclude=exclude)
