#!/usr/bin/env python3
"""Compile the step's MoE down launch (kernels/nvfp4_experts_parts.expert_down_parts_kernel: 8 routed experts +
the shared one with its gate scale, H 2048, I 512, 16 rows and 2 warps a program, the tile-sums tail, PDL) for
sm_90 WITHOUT a GPU (Triton's bundled ptxas; use the H200's Triton, scripts/sass_util.py says how), on the row
path, on the group path (nvfp4_experts_parts.GROUPS), the group path routing itself (ROUTE) and with its rows
loaded before the wait (PRELOAD), and print registers, spill stack, SASS instructions,
IDP-free counts of shuffles / shared-memory stores / barriers and instructions a weight code (straight-line
code: the whole count over the 16 x 512 / 64 codes a thread handles; the tail's share runs in one program of
nine). A check of how much work a thread does, not a timing.

    PYTHONPATH=/tmp/tri36 python scripts/sass_down_groups.py [--dump DIR]
"""
from __future__ import annotations

import argparse
import os
import re

os.environ.pop("TRITON_INTERPRET", None)  # noqa: E402 (compile for the GPU, not the interpreter)
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from qwenlocal.engine.kernels import nvfp4_experts_parts as ep  # noqa: E402
from sass_util import sass_of  # noqa: E402 (scripts/ is on sys.path when this runs as a script)

H, I, BLOCK_M, WARPS = 2048, 512, 16, 2
TYPES = {"act_ptr": "*fp32", "wts_ptr": "*bf16", "ids_ptr": "*i64", "words_ptr": "*i32", "bytes_ptr": "*u8",
         "parts_ptr": "*fp32", "H": "i32", "I": "i32", "row_words": "i32", "dn_at": "i32", "dn_scale_at": "i32",
         "glob_at": "i32", "xd_w": "*i32", "xd_s": "*u8", "xd_g": "*fp32", "extra_scale_ptr": "*fp32",
         "addend_ptr": "*fp32", "x_ptr": "*bf16", "norm_w_ptr": "*bf16", "new_x_out_ptr": "*i16",
         "new_x_ptr": "*bf16", "norm_ptr": "*fp32", "counters_ptr": "*i32", "eps": "fp32"}


def compile_down_sm90(groups: bool, route: bool = False, preload: bool = False):
    """The step's down launch (TILE_SUMS tail) for sm_90, on the group path or the row path; route: its programs
    routing themselves before the wait (ROUTE); preload: their rows loaded before it too (PRELOAD)."""
    fn = ep.expert_down_parts_kernel
    types = dict(TYPES, logits_ptr="*bf16", E="i32") if route else TYPES
    sig = {name: types.get(name, "constexpr") for name in fn.arg_names}
    consts = dict(K_ROUTED=8, HAS_EXTRA=True, HAS_EXTRA_SCALE=True, HAS_ADDEND=False, BLOCK_M=BLOCK_M,
                  BLOCK_G=I // 16, MASKED=False, DECODE="asm", X_SPLIT=True, GROUP_SCALES=True, USE_GDC=True,
                  PERSISTENT=False, NORM_TAIL=True, ROUND=1, BLOCK_H=16, FENCE=True, TILE_SUMS=True, GROUPS=groups,
                  EARLY_ROUTE=int(route), BLOCK_E=256 if route else 32, PRELOAD=preload,
                  **({} if route else dict(E=0, logits_ptr=None)))
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
             if sig[n].startswith("*") or n in ("H", "I", "dn_at", "dn_scale_at")}
    return triton.compile(ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=WARPS))


def counts(kernel, path: str, dump: bool) -> dict:
    """registers, stack, instructions, and the cross-lane / shared-memory / barrier counts of a compiled launch."""
    body, usage, _ = sass_of(kernel, path, dump)
    count = lambda op: sum(1 for t in body if re.search(rf"\b{op}", t))  # noqa: E731
    return dict(reg=usage["REG"], stack=usage["STACK"], n=len(body), shfl=count("SHFL"), sts=count("STS"),
                lds=count("LDS"), bar=count("BAR"), ldg=count("LDG"),
                per_code=len(body) / (BLOCK_M * I / (32 * WARPS)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", help="write ttgir / ptx / sass per path here")
    args = ap.parse_args()
    if args.dump:
        os.makedirs(args.dump, exist_ok=True)
    print(f"{'path':7} {'regs':>4} {'stack':>5} {'instrs':>6} {'LDG':>4} {'SHFL':>4} {'STS':>4} {'LDS':>4} {'BAR':>4} "
          f"{'instr/code':>10}")
    for name, groups, route, preload in (("rows", False, False, False), ("groups", True, False, False),
                                         ("route", True, True, False), ("preload", True, True, True)):
        c = counts(compile_down_sm90(groups, route, preload), os.path.join(args.dump or "/tmp", f"down_{name}"),
                   bool(args.dump))
        print(f"{name:7} {c['reg']:>4} {c['stack']:>5} {c['n']:>6} {c['ldg']:>4} "
              f"{c['shfl']:>4} {c['sts']:>4} {c['lds']:>4} {c['bar']:>4} {c['per_code']:>10.2f}")


if __name__ == "__main__":
    main()
