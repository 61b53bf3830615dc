"""GatedDeltaNet's chunked core (fla) over a full prefill chunk as the replay of one CUDA graph (gdn "fla-graphs").

Why: fla's chunk_gated_delta_rule spends ~1.1 ms of host time a call (its autograd Function, input guards,
backend dispatch and ~8 Triton launches from Python: the 64K prefill profile, docs/RESULTS.md session 7), and a
120K prompt makes 1,800 of them (60 chunks x 30 layers): host time the GPU waits on in a host-bound prefill.
Every full chunk has the same shapes, so one capture serves every layer and chunk: the inputs are copied into
the graph's static buffers (~34 MB at the real geometry, ~15 us of HBM), the graph is replayed (~10 us of host
time), and the outputs are the graph's own buffers. Those stay valid until the next replay; the layer copies the
state out and its gated norm reads `out` on the same stream before the next layer's replay (gdn.py). The same
kernels on the same values: the same bytes as the plain call (tests/test_gpu_gdn_graph.py, natively).

Anything else (decode, a partial last chunk) takes the plain call; the engine wraps fla's core only on a GPU. The
graph's private pool (fla's intermediates, ~150 MB at the real geometry) is held for the engine's life: it fits the
plan's prefill workspace (1 GiB at chunk 2,048 against a 522 MiB transient peak at 120K, session 10), and
`pool_bytes` reports it.
"""
from __future__ import annotations

from typing import Callable

import torch


class ChunkGraphs:
    """A drop-in for a gdn core f(q, k, v, g, beta, state, decode) -> (out, new_state) that replays one CUDA
    graph for every prefill call of `tokens` rows (the prefill chunk)."""

    def __init__(self, core: Callable, tokens: int, *, graph_factory: Callable | None = None):
        self.core, self.tokens = core, tokens
        self.enabled = True  # False: every call plain (the engine's A/B is the gdn_graphs option)
        self._graph_factory = graph_factory or _capture_cuda_graph
        self._key = None
        self._inputs: list[torch.Tensor] = []
        self._outputs: tuple[torch.Tensor, torch.Tensor] | None = None
        self._replay: Callable[[], None] | None = None
        self.captures = self.replays = self.plain_calls = 0
        self.pool_bytes = 0

    def __call__(self, q, k, v, g, beta, state, decode: bool):
        if decode or not self.enabled or q.shape[0] != self.tokens:
            self.plain_calls += 1
            return self.core(q, k, v, g, beta, state, decode)
        args = (q, k, v, g, beta, state)
        key = tuple((t.shape, t.stride(), t.dtype, t.device) for t in args)
        if key != self._key:  # the first full chunk (or a new geometry): capture on these values
            self._inputs = [t.clone() for t in args]
            self._replay, self._outputs, self.pool_bytes = self._graph_factory(
                lambda: self.core(*self._inputs, False))
            self._key = key
            self.captures += 1
        for static, value in zip(self._inputs, args):
            static.copy_(value)
        self._replay()
        self.replays += 1
        return self._outputs


def _capture_cuda_graph(fn: Callable[[], tuple[torch.Tensor, torch.Tensor]]):
    """(replay, outputs, pool bytes) of fn captured in a CUDA graph, after two warm-up calls on a side stream
    (Triton's compile and autotune run there, outside the capture; their outputs are dropped)."""
    from ..runtime.graph import graph_pool_bytes

    side = torch.cuda.Stream()  # why: torch captures on a non-default stream; the warm-up runs there too
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    # thread_local: the chat's other threads may touch CUDA meanwhile; only this thread's calls are captured.
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        outputs = fn()
    return graph.replay, outputs, graph_pool_bytes(graph)
