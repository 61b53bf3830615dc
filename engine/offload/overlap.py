"""Decode overlap: a layer's expert-miss copy runs beside the same layer's shared expert, on two streams.

Two splits (seeds 000/001/002), chosen by the engine plan before any capture:
  copy-side   (a): the miss copy on the side stream, the shared expert on the compute stream.
  shared-side (b): the shared expert and its gate on the side stream, the copy right behind ensure on the
                   compute stream (the copy no longer queues behind the shared expert's launches).
Order inside one layer (both splits): ensure (compute; the only writer of the slot map) -> record(ready) ->
side: wait(ready), its half, record(done) | compute: the other half -> wait(done) -> routed GEMM.
The join is in a `finally`, so an error in either callback cannot leave side work outliving its layer. The
side stream is created once with its own handle (a pooled torch.cuda.Stream() can alias the compute or
capture stream and silently serialize); both events are created before any capture. "off" runs exactly the
serial sequence: copy, then shared expert, on the compute stream.
"""
from __future__ import annotations

from typing import Any, Callable

SPLITS = ("off", "copy-side", "shared-side")


class CudaStreams:
    """The real stream operations (the CPU tests substitute a recording fake with the same methods)."""

    def __init__(self, device):
        import torch

        self.torch = torch
        self.side = dedicated_stream(device)
        # Created here, outside any capture: a graph records waits on them.
        self.ready = torch.cuda.Event()
        self.done = torch.cuda.Event()

    def current(self):
        return self.torch.cuda.current_stream()

    def on(self, stream):
        return self.torch.cuda.stream(stream)

    def keep_alive(self, tensor, stream) -> None:
        # A tensor made on one stream and read on the other must not be reused before both are done with it.
        tensor.record_stream(stream)


def dedicated_stream(device):
    """A stream of our own for work that must run beside the compute stream (never a pooled torch stream,
    which can alias the current or capture stream and silently serialize)."""
    import torch

    return torch.cuda.ExternalStream(_new_stream_handle(), device=device)


def _new_stream_handle() -> int:
    """A dedicated non-blocking CUDA stream (never one of torch's pooled streams)."""
    try:
        from cuda.bindings import runtime as cudart

        err, stream = cudart.cudaStreamCreateWithFlags(cudart.cudaStreamNonBlocking)
        if int(err) == 0:
            return int(stream)
    except ImportError:
        pass
    import ctypes

    import torch

    torch.cuda.init()
    lib = None
    for name in ("libcudart.so", "libcudart.so.13", "libcudart.so.12"):
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError:
            continue
    if lib is None:
        raise RuntimeError("cannot create a CUDA stream: neither cuda-python nor libcudart is available")
    handle = ctypes.c_void_p()
    if lib.cudaStreamCreateWithFlags(ctypes.byref(handle), 1) != 0:
        raise RuntimeError("cudaStreamCreateWithFlags failed")
    return int(handle.value)


class DecodeOverlap:
    def __init__(self, split: str, streams: Any = None, join: bool = True, side_delay: Callable | None = None):
        """join=False is a test-only negative control: the guarded wait is dropped and outputs must break.
        side_delay (test-only) runs first on the side stream, so a missing join shows up reliably."""
        if split not in SPLITS:
            raise ValueError(f"overlap split must be one of {SPLITS}, got {split!r}")
        if split != "off" and streams is None:
            raise ValueError("an overlap split needs streams")
        self.split, self.streams, self.join, self.side_delay = split, streams, join, side_delay

    def run(self, copy: Callable[[], None], shared: Callable[[], Any], shared_input=None):
        """Run the miss copy and the shared expert per the split; returns the shared expert's output."""
        if self.split == "off":
            copy()
            return shared()
        s = self.streams
        compute = s.current()
        s.ready.record(compute)
        out = None
        try:
            s.side.wait_event(s.ready)
            if self.side_delay is not None:
                with s.on(s.side):
                    self.side_delay()
            if self.split == "copy-side":
                for tensor in getattr(copy, "inputs", ()):
                    s.keep_alive(tensor, s.side)
                with s.on(s.side):
                    copy()
                out = shared()
            else:
                if shared_input is not None:
                    s.keep_alive(shared_input, s.side)
                with s.on(s.side):
                    out = shared()
                copy()
        finally:
            # Always closes the fork, even when a callback raised: no side work outlives its layer.
            s.done.record(s.side)
            if self.join:
                compute.wait_event(s.done)
        if self.split == "shared-side" and out is not None:
            s.keep_alive(out, compute)
        return out
