#!/usr/bin/env python3
"""Compile gemv_multi_kernel for sm_90 WITHOUT a GPU (Triton's bundled ptxas) and print, per decode shape and
choose_config's config: registers, spill stack, shared memory, SASS instructions, 16 B loads, layout conversions.
A check that the kernel compiles for the H200 and how much work a thread does, not a timing.

    PYTHONPATH=/tmp/tri36 python scripts/sass_gemv_multi.py [--dump DIR] [--persistent] [--pdl] [--fp8-cvt]
        [--norm] [--fp8-mma [--mma-step]]  # --fp8-mma: FP8 on the tensor cores where choose_config takes it (gemv_multi.FP8_MMA)   # DIR: ttgir / ptx / sass per shape; /tmp/tri36: the H200's Triton (sass_util.py)
"""
from __future__ import annotations

import argparse
import os
import re

os.environ.pop("TRITON_INTERPRET", None)  # noqa: E402 (compile for the GPU, not the interpreter)
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from bench_gemv_multi import GROUPS  # noqa: E402 (scripts/ is on sys.path when this runs as a script)
from sass_util import loop_instructions, sass_of  # noqa: E402
from qwenlocal.engine.kernels import gemv_mixed  # noqa: E402
from qwenlocal.engine.kernels import gemv_multi as gm  # noqa: E402

WORD = {"dense": "*bf16", "fp8": "*i32", "nvfp4": "*i64"}
SCALE = {"dense": "*bf16", "fp8": "*fp32", "nvfp4": "*u8"}
GLOBAL = {"dense": "*bf16", "fp8": "*fp32", "nvfp4": "*fp32"}


def compile_mixed_sm90(cfg_a: gm.GemvConfig, cfg_b: gm.GemvConfig, k: int = 2048, norm: bool = True,
                       prefetch: bool = False):
    """gemv_mixed_kernel as the GDN in_proj launches it (FP8 qkv + z, the codes as float8 elements; bf16 b + a;
    PDL), with cfg_a's tile (the tensor cores' where cfg_a.mma) and, with prefetch, the rows asked of L2 first."""
    fn = gemv_mixed.gemv_mixed_kernel
    ptrs = {"x_ptr": "*bf16", "out_ptr": "*i16", "a0": "*fp8e4nv", "a1": "*fp8e4nv", "sa0": "*fp32", "sa1": "*fp32",
            "ga0": "*fp32", "ga1": "*fp32", "b0": "*bf16", "b1": "*bf16", "sb0": "*bf16", "sb1": "*bf16",
            "gb0": "*bf16", "gb1": "*bf16", "sums_ptr": "*fp32", "nw_ptr": "*bf16"}
    ints = ("na0", "na1", "pa1", "nb0", "nb1", "pb1", "tiles_b", "rows_a", "sum_tiles")
    sig = {n: ptrs.get(n, "i32" if n in ints else "fp32" if n == "eps" else "constexpr") for n in fn.arg_names}
    consts = dict(K=k, OUT_BF16=True, FMT_A=1, PARTS_A=2, BLOCK_N_A=cfg_a.block_n, BLOCK_K_A=cfg_a.block_k,
                  CHUNK_A=gm.chunk_words("fp8", cfg_a, 2, True), FP8_CVT_A=True, FMT_B=0, PARTS_B=2,
                  BLOCK_N_B=cfg_b.block_n, BLOCK_K_B=cfg_b.block_k, CHUNK_B=gm.chunk_words("dense", cfg_b, 2),
                  FP8_CVT_B=False, USE_GDC=True, NORM=norm, ROUND=1 if norm else 0, BLOCK_T=128 if norm else 1,
                  MMA_A=cfg_a.mma, MMA_B=False, PREFETCH=prefetch)
    return _compile(fn, sig, consts, norm, cfg_a)


def compile_sm90(fmt: str, parts: int, k: int, cfg: gm.GemvConfig, persistent: bool = False, pdl: bool = False,
                 fp8_cvt: bool = False, norm: bool = False, prefetch: bool = False):
    fn = gm.gemv_multi_kernel
    cvt = (fp8_cvt or bool(cfg.mma)) and fmt == "fp8"
    sig = {}
    for name in fn.arg_names:
        kind = name.rstrip("0123456789")
        word = "*fp8e4nv" if cvt else WORD[fmt]
        sig[name] = {"x_ptr": "*bf16", "out_ptr": "*i16", "w": word, "s": SCALE[fmt], "g": GLOBAL[fmt],
                     "n": "i32", "p": "i32", "tiles": "i32", "sums_ptr": "*fp32", "nw_ptr": "*bf16",
                     "sum_tiles": "i32", "eps": "fp32"}.get(kind if kind in "wsgnp" else name, "constexpr")
    consts = dict(K=k, FMT=gm._FMT_ID[fmt], PARTS=parts, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                  CHUNK=gm.chunk_words(fmt, cfg, fp8_cvt=cvt), OUT_BF16=True, USE_GDC=pdl, PERSISTENT=persistent,
                  L2_AHEAD=gm.L2_AHEAD if persistent else 0, FP8_CVT=cvt, NORM=norm, ROUND=1 if norm else 0,
                  BLOCK_T=128 if norm else 1, MMA=cfg.mma, PREFETCH=prefetch)
    return _compile(fn, sig, consts, norm, cfg)


def _compile(fn, sig: dict, consts: dict, norm: bool, cfg: gm.GemvConfig):
    """fn for sm_90 with its pointers 16-byte aligned, cfg's warps and stages; without norm its norm arguments
    are constexpr Nones (the launch passes none)."""
    if not norm:
        for name in ("sums_ptr", "nw_ptr", "sum_tiles", "eps"):
            sig[name] = "constexpr"
            consts[name] = None if name.endswith("ptr") else 0
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names) if sig[n].startswith("*")}
    return triton.compile(ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", help="write ttgir / ptx / sass per shape here")
    ap.add_argument("--persistent", action="store_true", help="the persistent kernel (gemv_multi.PERSISTENT)")
    ap.add_argument("--pdl", action="store_true", help="with programmatic launch (USE_GDC)")
    ap.add_argument("--fp8-cvt", action="store_true", help="FP8 through the hardware conversion (gemv_multi.FP8_CVT)")
    ap.add_argument("--norm", action="store_true", help="x RMS-normed as it is loaded (norm=, TILE_SUMS' GEMVs)")
    ap.add_argument("--fp8-mma", action="store_true", help="FP8 tiles on the tensor cores (gemv_multi.FP8_MMA)")
    ap.add_argument("--mma-step", action="store_true",
                    help="with --fp8-mma: x's split scaled a K step (gemv_multi.MMA_STEP_SCALE)")
    args = ap.parse_args()
    if args.dump:
        os.makedirs(args.dump, exist_ok=True)
    print(f"{'group':20} {'config':58} {'regs':>4} {'stack':>5} {'smem':>5} {'instrs':>6} {'LDG.128':>7} "
          f"{'cvt':>3} {'instr/code':>10}")
    for name, fmt, shapes, _ in GROUPS:
        k, n_total = shapes[0][1], sum(n for n, _ in shapes)
        cfg = gm.choose_config(fmt, n_total, k, fp8_mma=args.fp8_mma, step_scale=args.mma_step)
        kernel = compile_sm90(fmt, len(shapes), k, cfg, args.persistent, args.pdl, args.fp8_cvt, args.norm)
        stem = re.sub(r"\W+", "_", name)
        path = os.path.join(args.dump or "/tmp", f"gemv_multi_{stem}")
        lines, usage, sass = sass_of(kernel, path, bool(args.dump))
        instrs = loop_instructions(sass, k // cfg.block_k)
        codes = cfg.block_n * k // (32 * cfg.num_warps)  # weight elements a thread decodes
        regs, stack = usage["REG"], usage["STACK"]
        print(f"{name:20} {str(config_dict(cfg)):58} {regs:>4} {stack:>5} {kernel.metadata.shared:5} {instrs:6} "
              f"{sass.count('LDG.E.128'):7} {kernel.asm['ttgir'].count('convert_layout'):3} {instrs / codes:10.2f}")


def config_dict(cfg) -> dict:
    return dict(block_n=cfg.block_n, block_k=cfg.block_k, num_warps=cfg.num_warps, warps_k=cfg.warps_k,
                **({"mma": cfg.mma, "num_stages": cfg.num_stages} if cfg.mma else {}))


if __name__ == "__main__":
    main()
