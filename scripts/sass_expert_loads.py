#!/usr/bin/env python3
"""Compile the batch-1 expert kernels for sm_90 WITHOUT a GPU (Triton's bundled ptxas) and print how they load
the codes: the 4-byte kernels (rows 1,769,484 B apart) against the 16-byte-load ones (rows padded to a 16-byte
stride, nvfp4_experts_decode.WIDE_LOADS), at the engine's launches and a few wider ones: registers, SASS
instructions, global loads by width, instructions a code. A check of what the compiler makes, not a timing.

    python scripts/sass_expert_loads.py
"""
from __future__ import annotations

import os
import re

os.environ.pop("TRITON_INTERPRET", None)  # noqa: E402 (compile for the GPU, not the interpreter)
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from qwenlocal.engine.kernels import nvfp4_experts_decode as dec  # noqa: E402
from qwenlocal.engine.kernels import nvfp4_experts_parts as parts  # noqa: E402
from qwenlocal.engine.quant.nvfp4_rows import nvfp4_expert_row_bytes  # noqa: E402
from sass_util import sass_of  # noqa: E402 (scripts/ is on sys.path when this runs as a script)

H, I, K = 2048, 512, 8
ROW = nvfp4_expert_row_bytes(H, I)
PADDED = -(-ROW // 16) * 16
POINTERS = {"x_ptr": "*bf16", "act_ptr": "*fp32", "ids_ptr": "*i64", "words_ptr": "*i32", "bytes_ptr": "*u8",
            "wts_ptr": "*bf16", "parts_ptr": "*fp32", "extra_scale_ptr": "*fp32", "addend_ptr": "*fp32",
            "xg_w": "*i32", "xg_s": "*u8", "xg_g": "*fp32", "xu_w": "*i32", "xu_s": "*u8", "xu_g": "*fp32",
            "xd_w": "*i32", "xd_s": "*u8", "xd_g": "*fp32", "x_ptr_": "*bf16", "norm_w_ptr": "*bf16",
            "new_x_out_ptr": "*i16", "new_x_ptr": "*bf16", "norm_ptr": "*i16", "counters_ptr": "*i32"}


def compile_sm90(fn, consts: dict, ints: tuple, aligned_rows: bool, num_warps: int):
    sig = {}
    for name in fn.arg_names:
        if name in consts:
            sig[name] = "constexpr"
        elif name in POINTERS:
            sig[name] = POINTERS[name]
        else:
            sig[name] = "i32" if name in ints else ("fp32" if name == "eps" else "constexpr")
    # The 4-byte kernels do not specialize the rows' pointers (do_not_specialize); the wide ones see them aligned.
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names) if sig[n].startswith("*")
             and (aligned_rows or n not in ("words_ptr", "bytes_ptr"))}
    for i, n in enumerate(fn.arg_names):
        if n in ("gu_scale_at", "glob_at", "dn_at", "dn_scale_at") and sig[n] == "i32":
            attrs[(i,)] = [["tt.divisibility", 16]]
    return triton.compile(ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=num_warps))


def main() -> None:
    common = dict(K_ROUTED=K, HAS_EXTRA=True, MASKED=False, DECODE="asm", USE_GDC=True)
    print(f"{'kernel':<24} {'launch':<26} {'regs':>4} {'instrs':>6} {'LDG.32':>6} {'LDG.64':>6} {'LDG.128':>7} "
          f"{'instr/code':>10}")
    for block_n, warps in ((2, 4), (4, 4), (8, 4)):
        gu = dict(common, BLOCK_N=block_n, BLOCK_G=128, X_SPLIT=True, GROUP_SCALES=False)
        codes = 2 * block_n * H / (32 * warps)  # a program's gate and up rows over a thread
        for name, fn, consts, ints, aligned in (
                ("expert_gate_up", dec.expert_gate_up_kernel, dict(gu, PERSISTENT=False),
                 ("H", "I", "row_words", "gu_scale_at", "glob_at", "tiles"), False),
                ("expert_gate_up_wide", dec.expert_gate_up_wide_kernel, dict(gu, H=H, I=I, ROW_WORDS=PADDED // 4),
                 ("gu_scale_at", "glob_at"), True)):
            report(name, f"block_n {block_n}, {warps} warps", compile_sm90(fn, consts, ints, aligned, warps), codes)
    for block_m, warps in ((16, 2), (32, 2), (32, 4)):
        dn = dict(common, HAS_EXTRA_SCALE=True, HAS_ADDEND=False, BLOCK_M=block_m, BLOCK_G=32, X_SPLIT=True,
                  GROUP_SCALES=True)
        codes = block_m * I / (32 * warps)
        for name, fn, consts, ints, aligned in (
                ("expert_down_parts", parts.expert_down_parts_kernel, dict(dn, PERSISTENT=False, NORM_TAIL=False),
                 ("H", "I", "row_words", "dn_at", "dn_scale_at", "glob_at"), False),
                ("expert_down_parts_wide", parts.expert_down_parts_wide_kernel,
                 dict(dn, H=H, I=I, ROW_WORDS=PADDED // 4), ("dn_at", "dn_scale_at", "glob_at"), True)):
            report(name, f"block_m {block_m}, {warps} warps", compile_sm90(fn, consts, ints, aligned, warps), codes)


def report(name: str, launch: str, kernel, codes: float) -> None:
    lines, usage, _ = sass_of(kernel, "/tmp/qwenlocal_expert_loads")
    regs = usage["REG"]
    loads = {w: sum(1 for ln in lines if re.search(rf"\bLDG\.E{w}\s", ln + " ")) for w in ("", ".64", ".128")}
    print(f"{name:<24} {launch:<26} {regs:>4} {len(lines):>6} {loads['']:>6} {loads['.64']:>6} {loads['.128']:>7} "
          f"{len(lines) / codes:>10.2f}")


if __name__ == "__main__":
    main()
