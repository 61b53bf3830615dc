"""Timed transfers on the GPU: pinned and pageable H2D/D2H, both directions at once, the decode-step expert
gather, and whether an H2D copy runs under compute. CUDA events for stream work, wall clock for pageable copies.

Every function takes the device index and returns plain numbers; measure.py turns them into facts.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

MIB = 2**20
EXPERT_BYTES = 1_781_760  # one NVFP4 expert in the bank layout (seeds: 28 of these miss per decode step)
GATHER_COPIES = 28


@dataclass(frozen=True)
class Depth:
    """How hard to measure. quick: the default probe (a few seconds); full: `--full`."""

    sizes: tuple[int, ...]  # bytes per copy; the figures come from the largest
    reps: int  # timed copies per figure (after one warm-up)
    pageable_reps: int
    overlap_reps: int


QUICK = Depth(sizes=(256 * MIB,), reps=5, pageable_reps=3, overlap_reps=3)
FULL = Depth(sizes=(16 * MIB, 64 * MIB, 256 * MIB, 1024 * MIB), reps=15, pageable_reps=5, overlap_reps=7)


def median(values: list[float]) -> float:
    return float(statistics.median(values))


def gbps(nbytes: int, ms: float) -> float:
    return nbytes / (ms * 1e6) if ms > 0 else float("inf")


def _events_ms(torch, fn, reps: int, warmup: int = 1) -> list[float]:
    out = []
    for i in range(warmup + reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        if i >= warmup:
            out.append(start.elapsed_time(end))
    return out


def _wall_ms(torch, fn, reps: int, warmup: int = 1) -> list[float]:
    out = []
    for i in range(warmup + reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        if i >= warmup:
            out.append((time.perf_counter() - t0) * 1e3)
    return out


def fit_size(want: int, vram_free: int | None) -> int:
    """Shrink a copy size so that a few buffers of it fit comfortably in free VRAM."""
    if vram_free:
        want = min(want, max(16 * MIB, (vram_free // 8) // MIB * MIB))
    return want


def pinned(index: int, nbytes: int, reps: int) -> dict[str, float]:
    """Pinned H2D and D2H, and both at once on two streams: median ms and GB/s."""
    import torch

    dev = torch.device("cuda", index)
    with torch.cuda.device(index):
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        host2 = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        gpu = torch.empty(nbytes, dtype=torch.uint8, device=dev)
        gpu2 = torch.empty(nbytes, dtype=torch.uint8, device=dev)
        h2d = median(_events_ms(torch, lambda: gpu.copy_(host, non_blocking=True), reps))
        d2h = median(_events_ms(torch, lambda: host.copy_(gpu, non_blocking=True), reps))

        s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()

        def both() -> None:
            cur = torch.cuda.current_stream()
            fork = torch.cuda.Event()
            fork.record(cur)
            done1, done2 = torch.cuda.Event(), torch.cuda.Event()
            for stream, done, dst, src in ((s1, done1, gpu, host), (s2, done2, host2, gpu2)):
                stream.wait_event(fork)
                with torch.cuda.stream(stream):
                    dst.copy_(src, non_blocking=True)
                done.record(stream)
            cur.wait_event(done1)
            cur.wait_event(done2)

        bidir = median(_events_ms(torch, both, reps))
    return {"h2d_ms": h2d, "d2h_ms": d2h, "bidir_ms": bidir, "h2d_gbps": gbps(nbytes, h2d),
            "d2h_gbps": gbps(nbytes, d2h), "bidir_gbps": gbps(2 * nbytes, bidir)}


def pageable(index: int, nbytes: int, reps: int) -> dict[str, float]:
    """Pageable (ordinary) host memory both ways; wall clock, since the copy blocks the host."""
    import torch

    dev = torch.device("cuda", index)
    with torch.cuda.device(index):
        host = torch.empty(nbytes, dtype=torch.uint8)
        host.fill_(1)  # touch the pages, so the first copy does not time page faults
        gpu = torch.empty(nbytes, dtype=torch.uint8, device=dev)
        h2d = median(_wall_ms(torch, lambda: gpu.copy_(host), reps))
        d2h = median(_wall_ms(torch, lambda: host.copy_(gpu), reps))
    return {"h2d_ms": h2d, "d2h_ms": d2h, "h2d_gbps": gbps(nbytes, h2d), "d2h_gbps": gbps(nbytes, d2h)}


def expert_gather(index: int, reps: int, copies: int = GATHER_COPIES, nbytes: int = EXPERT_BYTES) -> dict[str, float]:
    """One decode step's expert misses: `copies` separate pinned -> device copies of one expert each."""
    import torch

    with torch.cuda.device(index):
        host = torch.empty((copies, nbytes), dtype=torch.uint8, pin_memory=True)
        gpu = torch.empty((copies, nbytes), dtype=torch.uint8, device=torch.device("cuda", index))

        def gather() -> None:
            for i in range(copies):
                gpu[i].copy_(host[i], non_blocking=True)

        ms = median(_events_ms(torch, gather, max(reps, 10), warmup=2))
    return {"ms": ms, "gbps": gbps(copies * nbytes, ms)}


def copy_compute_overlap(index: int, nbytes: int, reps: int) -> dict[str, float]:
    """Time a pinned H2D copy alone, matmuls of about the same length alone, then both on two streams.

    hidden = (copy + compute - both) / min(copy, compute): 1.0 means the shorter one vanished entirely.
    """
    import torch

    dev = torch.device("cuda", index)
    with torch.cuda.device(index):
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        gpu = torch.empty(nbytes, dtype=torch.uint8, device=dev)
        n = 4096
        a = torch.randn(n, n, device=dev, dtype=torch.float16)
        b = torch.randn(n, n, device=dev, dtype=torch.float16)
        c = torch.empty(n, n, device=dev, dtype=torch.float16)

        def copy() -> None:
            gpu.copy_(host, non_blocking=True)

        copy_ms = median(_events_ms(torch, copy, reps))
        one_mm = median(_events_ms(torch, lambda: torch.mm(a, b, out=c), reps, warmup=2))
        k = max(1, min(500, round(copy_ms / max(one_mm, 1e-3))))

        def compute() -> None:
            for _ in range(k):
                torch.mm(a, b, out=c)

        compute_ms = median(_events_ms(torch, compute, reps))
        side = torch.cuda.Stream()

        def both() -> None:
            cur = torch.cuda.current_stream()
            fork, done = torch.cuda.Event(), torch.cuda.Event()
            fork.record(cur)
            side.wait_event(fork)
            with torch.cuda.stream(side):
                copy()
            done.record(side)
            compute()
            cur.wait_event(done)

        both_ms = median(_events_ms(torch, both, reps))
    shorter = min(copy_ms, compute_ms)
    hidden = (copy_ms + compute_ms - both_ms) / shorter if shorter > 0 else 0.0
    return {"copy_ms": copy_ms, "compute_ms": compute_ms, "both_ms": both_ms, "matmuls": float(k),
            "hidden": max(0.0, min(1.0, hidden))}
