"""The shared expert's gate/up on a side stream from the router's launch on, beside route_topk and the routed
experts' gate/up (fused decode, integer gate/up, overlap split "off").

Why: route_topk is one program (1.7 us a layer on the H200) while the GPU is otherwise idle, and the experts'
gate/up at one row a one-warp program is 4,608 programs with the shared expert: 1.09 waves of an H200's 4,224 (32
programs an SM), 4,096 without it. Here the shared expert's 512 rows start as soon as the router's launch has
made x's int16 blocks, on a stream of their own, and the routed gate/up is one wave. The shared expert's down
rows stay in the joint down launch (they need route_topk's sigmoid gate), which waits for the side stream first.

Bytes: the shared expert's act is its own launch of expert_gate_up_int with no routed ids, the launch the
overlap's split already makes (the joint launch's bytes, tests/test_kernels_nvfp4_int_experts.py), so the step's
bytes are the default's. Order: fork after router_norm (the side waits on an event recorded there), join
before the down launch (the compute stream waits on the side's event); JOIN = False (test-only) drops the join,
and SIDE_DELAY (test-only) runs first on the side, so that a missing join shows. Off until its GPU A/B
(profile_decode arm "sharedearly"). Without CUDA (the interpreter) the side's launch runs in place, in order.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch

from ..kernels import nvfp4_int_experts
from ..offload.overlap import CudaStreams

if TYPE_CHECKING:
    from .moe import SparseMoE

ON = False
JOIN = True  # test-only negative control: False drops the join, and the step's bytes must then break
SIDE_DELAY: Callable[[], None] | None = None  # test-only: work run first on the side stream
_STREAMS: dict[str, CudaStreams] = {}


class SharedAside:
    """The shared expert's act, being made on the side stream into act[k] (act fp32 [k + 1, I])."""

    def __init__(self, act: torch.Tensor, streams: CudaStreams | None):
        self.act, self.streams, self.joined = act, streams, streams is None

    def join(self) -> None:
        """The compute stream waits for the side's gate/up (before the down launch reads act[k]); once."""
        if not self.joined and JOIN:
            self.streams.current().wait_event(self.streams.done)
        self.joined = True


def streams_for(device: torch.device) -> CudaStreams:
    """This device's side stream and events, made once, on the first (eager) step: never inside a capture."""
    key = str(device)
    if key not in _STREAMS:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("shared_early's stream must be made before CUDA-graph capture (run one step eagerly)")
        _STREAMS[key] = CudaStreams(device)
    return _STREAMS[key]


def wanted(moe: "SparseMoE", int_gate_up: bool) -> bool:
    """ON, and this layer's MoE takes it: the integer gate/up (int_gate_up), the overlap's split off (a split
    computes the shared expert apart already)."""
    return ON and int_gate_up and moe.overlap.split == "off"


def start(moe: "SparseMoE", h: torch.Tensor, xq: tuple, shared_gate_up: tuple, rows: torch.Tensor) -> SharedAside:
    """Fork: the shared expert's gate/up (shared_gate_up: its NVFP4 gate + up triples) from x's int16 blocks xq
    into act[k] on the side stream; rows: the layer's decode bank (a pointer stand-in, no routed id is read)."""
    k = moe.top_k
    act = torch.empty(k + 1, moe.inter, device=h.device, dtype=torch.float32)
    none = torch.empty(1, 0, device=h.device, dtype=torch.long)

    def gate_up():
        nvfp4_int_experts.expert_gate_up_int(h, none, rows, moe.hidden, moe.inter, shared_gate_up, out=act[k:],
                                             xq=xq)

    if h.device.type != "cuda":
        gate_up()
        return SharedAside(act, None)
    s = streams_for(h.device)
    compute = s.current()
    s.ready.record(compute)
    s.side.wait_event(s.ready)
    for t in (act, none, h, *xq):  # made on the compute stream, used on the side: not reused before both are done
        s.keep_alive(t, s.side)
    with s.on(s.side):
        if SIDE_DELAY is not None:
            SIDE_DELAY()
        gate_up()
    s.done.record(s.side)
    return SharedAside(act, s)
