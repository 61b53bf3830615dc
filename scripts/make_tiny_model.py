#!/usr/bin/env python3
"""Write a small qwen3_5_moe checkpoint in the real layout (sharded safetensors + index, config with
text_config, trained byte-level BPE tokenizer with Qwen's special tokens, chat template, generation config)."""
from __future__ import annotations

import argparse

import torch

from qwenlocal.engine.tiny import GEOMETRIES, make_tiny_checkpoint


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("out", help="output folder")
    p.add_argument("--geometry", choices=sorted(GEOMETRIES), default="tiny")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--expert-layout", choices=["fused", "per-expert"], default="fused",
                   help="fused: experts.gate_up_proj/down_proj per layer (BF16 checkpoint); per-expert: "
                        "experts.{e}.gate_proj/up_proj/down_proj.weight (NVFP4 checkpoint, transformers' save)")
    p.add_argument("--shards", type=int, default=3)
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    a = p.parse_args()
    path = make_tiny_checkpoint(a.out, a.geometry, seed=a.seed, expert_layout=a.expert_layout,
                                num_shards=a.shards, dtype=getattr(torch, a.dtype))
    print(path)


if __name__ == "__main__":
    main()
