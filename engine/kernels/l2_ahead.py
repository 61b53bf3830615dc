"""Ask L2 for a later kernel's weight bytes while the kernels before it run (a hint: no byte moves to registers,
nothing is ordered, no result changes).

Why: the batch-1 decode step is a chain of kernels of which many are latency-bound (norms, the router's top-k, the
experts' 14 MB at a quarter of HBM speed), so HBM idles while they run; the next layer's projection (GDN in_proj:
24 MB of FP8) then streams from HBM on the critical path. Launched on a side stream of the step (captured into
its CUDA graph beside the main chain), this kernel lets those bytes arrive in the H200's 50 MB L2 ahead of use.

One launch covers up to four byte ranges (a layer's projection tensors): every program walks every range with
the grid's stride, one 128-byte line (or one bulk chunk) per thread a turn. MODE:
  0  prefetch.global.L2            a line a thread
  1  prefetch.global.L2::evict_last a line a thread, kept over streamed lines when L2 is full
  2  cp.async.bulk.prefetch.L2     CHUNK bytes a thread (sm_90+: the TMA unit walks the chunk)
Only CUDA devices run it (Triton's interpreter has no PTX): the wrappers return without a launch elsewhere.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

LINE = 128
MODES = {"line": 0, "evict_last": 1, "bulk": 2}


@triton.jit
def _ask(ptrs, sizes, MODE: tl.constexpr):
    if MODE == 0:
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                                  is_pure=False, pack=1)
    elif MODE == 1:
        tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1]; mov.u32 $0, 0;", "=r,l", [ptrs],
                                  dtype=tl.int32, is_pure=False, pack=1)
    else:
        tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0;", "=r,l,r",
                                  [ptrs, sizes], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _range(base, nbytes, pid, grid, MODE: tl.constexpr, STEP: tl.constexpr, BLOCK: tl.constexpr):
    """Every STEP-byte piece of [base, base + nbytes) that program pid's turns reach, BLOCK pieces a turn."""
    lane = tl.arange(0, BLOCK).to(tl.int64) * STEP
    for start in range(pid * BLOCK * STEP, nbytes, grid * BLOCK * STEP):
        offs = start + lane
        inside = offs < nbytes
        # A piece past the end asks for the range's first piece again (harmless; no predicate in the asm).
        offs = tl.where(inside, offs, 0)
        sizes = tl.where(inside, tl.minimum(nbytes - offs, STEP), STEP).to(tl.int32)
        _ask(base + offs, sizes, MODE)


@triton.jit
def l2_ahead_kernel(p0, p1, p2, p3, n0, n1, n2, n3, RANGES: tl.constexpr, MODE: tl.constexpr, STEP: tl.constexpr,
                    BLOCK: tl.constexpr):
    pid, grid = tl.program_id(0), tl.num_programs(0)
    _range(p0, n0, pid, grid, MODE, STEP, BLOCK)
    if RANGES > 1:
        _range(p1, n1, pid, grid, MODE, STEP, BLOCK)
    if RANGES > 2:
        _range(p2, n2, pid, grid, MODE, STEP, BLOCK)
    if RANGES > 3:
        _range(p3, n3, pid, grid, MODE, STEP, BLOCK)


def byte_view(t: torch.Tensor) -> torch.Tensor:
    """t's storage as bytes (contiguous tensors only: a strided one would name bytes it does not use)."""
    if not t.is_contiguous():
        raise ValueError("l2_ahead takes contiguous tensors")
    return t.reshape(-1).view(torch.uint8)


def l2_ahead(tensors: list[torch.Tensor], programs: int = 32, mode: str = "line", chunk: int = 4096,
             num_warps: int = 4) -> None:
    """Ask L2 for the bytes of up to four contiguous tensors (one launch). A no-op off CUDA. chunk: bytes a
    thread asks for at once in the bulk mode (a multiple of 16)."""
    if not tensors or tensors[0].device.type != "cuda":
        return
    if len(tensors) > 4:
        raise ValueError("l2_ahead takes at most four tensors a launch")
    if mode not in MODES:
        raise ValueError(f"unknown l2_ahead mode {mode!r} (known: {', '.join(MODES)})")
    step = chunk if mode == "bulk" else LINE
    if step % 16:
        raise ValueError("the bulk chunk must be a multiple of 16 bytes")
    views = [byte_view(t) for t in tensors]
    if mode == "bulk" and any(v.data_ptr() % 16 or v.numel() % 16 for v in views):
        raise ValueError("the bulk prefetch needs 16-byte aligned tensors of whole 16-byte units")
    pad = views + [views[0]] * (4 - len(views))
    l2_ahead_kernel[(programs,)](*pad, *(v.numel() for v in pad), RANGES=len(views), MODE=MODES[mode],
                                 STEP=step, BLOCK=32 * num_warps, num_warps=num_warps)
