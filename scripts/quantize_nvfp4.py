#!/usr/bin/env python3
"""Quantize a BF16 qwen3_5_moe checkpoint into nvidia/Qwen3.6-35B-A3B-NVFP4's mixed NVFP4/FP8/BF16 layout."""
from __future__ import annotations

import argparse

from qwenlocal.engine.quant.convert import quantize_checkpoint


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("src", help="BF16 checkpoint folder (e.g. one from scripts/make_tiny_model.py)")
    p.add_argument("dst", help="output folder")
    p.add_argument("--shards", type=int, default=3)
    a = p.parse_args()
    print(quantize_checkpoint(a.src, a.dst, a.shards))


if __name__ == "__main__":
    main()
