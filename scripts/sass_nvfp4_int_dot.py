#!/usr/bin/env python3
"""Compile the integer-dot NVFP4 GEMV (kernels/nvfp4_int_dot.gemv_int_kernel) and the experts' gate/up in the same
form (kernels/nvfp4_int_experts, 8 routed + the shared expert, I 512) for sm_90 WITHOUT a GPU (Triton's bundled
ptxas; use the H200's Triton, scripts/sass_util.py says how) at K = 2048 and print, per launch config: registers, spill stack, SASS instructions, PRMT / IDP (dp2a) / LDG
counts and instructions a weight code (the kernel is straight-line: its count over the codes a thread handles);
the experts' launch also on nvfp4_int_groups' path (nvfp4_int_experts.GROUPS), routing itself or not.
A check of how much work a thread does, not a timing; gemv_multi's NVFP4 LM head is 5.8 a code, expert_gate_up
9.4 (docs/RESULTS.md session 17).

    PYTHONPATH=/tmp/tri36 python scripts/sass_nvfp4_int_dot.py [--dump DIR] [--experts-only]
"""
from __future__ import annotations

import argparse
import os
import re

os.environ.pop("TRITON_INTERPRET", None)  # noqa: E402 (compile for the GPU, not the interpreter)
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from qwenlocal.engine.kernels import nvfp4_int_dot as nid  # noqa: E402
from qwenlocal.engine.kernels import nvfp4_int_experts as nie  # noqa: E402
from sass_util import sass_of  # noqa: E402 (scripts/ is on sys.path when this runs as a script)

K = 2048
TYPES = {"w_ptr": "*i32", "s_ptr": "*u8", "g_ptr": "*fp32", "pairs_ptr": "*i32", "xs_ptr": "*fp32", "tables_ptr": "*i32",
         "out_ptr": "*bf16", "N": "i32"}
CONFIGS = [(4, 1), (4, 2), (2, 1), (16, 4), (8, 4), (32, 4), (16, 8), (32, 8), (8, 2), (8, 1)]  # (block_n, warps)
EXPERT_TYPES = {"pairs_ptr": "*i32", "xs_ptr": "*fp32", "tables_ptr": "*i32", "ids_ptr": "*i64", "words_ptr": "*i32",
                "bytes_ptr": "*u8", "act_ptr": "*fp32", "xg_w": "*i32", "xg_s": "*u8", "xg_g": "*fp32",
                "xu_w": "*i32", "xu_s": "*u8", "xu_g": "*fp32", "dn_at": "i32", "dn_bytes": "i32"}
EXPERT_CONFIGS = [(2, 1), (4, 1), (1, 1), (2, 2), (4, 2), (8, 4)]  # expert_gate_up's default: 2 rows x 4 warps


ROUTE_TYPES = {"logits_ptr": "*bf16", "E": "i32", "wts_out_ptr": "*i16", "ids_out_ptr": "*i64",
               "shared_out_ptr": "*fp32"}


def compile_experts_sm90(block_n: int, num_warps: int, route: bool = False, groups: bool = False,
                         maxnreg: int | None = None):
    """expert_gate_up_int as the step launches it (8 routed + the shared expert); route: its programs routing
    themselves from 256 experts' bf16 logits (nvfp4_int_experts.ROUTE); groups: its dots through
    nvfp4_int_groups (nvfp4_int_experts.GROUPS); maxnreg: a register cap (None: the launch's own)."""
    fn = nie.expert_gate_up_int_kernel
    sig = {name: EXPERT_TYPES.get(name, "constexpr") for name in fn.arg_names}
    for name in ("I", "row_words", "gu_scale_at", "glob_at"):
        sig[name] = "i32"
    consts = dict(H=K, K_ROUTED=8, HAS_EXTRA=True, BLOCK_N=block_n, BLOCK_G=K // 16, DECODE="asm", USE_GDC=True,
                  DOWN_LINES=0, GROUPS=groups)
    if route:
        sig.update(ROUTE_TYPES)
        consts.update(ROUTE=1, BLOCK_E=256, KP=8, F16=False, W_BF16=True)
    else:
        consts.update({name: None for name in ROUTE_TYPES if name != "E"}, E=0, ROUTE=0, BLOCK_E=32, KP=1, F16=False,
                      W_BF16=True)
    # E (256) as the JIT specializes it: divisible by 16, so the logits' masked loads vectorize
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
             if sig[n].startswith("*") or n in ("I", "gu_scale_at") or (n == "E" and route)}
    options = dict(num_warps=num_warps)
    if groups and block_n == 1:  # as expert_gate_up_int launches it
        options["maxnreg"] = nie.GROUPS_MAXNREG
    if maxnreg:
        options["maxnreg"] = maxnreg
    return triton.compile(ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 32), options=options)


def compile_sm90(block_n: int, num_warps: int):
    fn = nid.gemv_int_kernel
    sig = {name: TYPES.get(name, "constexpr") for name in fn.arg_names}
    consts = dict(K=K, BLOCK_N=block_n, BLOCK_G=K // 16, DECODE="asm", OUT_BF16=True)
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names) if sig[n].startswith("*")}
    return triton.compile(ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=num_warps))


def print_row(kernel, first: int, num_warps: int, codes_a_warp: float, path: str, dump: bool) -> None:
    """One table row: (first column, warps), registers, stack, instructions, PRMT / IDP / LDG / SHFL counts and
    instructions a code (codes_a_warp: the weight codes one warp's thread handles, times 32)."""
    body, usage, _ = sass_of(kernel, path, dump)
    count = lambda op: sum(1 for ln in body if re.search(rf"\b{op}", ln))  # noqa: E731
    print(f"{first:>7} {num_warps:>5} {usage['REG']:>4} {usage['STACK']:>5} {len(body):>6} {count('PRMT'):>5} "
          f"{count('IDP'):>5} {count('LDG'):>4} {count('SHFL'):>4} {len(body) / (codes_a_warp / num_warps):>10.2f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", help="write ttgir / ptx / sass per config here")
    ap.add_argument("--experts-only", action="store_true", help="leave out the plain GEMV's configs")
    args = ap.parse_args()
    out = lambda name: os.path.join(args.dump or "/tmp", name)  # noqa: E731
    print(f"{'block_n':>7} {'warps':>5} {'regs':>4} {'stack':>5} {'instrs':>6} {'PRMT':>5} {'IDP':>5} {'LDG':>4} "
          f"{'SHFL':>4} {'instr/code':>10}")
    for block_n, num_warps in [] if args.experts_only else CONFIGS:
        print_row(compile_sm90(block_n, num_warps), block_n, num_warps, block_n * K / 32,
                  out(f"nvfp4_int_dot_{block_n}_{num_warps}"), bool(args.dump))
    print("\nexperts' gate/up (gate and up rows of a program; expert_gate_up at 2 x 4: 9.4 a code)")
    for block_n, num_warps in EXPERT_CONFIGS:
        print_row(compile_experts_sm90(block_n, num_warps), block_n, num_warps, 2 * block_n * K / 32,
                  out(f"nvfp4_int_experts_{block_n}_{num_warps}"), bool(args.dump))
    print("\nthe same, its programs routing themselves (ROUTE: rank j of 256 bf16 logits, j rounds; program (0, 0) "
          "also stores route_topk's outputs)")
    for block_n, num_warps in EXPERT_CONFIGS[2:3]:
        print_row(compile_experts_sm90(block_n, num_warps, route=True), block_n, num_warps, 2 * block_n * K / 32,
                  out(f"nvfp4_int_experts_route_{block_n}_{num_warps}"), bool(args.dump))
    print("\nthe group path (nvfp4_int_experts.GROUPS: a thread's 16-code groups its own, one PTX block a group), "
          "without and with ROUTE")
    for block_n, num_warps in EXPERT_CONFIGS:
        print_row(compile_experts_sm90(block_n, num_warps, groups=True), block_n, num_warps, 2 * block_n * K / 32,
                  out(f"nvfp4_int_experts_groups_{block_n}_{num_warps}"), bool(args.dump))
    for block_n, num_warps in EXPERT_CONFIGS[2:3]:
        print_row(compile_experts_sm90(block_n, num_warps, route=True, groups=True), block_n, num_warps,
                  2 * block_n * K / 32, out(f"nvfp4_int_experts_groups_route_{block_n}_{num_warps}"), bool(args.dump))
    print("\nthe group path routing itself at 2 and 4 rows a program (profile_decode's gubn), at one warp, as launched "
          f"and capped at {nie.GROUPS_MAXNREG} registers (a stack is spilled registers)")
    for block_n in (2, 4):
        for cap in (None, nie.GROUPS_MAXNREG):
            print_row(compile_experts_sm90(block_n, 1, route=True, groups=True, maxnreg=cap), block_n, 1,
                      2 * block_n * K / 32, out(f"nvfp4_int_experts_groups_route_{block_n}_cap{cap}"), bool(args.dump))


if __name__ == "__main__":
    main()
