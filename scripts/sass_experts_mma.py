#!/usr/bin/env python3
"""Compile the tensor-core NVFP4 expert kernel (kernels/nvfp4_experts_mma.py) for sm_90 WITHOUT a GPU (Triton's
bundled ptxas) and print, per launch config: registers, spill stack, shared memory, SASS instructions, tensor-core
and 16 B load instructions, and instructions a weight code (static count of the loop body over the codes a thread
handles per K step). A check that it compiles for the H200 and how much work a thread does, not a timing.

    python scripts/sass_experts_mma.py [--dump DIR]
"""
from __future__ import annotations

import argparse
import os
import re

os.environ.pop("TRITON_INTERPRET", None)  # noqa: E402 (compile for the GPU, not the interpreter)
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from qwenlocal.engine.kernels import nvfp4_experts_mma as mma  # noqa: E402
from sass_util import sass_of  # noqa: E402 (scripts/ is on sys.path when this runs as a script)

TYPES = {"x_ptr": "*bf16", "ids_ptr": "*i64", "words_ptr": "*i32", "bytes_ptr": "*u8", "act_ptr": "*fp32",
         "part_ptr": "*fp32", "counters_ptr": "*i32",
         "xg_w": "*i32", "xg_s": "*u8", "xg_g": "*fp32", "xu_w": "*i32", "xu_s": "*u8", "xu_g": "*fp32"}
INTS = ("row_words", "gu_scale_at", "glob_at")


def compile_sm90(block_n: int, num_warps: int, num_stages: int, split: int, scale_in_a: bool = True,
                 pdl: bool = True, k_routed: int = 8, hidden: int = 2048, inter: int = 512):
    fn = mma.expert_gate_up_mma_kernel
    sig = {name: TYPES.get(name, "i32" if name in INTS else "constexpr") for name in fn.arg_names}
    consts = dict(K_ROUTED=k_routed, HAS_EXTRA=True, BLOCK_N=block_n, DECODE="asm", MASKED=inter % block_n != 0,
                  USE_GDC=pdl, H=hidden, I=inter, SCALE_IN_A=scale_in_a, SPLIT=split, FENCE=True,
                  STEP_K=mma.step_codes(hidden, split, scale_in_a))
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
             if sig[n].startswith("*") or n in ("gu_scale_at",)}
    return triton.compile(ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=num_warps, num_stages=num_stages))


CONFIGS = [(sp, a, bn, nw, 1) for sp in (4, 8, 2) for a in (True, False) for bn, nw in [(16, 1), (32, 1), (32, 2), (64, 4)]]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", help="write ttgir / ptx / sass per config here")
    args = ap.parse_args()
    print(f"{'split':>5} {'scale':>5} {'block_n':>7} {'warps':>5} {'stages':>6} {'regs':>4} {'stack':>5} {'smem':>6} "
          f"{'instrs':>6} {'MMA':>4} {'LDG':>4} {'LDS':>4} {'STS':>4} {'instr/code':>10}")
    for split, scale_in_a, block_n, num_warps, num_stages in CONFIGS:
        try:
            kernel = compile_sm90(block_n, num_warps, num_stages, split, scale_in_a)
        except Exception as exc:  # noqa: BLE001 (a config that does not compile: say why)
            print(f"{block_n:>7} {num_warps:>5} {num_stages:>6} failed: {str(exc).splitlines()[0][:100]}")
            continue
        path = os.path.join(args.dump or "/tmp", f"experts_mma_s{split}{'a' if scale_in_a else 'd'}{block_n}_"
                                                  f"{num_warps}_{num_stages}")
        # the K steps are unrolled: count the whole kernel against the codes a thread decodes in all of them
        body, usage, _ = sass_of(kernel, path, bool(args.dump))
        count = lambda op: sum(1 for ln in body if re.search(rf"\b{op}", ln))  # noqa: E731
        regs, stack = usage["REG"], usage["STACK"]
        codes = 2 * block_n * 2048 / split / (32 * num_warps)  # a program: 2 matrices, its K range of each row
        print(f"{split:>5} {'A' if scale_in_a else 'D':>5} {block_n:>7} {num_warps:>5} {num_stages:>6} {regs:>4} {stack:>5} "
              f"{kernel.metadata.shared:>6} {len(body):>6} {count('H?G?MMA'):>4} {count('LDG'):>4} "
              f"{count('LDS'):>4} {count('STS'):>4} {len(body) / codes:>10.2f}")


if __name__ == "__main__":
    main()
