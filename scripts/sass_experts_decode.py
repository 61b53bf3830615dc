#!/usr/bin/env python3
"""Compile the batch-1 expert gate/up kernel (kernels/nvfp4_experts_decode.expert_gate_up_kernel) for sm_90
WITHOUT a GPU (Triton's bundled ptxas; use the H200's Triton, scripts/sass_util.py says how) at the real geometry
(8 routed experts + the shared one, H 2048, I 512) and print, per launch config: registers, spill stack, shared
memory, SASS instructions, 32-bit loads and instructions a weight code (the kernel is straight-line: its whole
count over the codes a thread decodes). A check of how much work a thread does, not a timing.

    PYTHONPATH=/tmp/tri36 python scripts/sass_experts_decode.py [--dump DIR]
"""
from __future__ import annotations

import argparse
import os
import re

os.environ.pop("TRITON_INTERPRET", None)  # noqa: E402 (compile for the GPU, not the interpreter)
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from qwenlocal.engine.kernels import nvfp4_experts_decode as ed  # noqa: E402
from sass_util import loop_instructions, sass_of  # noqa: E402 (scripts/ is on sys.path when this runs as a script)

TYPES = {"x_ptr": "*bf16", "ids_ptr": "*i64", "words_ptr": "*i32", "bytes_ptr": "*u8", "act_ptr": "*fp32",
         "xg_w": "*i32", "xg_s": "*u8", "xg_g": "*fp32", "xu_w": "*i32", "xu_s": "*u8", "xu_g": "*fp32"}
HIDDEN, INTER, K_ROUTED = 2048, 512, 8


def compile_sm90(block_n: int, num_warps: int, block_g: int | None = None, pdl: bool = True):
    fn = ed.expert_gate_up_kernel
    sig = {name: TYPES.get(name, "constexpr") for name in fn.arg_names}
    for name in ("H", "I", "row_words", "gu_scale_at", "glob_at", "tiles"):
        sig[name] = "i32"
    consts = dict(K_ROUTED=K_ROUTED, HAS_EXTRA=True, BLOCK_N=block_n, BLOCK_G=ed._block_g(HIDDEN, block_g),
                  MASKED=False, DECODE="asm", X_SPLIT=True, GROUP_SCALES=False, USE_GDC=pdl, PERSISTENT=False)
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
             if sig[n].startswith("*") or n in ("H", "I", "gu_scale_at")}
    return triton.compile(ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=num_warps))


# (block_n, warps, block_g): the default 2 x 4 (one K step), then more rows a program
CONFIGS = [(2, 4, None), (4, 4, None), (8, 4, None)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", help="write ttgir / ptx / sass per config here")
    args = ap.parse_args()
    print(f"{'block_n':>7} {'warps':>5} {'groups':>6} {'regs':>4} {'stack':>5} {'smem':>6} "
          f"{'instrs':>6} {'LDG':>4} {'BAR':>4} {'SHFL':>4} {'programs/SM':>11} {'instr/code':>10}")
    for block_n, num_warps, block_g in CONFIGS:
        kernel = compile_sm90(block_n, num_warps, block_g)
        path = os.path.join(args.dump or "/tmp", f"experts_decode_{block_n}_{num_warps}_{block_g}")
        body, usage, sass = sass_of(kernel, path, bool(args.dump))
        count = lambda op: sum(1 for ln in body if re.search(rf"\b{op}", ln))  # noqa: E731
        regs = int(usage["REG"])
        per_sm = min(32, 2048 // (32 * num_warps), 65536 // (regs * 32 * num_warps),
                     228 * 1024 // max(1, kernel.metadata.shared))
        codes = 2 * block_n * HIDDEN / (32 * num_warps)  # gate and up rows of a program, over its threads
        steps = HIDDEN // 16 // ed._block_g(HIDDEN, block_g)
        instrs = loop_instructions(sass, steps)
        print(f"{block_n:>7} {num_warps:>5} {str(block_g):>6} {regs:>4} {usage['STACK']:>5} "
              f"{kernel.metadata.shared:>6} {len(body):>6} {count('LDG'):>4} {count('BAR'):>4} {count('SHFL'):>4} "
              f"{per_sm:>11} {instrs / codes:>10.2f}")


if __name__ == "__main__":
    main()
