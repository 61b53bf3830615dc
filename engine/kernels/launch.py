"""Programmatic dependent launch (PDL) for the fused decode step's Triton kernels.

Why: a decode step is ~500 small kernels; on sm_90+ a kernel launched with PDL is scheduled while the previous
one finishes, so its launch and block scheduling overlap that kernel's tail instead of following it. Each
kernel that can be launched so begins with `gdc_prologue(USE_GDC)`: griddepcontrol.wait (no global memory is
read or written before the previous kernel completed and its writes are visible: the order of every byte is
the plain launch's, so the results are the same bytes) then launch_dependents (the next kernel may be
scheduled). Kernels of other libraries in between (FlashInfer) launch plainly: full stream order around them.

The switch is per forward, not global: `programmatic_launch(on)` around the fused step (engines with and
without it can share a process, e.g. the bench's A/B arms); `pdl_launch(device)` gives the two launch
arguments. Only CUDA devices get it (not the CPU interpreter, which lacks the PTX).
"""
from __future__ import annotations

import contextlib
import contextvars

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

_PDL = contextvars.ContextVar("qwenlocal_pdl", default=False)


@contextlib.contextmanager
def programmatic_launch(on: bool):
    token = _PDL.set(bool(on))
    try:
        yield
    finally:
        _PDL.reset(token)


def pdl_launch(device: torch.device) -> dict:
    """Keyword arguments of a kernel launch: USE_GDC (the constexpr of gdc_prologue) and, when on, launch_pdl."""
    on = _PDL.get() and device.type == "cuda"
    return {"USE_GDC": True, "launch_pdl": True} if on else {"USE_GDC": False}


@triton.jit
def prefetch_l2(ptrs, ON: tl.constexpr):
    """Where ON, ask L2 for the lines at `ptrs` (a tensor of pointers, one per 128 B line), for bytes no kernel of
    the step writes (weights): before gdc_prologue with programmatic launch, they stream in while the previous
    kernel still runs; in a persistent loop, a later turn's rows stream while this one computes. A hint (no data
    moves into registers, nothing is ordered). Callers pass ON false in Triton's interpreter (no PTX there)."""
    if ON:
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                                  is_pure=False, pack=1)


@triton.jit
def gdc_prologue(USE_GDC: tl.constexpr):
    if USE_GDC:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def last_to_arrive(counter_ptr, programs, FENCE: tl.constexpr):
    """True in the one program of the launch that arrives here last, with every program's global writes before
    this call visible to it; that program sets the counter back to 0 for the next launch (a graph replay).
    Why: a launch's tail (the router's top-k over every program's logits) runs in the same launch, not in a
    one-program kernel of its own (~3.5 us of launch and latency each on the H200).
    The order: every thread fences its writes, the CTA meets at a barrier (so one thread's release carries them),
    one acq_rel atomic at GPU scope counts the arrival, and the last program fences again before it reads.
    counter_ptr: an int32 that is 0 between launches. FENCE: the PTX fences (false in Triton's interpreter,
    which runs the programs one after another and has no PTX)."""
    if FENCE:
        tl.inline_asm_elementwise("fence.acq_rel.gpu; mov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False,
                                  pack=1)
    tl.debug_barrier()
    arrived = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
    last = arrived == programs - 1
    if last:
        tl.atomic_xchg(counter_ptr, 0, sem="relaxed", scope="gpu")
        if FENCE:
            tl.inline_asm_elementwise("fence.acq_rel.gpu; mov.u32 $0, 0;", "=r", [], dtype=tl.int32,
                                      is_pure=False, pack=1)
    return last


def new_counter(device: torch.device, n: int = 1) -> torch.Tensor:
    """The arrival counters of last_to_arrive for one call site (n int32s, 0 between launches). Made before any
    capture (an eager or warm-up step), never inside one."""
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("a launch counter must be made before CUDA-graph capture (run one step eagerly)")
    return torch.zeros(n, device=device, dtype=torch.int32)


def resident_programs(device: torch.device, threads: int, regs_per_thread: int) -> int:
    """Programs of `threads` threads at `regs_per_thread` registers that the whole device holds at once (one
    wave): the SMs times min(threads, registers, blocks) per SM, from the device's own limits (an H200 SM takes
    2,048 threads, an Ada one 1,536). The interpreter (no device): 3 programs, so a persistent loop takes turns."""
    if device.type != "cuda":
        return 3
    key = (device.index or 0, threads, regs_per_thread)
    if key not in _RESIDENT:
        props = torch.cuda.get_device_properties(device)
        per_sm = min(32, getattr(props, "max_threads_per_multi_processor", 2048) // threads,
                     getattr(props, "regs_per_multiprocessor", 65536) // (regs_per_thread * threads))
        _RESIDENT[key] = props.multi_processor_count * max(1, per_sm)
    return _RESIDENT[key]


_RESIDENT: dict[tuple[int, int, int], int] = {}

