#!/usr/bin/env python3
"""Compile the NVFP4 GEMV on the integer tensor cores (kernels/nvfp4_mma.gemv_mma_kernel) for sm_90 WITHOUT a GPU
(Triton's bundled ptxas; use the H200's Triton, scripts/sass_util.py says how) at the step's K (2048: the LM head,
the experts' gate/up; 512: their down) and print registers, spill stack, SASS instructions, the MMA / PRMT / LDG
counts and instructions a weight code (straight-line: the count over the codes a lane handles), and the layout
Triton gave the tile's PTX blocks (one element a thread, or the blocks run more than once a lane).
A check of how much work a thread does, not a timing; gemv_multi's NVFP4 LM head is 5.8 a code, the integer
dots 3.0-3.8 (docs/RESULTS.md sessions 17-25).

    PYTHONPATH=/tmp/tri36 python scripts/sass_nvfp4_mma.py [--dump DIR]
"""
from __future__ import annotations

import argparse
import os
import re
import tempfile

os.environ.pop("TRITON_INTERPRET", None)  # noqa: E402 (compile for the GPU, not the interpreter)
# a fresh cache: a kernel found in a cache carries no TTGIR (the layout check reads it)
os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="sass_nvfp4_mma_")
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from qwenlocal.engine.kernels import nvfp4_mma as nm  # noqa: E402
from qwenlocal.engine.kernels import nvfp4_mma_experts as nme  # noqa: E402
from sass_util import sass_of  # noqa: E402 (scripts/ is on sys.path when this runs as a script)

TYPES = {"w_ptr": "*i32", "s_ptr": "*u8", "g_ptr": "*fp32", "hl_ptr": "*i8", "xs_ptr": "*fp32", "zeros_ptr": "*i8",
         "tables_ptr": "*i32", "out_ptr": "*fp32", "N": "i32"}


def compile_gemv_sm90(k: int, pdl: bool = True, pairs: bool = False):
    """gemv_mma_kernel at K = k as gemv_mma launches it (fp32 out, PDL); pairs: nvfp4_mma.PAIRS' layout."""
    fn = nm.gemv_mma_kernel
    sig = {name: TYPES.get(name, "constexpr") for name in fn.arg_names}
    consts = dict(K=k, G=nm.steps_groups(k), DECODE="asm", OUT_BF16=False, USE_GDC=pdl, PAIRS=pairs, W=1)
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names) if sig[n].startswith("*")}
    return triton.compile(ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=1, enable_fp_fusion=False))


EXPERT_TYPES = {"hl_ptr": "*i8", "xs_ptr": "*fp32", "zeros_ptr": "*i8", "tables_ptr": "*i32", "ids_ptr": "*i64",
                "words_ptr": "*i32", "bytes_ptr": "*u8", "act_ptr": "*fp32", "xg_w": "*i32", "xg_s": "*u8",
                "xg_g": "*fp32", "xu_w": "*i32", "xu_s": "*u8", "xu_g": "*fp32", "I": "i32", "row_words": "i32",
                "gu_scale_at": "i32", "glob_at": "i32", "logits_ptr": "*bf16", "E": "i32", "wts_out_ptr": "*i16",
                "ids_out_ptr": "*i64", "shared_out_ptr": "*fp32"}


def compile_experts_sm90(warps: int, route: bool = True, pairs: bool = False):
    """expert_gate_up_mma_kernel as the step launches it (8 routed + the shared expert, H 2048; routing itself
    from 256 experts' bf16 logits)."""
    fn = nme.expert_gate_up_mma_kernel
    sig = {name: EXPERT_TYPES.get(name, "constexpr") for name in fn.arg_names}
    consts = dict(H=2048, K_ROUTED=8, HAS_EXTRA=True, G=nm.steps_groups(2048, warps), W=warps, DECODE="asm",
                  USE_GDC=True, PAIRS=pairs)
    if route:  # as expert_gate_up_mma launches it for 256 experts, top-8: every warp finds its rank alone
        consts.update(ROUTE=1, BLOCK_E=256, KP=8, F16=False, W_BF16=True, WARP_ROUTE=True)
    else:
        for name in ("logits_ptr", "E", "wts_out_ptr", "ids_out_ptr", "shared_out_ptr"):
            sig[name] = "constexpr"
        consts.update(logits_ptr=None, E=0, wts_out_ptr=None, ids_out_ptr=None, shared_out_ptr=None, ROUTE=0,
                      BLOCK_E=32, KP=1, F16=False, W_BF16=True)
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
             if sig[n].startswith("*") or n in ("I", "gu_scale_at") or (n == "E" and route)}
    return triton.compile(ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=warps, enable_fp_fusion=False))


def figures(kernel, name: str, dump: str | None, codes: int) -> dict:
    """A compiled kernel's registers, spill stack, SASS instructions, IMMA / PRMT / LDG counts, instructions over
    the `codes` a thread handles, and the layouts of its PTX blocks."""
    ins, usage, _ = sass_of(kernel, os.path.join(dump or "/tmp", name), bool(dump))
    ops = lambda op: sum(1 for i in ins if re.match(rf"(@!?P\d+\s+)?{op}\b", i))  # noqa: E731
    return dict(regs=usage["REG"], stack=usage["STACK"], instrs=len(ins), mma=ops("IMMA"), prmt=ops("PRMT"),
                ldg=ops("LDG"), per_code=len(ins) / codes, layouts=asm_layouts(kernel.asm["ttgir"]))


def count_experts(warps: int, dump: str | None, route: bool = True, pairs: bool = False) -> dict:
    kernel = compile_experts_sm90(warps, route, pairs)
    # the tile's 16 rows of 2048 codes over the program's threads
    return dict(W=warps, route=route, pairs=pairs, **figures(
        kernel, f"nvfp4_mma_experts_{warps}_{int(route)}_{int(pairs)}", dump, 16 * 2048 // (32 * warps)))


def asm_layouts(ttgir: str) -> list[str]:
    """The layouts of the tile's inline PTX blocks' results (tt.elementwise_inline_asm), by their encodings."""
    encodings = dict(re.findall(r"^(#\w+) = (#ttg\.\w+<.*>)$", ttgir, flags=re.M))
    used = re.findall(r"tt\.elementwise_inline_asm.*?-> .*?tensor<\d+x\w+, (#\w+)>", ttgir)
    return sorted({encodings.get(u, u) for u in used})


def count(k: int, dump: str | None, pairs: bool = False) -> dict:
    kernel = compile_gemv_sm90(k, pairs=pairs)
    # the tile's 16 rows of K codes over the warp's 32 lanes
    return dict(K=k, pairs=pairs, **figures(kernel, f"nvfp4_mma_{k}_{int(pairs)}", dump, 16 * k // 32))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", help="write ttgir / ptx / sass here")
    args = ap.parse_args()
    if args.dump:
        os.makedirs(args.dump, exist_ok=True)
    print(f"{'K':>5} {'pairs':>5} {'regs':>4} {'stack':>5} {'instrs':>6} {'IMMA':>4} {'PRMT':>5} {'LDG':>4} "
          f"{'a code':>7}  layout")
    for k, pairs in ((2048, False), (2048, True), (512, False), (512, True)):
        c = count(k, args.dump, pairs)
        print(f"{c['K']:>5} {str(pairs):>5} {c['regs']:>4} {c['stack']:>5} {c['instrs']:>6} {c['mma']:>4} "
              f"{c['prmt']:>5} {c['ldg']:>4} {c['per_code']:>7.2f}  {'; '.join(c['layouts'])}")
    print("\nthe experts' gate/up (nvfp4_mma_experts; 8 routed + the shared expert, H 2048, I 512), W warps a "
          "program, routing itself or not")
    print(f"{'W':>3} {'route':>5} {'pairs':>5} {'regs':>4} {'stack':>5} {'instrs':>6} {'IMMA':>4} {'PRMT':>5} "
          f"{'LDG':>4} {'a code':>7}  layout")
    for warps, route, pairs in ((1, True, False), (1, False, False), (2, True, False), (2, False, False),
                                (4, True, False), (4, False, False), (4, True, True), (2, True, True)):
        c = count_experts(warps, args.dump, route, pairs)
        print(f"{c['W']:>3} {str(c['route']):>5} {str(pairs):>5} {c['regs']:>4} {c['stack']:>5} {c['instrs']:>6} "
              f"{c['mma']:>4} {c['prmt']:>5} {c['ldg']:>4} {c['per_code']:>7.2f}  {'; '.join(c['layouts'])}")


if __name__ == "__main__":
    main()
