"""Load a qwen3_5_moe checkpoint's text weights into canonical tensors.

Canonical names drop the text prefix (`model.language_model.` or `model.`). Routed experts are returned
stacked per layer whatever the stored layout:
  `layers.L.mlp.experts.gate_up_proj` [E, 2I, H]  (rows 0:I are gate, I:2I are up; (out, in) layout)
  `layers.L.mlp.experts.down_proj`    [E, H, I]
Every name and shape is checked against the config before any tensor data is read.
"""
from __future__ import annotations

import logging
from collections import defaultdict
from typing import Callable

import torch
from safetensors import safe_open

from .checkpoint import Checkpoint, TensorEntry
from .config import FULL_ATTENTION, ModelConfig
from .errors import CheckpointError, UnsupportedModelError
from .quant.formats import GROUP, dequant_fp8, dequant_nvfp4
from .quant.linear import QuantLinear
from .quant.nvfp4_rows import pack_nvfp4_expert
from .quant.scheme import BF16, NVFP4, QuantScheme, parse_quant_scheme

log = logging.getLogger(__name__)
# Kept in fp32 whatever the compute dtype (mamba_ssm_dtype is float32 in the config).
FP32_SUFFIXES = ("linear_attn.A_log", "linear_attn.dt_bias")
ProgressFn = Callable[[int, int], None]


def dense_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every non-routed-expert tensor of the text model with its expected shape."""
    h, a, lin, moe = cfg.hidden_size, cfg.attention, cfg.linear, cfg.moe
    shapes: dict[str, tuple[int, ...]] = {"embed_tokens.weight": (cfg.vocab_size, h), "norm.weight": (h,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, h)
    for i, kind in enumerate(cfg.layer_types):
        p = f"layers.{i}."
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        if kind == FULL_ATTENTION:
            q_out = a.num_heads * a.head_dim * 2
            kv_out = a.num_kv_heads * a.head_dim
            shapes[p + "self_attn.q_proj.weight"] = (q_out, h)
            shapes[p + "self_attn.k_proj.weight"] = (kv_out, h)
            shapes[p + "self_attn.v_proj.weight"] = (kv_out, h)
            shapes[p + "self_attn.o_proj.weight"] = (h, a.num_heads * a.head_dim)
            shapes[p + "self_attn.q_norm.weight"] = (a.head_dim,)
            shapes[p + "self_attn.k_norm.weight"] = (a.head_dim,)
        else:
            shapes[p + "linear_attn.in_proj_qkv.weight"] = (lin.conv_dim, h)
            shapes[p + "linear_attn.in_proj_z.weight"] = (lin.value_dim, h)
            shapes[p + "linear_attn.in_proj_b.weight"] = (lin.num_value_heads, h)
            shapes[p + "linear_attn.in_proj_a.weight"] = (lin.num_value_heads, h)
            shapes[p + "linear_attn.conv1d.weight"] = (lin.conv_dim, 1, lin.conv_kernel)
            shapes[p + "linear_attn.dt_bias"] = (lin.num_value_heads,)
            shapes[p + "linear_attn.A_log"] = (lin.num_value_heads,)
            shapes[p + "linear_attn.norm.weight"] = (lin.value_head_dim,)
            shapes[p + "linear_attn.out_proj.weight"] = (h, lin.value_dim)
        shapes[p + "mlp.gate.weight"] = (moe.num_experts, h)
        shapes[p + "mlp.shared_expert.gate_proj.weight"] = (moe.shared_intermediate_size, h)
        shapes[p + "mlp.shared_expert.up_proj.weight"] = (moe.shared_intermediate_size, h)
        shapes[p + "mlp.shared_expert.down_proj.weight"] = (h, moe.shared_intermediate_size)
        shapes[p + "mlp.shared_expert_gate.weight"] = (1, h)
    return shapes


def expert_plan(ckpt: Checkpoint, cfg: ModelConfig, layer: int, scheme: QuantScheme | None = None) -> dict:
    """The stored tensors of one layer's routed experts, validated; fused or per-expert layout (per expert
    in BF16, or quantized as the scheme says)."""
    h, moe = cfg.hidden_size, cfg.moe
    e, i = moe.num_experts, moe.intermediate_size
    p = f"layers.{layer}.mlp.experts."
    fmt = scheme.format_of(p[:-1]) if scheme is not None else BF16
    if fmt != BF16:
        return {"format": fmt, **{kind: [quantized_entries(ckpt, f"{p}{x}.{kind}", fmt, *shape) for x in range(e)]
                                  for kind, shape in (("gate_proj", (i, h)), ("up_proj", (i, h)), ("down_proj", (h, i)))}}
    if p + "gate_up_proj" in ckpt or p + "down_proj" in ckpt:
        return {
            "gate_up_proj": ckpt.expect_shape(p + "gate_up_proj", (e, 2 * i, h)),
            "down_proj": ckpt.expect_shape(p + "down_proj", (e, h, i)),
        }
    if p + "0.gate_proj.weight" not in ckpt:
        raise CheckpointError(
            f"layer {layer}: routed experts are missing (looked for {p}gate_up_proj and {p}0.gate_proj.weight)"
        )
    return {
        "gate_proj": [ckpt.expect_shape(f"{p}{x}.gate_proj.weight", (i, h)) for x in range(e)],
        "up_proj": [ckpt.expect_shape(f"{p}{x}.up_proj.weight", (i, h)) for x in range(e)],
        "down_proj": [ckpt.expect_shape(f"{p}{x}.down_proj.weight", (h, i)) for x in range(e)],
    }


def quantized_entries(ckpt: Checkpoint, module: str, fmt: str, out: int, inp: int) -> dict[str, TensorEntry]:
    """The stored tensors of one quantized linear, validated: NVFP4 = packed weight [out, in/2] (U8), block scales
    [out, in/16] (F8_E4M3), global scale [] (F32); FP8 = weight [out, in] (F8_E4M3), scale [] (F32)."""
    if fmt == NVFP4:
        return {
            "weight": _expect(ckpt, module + ".weight", (out, inp // 2), "U8"),
            "weight_scale": _expect(ckpt, module + ".weight_scale", (out, inp // GROUP), "F8_E4M3"),
            "weight_scale_2": _expect(ckpt, module + ".weight_scale_2", (), "F32"),
        }
    return {"weight": _expect(ckpt, module + ".weight", (out, inp), "F8_E4M3"),
            "weight_scale": _expect(ckpt, module + ".weight_scale", (), "F32")}


def _expect(ckpt: Checkpoint, name: str, shape: tuple[int, ...], dtype: str) -> TensorEntry:
    entry = ckpt.expect_shape(name, shape)
    if entry.dtype != dtype:
        raise CheckpointError(f"tensor {entry.key} in {entry.file.name} is {entry.dtype}, expected {dtype} as the "
                              "quantization config says")
    return entry


def check_scheme_matches(ckpt: Checkpoint, scheme: QuantScheme) -> None:
    """Scales on a module the config calls BF16 mean the config and the weights disagree."""
    for name in ckpt.entries:
        if name.endswith(".weight_scale"):
            module = name[: -len(".weight_scale")]
            base = module.rsplit(".", 2)[0] if ".mlp.experts." in module else module
            if scheme.format_of(base) == BF16:
                raise UnsupportedModelError(
                    f"{name} is stored quantized but the quantization config does not list {base}: the checkpoint's "
                    "config.json and weights disagree (re-download it)")


def _dequant(reader: "_Reader", entries: dict[str, TensorEntry], fmt: str, dtype: torch.dtype) -> torch.Tensor:
    if fmt == NVFP4:
        return dequant_nvfp4(reader.get(entries["weight"]), reader.get(entries["weight_scale"]),
                             reader.get(entries["weight_scale_2"]), dtype)
    return dequant_fp8(reader.get(entries["weight"]), reader.get(entries["weight_scale"]), dtype)


def _nvfp4_rows(reader: "_Reader", plan: dict) -> torch.Tensor:
    """One layer's NVFP4 experts, unchanged bytes, packed one row per expert."""
    def triple(group):
        return reader.get(group["weight"]), reader.get(group["weight_scale"]), reader.get(group["weight_scale_2"])

    return torch.stack([pack_nvfp4_expert(triple(g), triple(u), triple(d))
                        for g, u, d in zip(plan["gate_proj"], plan["up_proj"], plan["down_proj"])])


class _Reader:
    """Opens each shard once and hands out tensors; data are read lazily per tensor."""

    def __init__(self):
        self._files: dict = {}

    def get(self, entry: TensorEntry) -> torch.Tensor:
        handle = self._files.get(entry.file)
        if handle is None:
            try:
                handle = self._files[entry.file] = safe_open(str(entry.file), framework="pt")
            except Exception as exc:  # safetensors raises its own error types
                raise CheckpointError(f"cannot open {entry.file.name}: {exc}; re-download it") from exc
        try:
            return handle.get_tensor(entry.key)
        except Exception as exc:
            raise CheckpointError(f"cannot read tensor {entry.key} from {entry.file.name}: {exc}") from exc


def load_weights(
    ckpt: Checkpoint, cfg: ModelConfig, dtype: torch.dtype, device: str | torch.device = "cpu",
    progress: ProgressFn | None = None, expert_sink: Callable[..., None] | None = None,
    native_nvfp4: bool = False, native_linears: bool = False, linear_kernels: bool = False,
    fp8_scaled_mm: bool = False,
) -> dict[str, torch.Tensor]:
    """expert_sink(layer, gate_up, down): receives each layer's experts (on the CPU) instead of the returned
    dict, so an offloaded model streams them into its host bank without a second full copy.
    native_nvfp4: NVFP4 experts stay in their 4-bit bytes, one packed row per expert (quant/nvfp4_rows.py):
    expert_sink(layer, rows [E, row_bytes]) or `layers.L.mlp.experts.nvfp4_rows` in the returned dict.
    native_linears: FP8/NVFP4 dense weights become QuantLinear layers holding the checkpoint's bytes on `device`
    (linear_kernels: their decode GEMV runs in Triton) instead of tensors dequantized to `dtype`;
    fp8_scaled_mm: their FP8 prefill runs W8A8 on tensor cores."""
    scheme = parse_quant_scheme(cfg.quantization)
    check_scheme_matches(ckpt, scheme)
    shapes = dense_shapes(cfg)
    entries, quantized = {}, {}
    for name, shape in shapes.items():
        fmt = scheme.format_of(name[: -len(".weight")]) if name.endswith(".weight") else BF16
        if fmt == BF16:
            entries[name] = ckpt.expect_shape(name, shape)
        else:
            quantized[name] = (fmt, quantized_entries(ckpt, name[: -len(".weight")], fmt, *shape))
    experts = {layer: expert_plan(ckpt, cfg, layer, scheme) for layer in range(cfg.num_layers)}
    expert_names = {e.key for plan in experts.values() for v in plan.values() if not isinstance(v, str)
                    for item in (v if isinstance(v, list) else [v])
                    for e in (item.values() if isinstance(item, dict) else [item])}
    expert_names |= {e.key for _, group in quantized.values() for e in group.values()}
    # Activation/KV scales of W8A8 kernels are expected extras: BF16-activation paths do not use them, and the
    # W8A8 prefill quantizes activations per token (kernels/fp8_scaled_mm.py says why not the static scale).
    extras = (".input_scale", ".k_scale", ".v_scale", ".q_scale", ".prob_scale")
    unused = sorted(n for n, e in ckpt.entries.items()
                    if n not in entries and e.key not in expert_names and not n.endswith(extras))
    if unused:
        log.warning("ignoring %d tensors the text model does not use, e.g. %s", len(unused), unused[:3])

    reader = _Reader()
    total, done = len(entries) + len(quantized) + cfg.num_layers, 0

    def convert(name: str, t: torch.Tensor) -> torch.Tensor:
        target = torch.float32 if name.endswith(FP32_SUFFIXES) else dtype
        return t.to(device=device, dtype=target)


    out: dict[str, torch.Tensor] = {}
    for name, entry in entries.items():
        out[name] = convert(name, reader.get(entry))
        done += 1
        if progress:
            progress(done, total)
    for name, (fmt, group) in quantized.items():
        if native_linears:
            out[name] = QuantLinear(fmt, {k: reader.get(e).to(device) for k, e in group.items()}, dtype,
                                    use_kernels=linear_kernels, fp8_scaled_mm=fp8_scaled_mm)
        else:  # dequantized once at load (the CPU reference path)
            out[name] = _dequant(reader, group, fmt, dtype).to(device)
        done += 1
        if progress:
            progress(done, total)
    expert_device = "cpu" if expert_sink is not None else device

    def convert_expert(t: torch.Tensor) -> torch.Tensor:
        return t.to(device=expert_device, dtype=dtype)

    for layer, plan in experts.items():
        p = f"layers.{layer}.mlp.experts."
        if native_nvfp4 and plan.get("format") == NVFP4:
            rows = _nvfp4_rows(reader, plan)
            if expert_sink is not None:
                expert_sink(layer, rows)
            else:
                out[p + "nvfp4_rows"] = rows.to(device)
            done += 1
            if progress:
                progress(done, total)
            continue
        if "format" in plan:
            parts = {kind: [_dequant(reader, group, plan["format"], dtype) for group in plan[kind]]
                     for kind in ("gate_proj", "up_proj", "down_proj")}
            gate_up = convert_expert(torch.cat([torch.stack(parts["gate_proj"]), torch.stack(parts["up_proj"])], dim=1))
            down = convert_expert(torch.stack(parts["down_proj"]))
        elif "gate_up_proj" in plan:
            gate_up = convert_expert(reader.get(plan["gate_up_proj"]))
            down = convert_expert(reader.get(plan["down_proj"]))
        else:
            parts = defaultdict(list)
            for kind in ("gate_proj", "up_proj", "down_proj"):
                for entry in plan[kind]:
                    parts[kind].append(convert_expert(reader.get(entry)))
            gate_up = torch.cat([torch.stack(parts["gate_proj"]), torch.stack(parts["up_proj"])], dim=1)
            down = torch.stack(parts["down_proj"])
        if expert_sink is not None:
            expert_sink(layer, gate_up, down)
        else:
            out[p + "gate_up_proj"], out[p + "down_proj"] = gate_up, down
        done += 1
        if progress:
            progress(done, total)
    if cfg.tie_word_embeddings:
        out["lm_head.weight"] = out["embed_tokens.weight"]
    return out
