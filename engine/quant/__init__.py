"""Quantized weight formats: NVFP4 (W4A16, ModelOpt) and FP8, with torch reference (de)quantization."""
