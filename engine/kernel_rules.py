"""Which kernel runs each part of the model (attention, GDN, MoE, the batch-1 decode step, prefill's small
kernels): the selection rules, a pure function of the model's shapes, the device, the dtype, the installed
software and the GPU's compute capability, each choice with its reason. resolve() records them in the
EngineConfig; model/kernels.py maps the names to callables.
"""
from __future__ import annotations

from .engine_config import Software
from .errors import OptionError
from .memory import ModelInfo

# Head sizes FlashInfer ships/compiles attention kernels for, and fla's GDN kernels handle.
FLASHINFER_HEAD_DIMS = (64, 128, 256)
FLA_HEAD_DIMS = (16, 32, 64, 128, 256)


def kernel_choices(model: ModelInfo, dev: str, dtype: str, decode_kernels: str, sw: Software,
                   capability: tuple[int, int] | None = None, prefill_kernels: str = "auto",
                   gdn_graphs: str = "auto") -> dict[str, tuple[str, str]]:
    """part -> (kernel name, reason) for attention, gdn, moe, the batch-1 decode step and prefill's small kernels.
    capability: the GPU's compute capability (programmatic dependent launch needs sm_90+)."""
    if dev != "cuda":
        if decode_kernels in ("fused", "fused-pdl"):
            raise OptionError("decode_kernels=fused needs a CUDA GPU with Triton; on the CPU use decode_kernels=auto "
                              "or reference")
        if prefill_kernels == "fused":
            raise OptionError("prefill_kernels=fused needs a CUDA GPU with Triton; on the CPU use prefill_kernels=auto "
                              "or torch")
        if gdn_graphs == "on":
            raise OptionError("gdn_graphs=on needs a CUDA GPU with fla-core; on the CPU use gdn_graphs=auto or off")
        return {"attention": ("sdpa", "CPU: torch SDPA over a contiguous KV cache (the reference path)"),
                "gdn": ("torch", "CPU: the torch chunked/recurrent gated delta rule (the reference path)"),
                "moe": ("torch", "CPU: per-expert loop over the chosen experts (the reference path)"),
                "decode": ("reference", "CPU: the unfused decode path"),
                "prefill_kernels": ("torch", "CPU: the torch ops (the reference path)")}
    out: dict[str, tuple[str, str]] = {}
    fi_ok = model.attention_head_dim in FLASHINFER_HEAD_DIMS and dtype in ("bfloat16", "float16")
    if fi_ok and sw.flashinfer:
        out["attention"] = ("flashinfer", "GPU: FlashInfer paged prefill and CUDA-graph decode (tensor cores)")
    else:
        why = (f"FlashInfer has no kernels for head_dim {model.attention_head_dim} in {dtype}" if not fi_ok else
               "FlashInfer is not installed")
        out["attention"] = ("sdpa", f"torch SDPA: {why} (no CUDA graphs with this backend)")
    key, value = model.gdn_head_dims
    fla_ok = key in FLA_HEAD_DIMS and value in FLA_HEAD_DIMS
    if fla_ok and sw.fla and gdn_graphs == "on":
        out["gdn"] = ("fla-graphs", "gdn_graphs=on: fla-core chunked rule (prefill), each full chunk one CUDA graph "
                                    "replay (no host time for fla's launches), and fused recurrent (decode)")
    elif fla_ok and sw.fla:
        why = "gdn_graphs=off" if gdn_graphs == "off" else "auto: the plain calls until the graphs' GPU A/B"
        out["gdn"] = ("fla", f"fla-core chunked rule (prefill) and fused recurrent (decode); {why}")
    elif gdn_graphs == "on":
        raise OptionError("gdn_graphs=on needs fla-core's kernels (installed, head dims it takes); use gdn_graphs=auto")
    else:
        why = "fla-core is not installed" if fla_ok else f"fla does not take head dims {key}/{value}"
        out["gdn"] = ("torch", f"{why}: torch reference rule")
    if sw.triton:
        out["moe"] = ("triton", "Triton grouped GEMM (prefill) and a k-expert GEMV (decode); NVFP4 experts "
                                "dequantized on the fly (W4A16)")
    else:
        out["moe"] = ("torch", "Triton is not available: per-expert loop (syncs; no CUDA graphs)")
    if decode_kernels == "reference":
        out["decode"] = ("reference", "the unfused decode path")
    elif decode_kernels == "fused-pdl" and not (sw.triton and capability is not None and capability >= (9, 0)):
        raise OptionError("decode_kernels=fused-pdl needs Triton and a GPU of compute capability 9.0+ "
                          f"(this one: {'.'.join(map(str, capability)) if capability else 'unknown'}); use "
                          "decode_kernels=auto")
    elif decode_kernels == "fused-pdl" or (decode_kernels == "auto" and sw.triton and capability is not None
                                           and capability >= (9, 0)):
        out["decode"] = ("fused-pdl", "fused Triton batch-1 decode kernels, launched with programmatic dependent "
                                      "launch (each launch overlaps the previous kernel's tail; the same bytes; "
                                      "H200 16K step 2.819 -> 2.591 ms, docs/RESULTS.md session 7)")
    elif sw.triton:
        why = ("decode_kernels=fused" if decode_kernels == "fused" else
               "programmatic dependent launch needs sm_90+")
        out["decode"] = ("fused", f"fused Triton batch-1 decode kernels (plain launches: {why})")
    else:
        out["decode"] = ("reference", "the unfused decode path (Triton is not available)")
    if prefill_kernels == "fused" and not sw.triton:
        raise OptionError("prefill_kernels=fused needs Triton; use prefill_kernels=auto or torch")
    if prefill_kernels == "torch" or not sw.triton:
        why = "prefill_kernels=torch" if prefill_kernels == "torch" else "Triton is not available"
        out["prefill_kernels"] = ("torch", f"{why}: the torch ops of the reference path (~10 a norm)")
    else:
        why = ("prefill_kernels=fused" if prefill_kernels == "fused" else
               "auto: at the torch path's logits level and layer-major byte-equal to chunked on the H200 (session 10); "
               "TTFT 0.89 / 0.96 of the torch path's at 16K / 120K (docs/RESULTS.md session 9)")
        out["prefill_kernels"] = ("fused", f"{why}: prefill's residual add + RMSNorms, GatedDeltaNet's gated norm "
                                           "and causal conv, the attention's q/k norms + RoPE and output gate in one "
                                           "Triton launch each instead of ~10 torch ops each: launches and host time "
                                           "in a host-bound prefill")
    return out


def attention_choices(attention: str, mode: str, prefill_attention: str, attention_pairs: str) -> dict:
    """option -> (value, auto's value, reason, note) for how FlashInfer's prefill reads the KV cache and whether
    layer-major pairs its chunks in one call; OptionError where an asked value cannot apply."""
    if attention != "flashinfer":
        read = ("sdpa", "sdpa", "torch SDPA over the contiguous KV cache (no FlashInfer)", "it applies to FlashInfer only")
    else:
        why = ("ragged: the pages read as contiguous rows (one sequence owns them in order), which FA3 loads with "
               "TMA: a 120K prompt's attention 0.70x the paged kernel's time on the H200, FA2 0.94x "
               "(docs/RESULTS.md session 12)")
        read = ("ragged" if prefill_attention == "auto" else prefill_attention, "ragged", why, "")
    if attention != "flashinfer" or mode != "layer-major":
        why = ("pairs are FlashInfer prefill calls" if attention != "flashinfer" else
               "pairs are chunks of a layer-major pass; this prefill is chunked")
        if attention_pairs == "on":
            raise OptionError(f"attention_pairs=on does not apply here: {why}; use attention_pairs=auto")
        pairs = (False, "off", f"one call per chunk: {why}", "")
    else:
        why = ("one call per chunk; pairs: one FlashInfer call over two adjacent chunks where both chunks' plans and "
               "the pair's show the same q tile, no KV split and a tile-aligned start (the same bytes); auto: off, "
               "at 8,192-token chunks a call already fills the GPU (the attention of a 120K prompt 1.006x with "
               "pairs, 16K 0.946x: 2.5 ms; docs/RESULTS.md session 12)")
        pairs = (attention_pairs == "on", "off", why, "")
    return {"prefill_attention": read, "attention_pairs": pairs}


def moe_block_choice(moe: str, asked: str) -> tuple[str, str, str, str]:
    """option -> (value, auto's value, reason, note) for the grouped prefill MoE kernels' row blocks;
    OptionError where "large" cannot apply (no Triton grouped kernels)."""
    if moe != "triton":
        if asked == "large":
            raise OptionError("moe_prefill_blocks=large applies to the Triton grouped MoE kernels; this engine runs "
                              "the torch reference MoE: use moe_prefill_blocks=auto")
        return ("standard", "standard", "the torch reference MoE has no row blocks", "")
    why = ("standard: 32/64/128-row blocks by pairs an expert (NVFP4, choose_config), 32 (BF16); large: 256-row "
           "blocks (NVFP4) / 64 (BF16) from 192 pairs an expert, 0.92x / 0.80x the standard kernels' time at "
           "8,192 tokens on the H200 (docs/RESULTS.md session 13); auto: standard until the engine's paired TTFT A/B")
    return ("standard" if asked == "auto" else asked, "standard", why, "")
