#!/usr/bin/env python3
"""Compile the batch-1 expert kernels for sm_90 WITHOUT a GPU (Triton's bundled ptxas) and print what the
compiler makes of them: the 4-byte-word kernels (nvfp4_experts_decode / _parts, rows 1,769,484 B apart) against
the group-word ones (nvfp4_experts_groups: int64 words a scale group over rows at the engine's 16-byte stride),
at the engine's launches and a few others: registers, SASS instructions, global loads by width, instructions a
code. The group-word kernels hold their tile code twice (routed / shared expert) and run one copy a program:
"run/code" counts half of their instructions. A check of what the compiler makes, not a timing.

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
from qwenlocal.engine.kernels import nvfp4_experts_groups as groups  # noqa: E402
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
            "new_x_out_ptr": "*i16", "new_x_ptr": "*bf16", "norm_ptr": "*i16", "counters_ptr": "*i32",
            "w64_ptr": "*i64", "w32_ptr": "*i32", "xu_w_at": "i64", "xu_s_at": "i64"}
OFFSETS = ("gu_scale_at", "glob_at", "dn_at", "dn_scale_at", "xu_w_at", "xu_s_at")  # multiples of 16 in practice


GROUP_WORDS = {"xg_w": "*i64", "xd_w": "*i64"}  # the group-word kernels read the shared expert's codes as int64


def compile_sm90(fn, consts: dict, ints: tuple, aligned_rows: bool, num_warps: int):
    pointers = dict(POINTERS, **(GROUP_WORDS if "w64_ptr" in fn.arg_names else {}))
    sig = {}
    for name in fn.arg_names:
        if name in consts:
            sig[name] = "constexpr"
        elif name in pointers:
            sig[name] = pointers[name]
        else:
            sig[name] = "i32" if name in ints else ("fp32" if name == "eps" else "constexpr")
    # The 4-byte kernels do not specialize the rows' pointers (do_not_specialize); the group-word ones see them
    # aligned.
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names) if sig[n].startswith("*")
             and (aligned_rows or n not in ("words_ptr", "bytes_ptr"))}
    for i, n in enumerate(fn.arg_names):
        if n in OFFSETS and sig[n] in ("i32", "i64"):
            attrs[(i,)] = [["tt.divisibility", 16]]
    return triton.compile(ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=num_warps))


def main() -> None:
    common = dict(K_ROUTED=K, HAS_EXTRA=True, DECODE="asm", USE_GDC=True)
    print(f"{'kernel':<24} {'launch':<26} {'regs':>4} {'instrs':>6} {'LDG.32':>6} {'LDG.64':>6} {'LDG.128':>7} "
          f"{'run/code':>8}")
    for block_n, warps in ((2, 4), (2, 2), (4, 2), (4, 4)):
        codes = 2 * block_n * H / (32 * warps)  # a program's gate and up rows over a thread
        gu = dict(common, BLOCK_N=block_n, BLOCK_G=128, X_SPLIT=True, GROUP_SCALES=False, MASKED=False,
                  PERSISTENT=False)
        report("expert_gate_up", f"block_n {block_n}, {warps} warps",
               compile_sm90(dec.expert_gate_up_kernel, gu, ("H", "I", "row_words", "gu_scale_at", "glob_at", "tiles"),
                            False, warps), codes)
        gg = dict(common, H=H, I=I, ROW_BYTES=PADDED, BLOCK_N=block_n, CHUNK=64, CHUNKS=2)
        report("expert_gate_up_groups", f"block_n {block_n}, {warps} warps",
               compile_sm90(groups.expert_gate_up_groups_kernel, gg, ("gu_scale_at", "glob_at", "xu_w_at", "xu_s_at"),
                            True, warps), 2 * codes)
    for block_m, warps in ((16, 2), (32, 2), (16, 4), (32, 4)):
        codes = block_m * I / (32 * warps)
        dn = dict(common, HAS_EXTRA_SCALE=True, HAS_ADDEND=False, BLOCK_M=block_m, BLOCK_G=32, X_SPLIT=True,
                  GROUP_SCALES=True, MASKED=False, PERSISTENT=False, NORM_TAIL=False)
        report("expert_down_parts", f"block_m {block_m}, {warps} warps",
               compile_sm90(parts.expert_down_parts_kernel, dn, ("H", "I", "row_words", "dn_at", "dn_scale_at",
                                                                 "glob_at"), False, warps), 2 * codes)
        dg = dict(common, HAS_EXTRA_SCALE=True, HAS_ADDEND=False, H=H, I=I, ROW_BYTES=PADDED, BLOCK_M=block_m,
                  CHUNK=32, CHUNKS=1)
        report("expert_down_parts_groups", f"block_m {block_m}, {warps} warps",
               compile_sm90(groups.expert_down_parts_groups_kernel, dg, ("dn_at", "dn_scale_at", "glob_at"), True,
                            warps), 2 * codes)


def report(name: str, launch: str, kernel, codes: float) -> None:
    lines, usage, _ = sass_of(kernel, "/tmp/qwenlocal_expert_loads")
    regs = usage["REG"]
    loads = {w: sum(1 for ln in lines if re.search(rf"\bLDG\.E{w}\s", ln + " ")) for w in ("", ".64", ".128")}
    print(f"{name:<24} {launch:<26} {regs:>4} {len(lines):>6} {loads['']:>6} {loads['.64']:>6} {loads['.128']:>7} "
          f"{len(lines) / codes:>10.2f}")


if __name__ == "__main__":
    main()
