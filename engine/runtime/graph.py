"""The batch-1 decode step captured in one CUDA graph.

Static input buffers (token id, position) are filled before each replay; the FlashInfer decode plan for the
new length is made outside the graph (its wrapper copies the plan into fixed buffers), unless the captured step
attends without it (plans_attention); the graph's output is a fixed logits buffer. Nothing inside the step
syncs with the host. The graph holds the addresses of the state's buffers, so the state is reset in place,
never reallocated.
"""
from __future__ import annotations

import torch

from ..model.cache import SequenceState
from ..model.qwen3_5_moe import Qwen35MoeModel


def graph_pool_bytes(graph: torch.cuda.CUDAGraph) -> int:
    """Bytes of the segments the allocator holds for this graph's private pool (the overlap's side-stream
    work allocates there too, so this is each split's VRAM cost)."""
    try:
        pool = tuple(graph.pool())
        return sum(seg["total_size"] for seg in torch.cuda.memory_snapshot()
                   if tuple(seg.get("segment_pool_id", ())) == pool)
    except (RuntimeError, TypeError, KeyError):  # a report, never a reason to fail the capture
        return 0


def plans_attention(model: Qwen35MoeModel) -> bool:
    """Whether the decode step reads the attention backend's per-length plan (FlashInfer's decode wrapper). The
    fused step's Triton decode attention (kernels/attention_decode.py) reads the position on the device and needs
    none: replay then skips the host's plan, which sits between one token's sync and the next step's launch."""
    if not model.kernels.fused_decode or not hasattr(model.kernels.attention, "decode_rows"):
        return True
    from ..kernels import attention_decode

    return not attention_decode.TRITON


class DecodeGraph:
    def __init__(self, model: Qwen35MoeModel, state: SequenceState):
        self.model, self.state = model, state
        dev = model.device
        self.token = torch.zeros(1, dtype=torch.long, device=dev)
        self.position = torch.zeros(1, dtype=torch.long, device=dev)
        self.graph = torch.cuda.CUDAGraph()
        self.logits: torch.Tensor | None = None
        self.pool_bytes = 0  # the device memory of the graph's private pool (measured after capture)
        self.plans_attention = True  # fixed at capture: the step's kernels are baked in then

    def capture(self) -> None:
        """Warm up on a side stream (as torch requires), capture, then restore the state it disturbed."""
        self.plans_attention = plans_attention(self.model)
        snap = self.state.snapshot()
        routing_at = self.model.routing.position.clone() if self.model.routing is not None else None
        self.model.kernels.attention.prepare(0, 1, decode=True)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._step()
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(self.graph):
            self.logits = self._step()
        torch.cuda.synchronize()
        self.pool_bytes = graph_pool_bytes(self.graph)
        self.state.restore(snap)
        if routing_at is not None:
            self.model.routing.position.copy_(routing_at)

    def _step(self) -> torch.Tensor:
        hidden = self.model.forward(self.token, self.position, self.state, 0, decode=True)
        if self.model.routing is not None:
            self.model.routing.advance(1)  # device-side: captured in the graph
        return self.model.logits(hidden)

    def replay(self, token: torch.Tensor, start: int) -> torch.Tensor:
        self.token.copy_(token.reshape(1), non_blocking=True)
        self.position.fill_(start)
        if self.plans_attention:
            self.model.kernels.attention.prepare(start, 1, decode=True)
        self.graph.replay()
        return self.logits
