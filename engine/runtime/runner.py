"""The model runner: chunked prefill and the one-token decode step over one SequenceState.

Every caller (score, chat, bench) goes through these entry points, so comparing their outputs compares the
real paths. The runner owns the sequence's length on the host; the model itself only computes.
On CUDA with graph-safe kernels the decode step replays one captured graph; one state per runner is kept
(its buffers are what the graph reads) and reset in place for each new sequence.
"""
from __future__ import annotations

import threading

import torch

from ..engine_config import EngineConfig
from ..errors import GenerationCancelled
from ..model.cache import SequenceState
from ..model.qwen3_5_moe import Qwen35MoeModel
from .graph import DecodeGraph
from .layer_major import layer_major_prefill


class Runner:
    def __init__(self, model: Qwen35MoeModel, config: EngineConfig):
        """config: the engine's resolved EngineConfig; the runner follows it (prefill mode, chunk, window,
        slot prefill, CUDA graphs, context) and decides nothing."""
        self.model = model
        self.prefill_chunk = config.prefill_chunk
        self.max_context = config.max_context
        self.layer_major = config.layer_major
        self.prefill_window = config.prefill_window
        self.slot_prefill_tokens = config.slot_prefill_tokens
        if config.offloaded != (model.cache is not None):
            raise ValueError("the config and the model disagree on whether the experts are offloaded")
        self.counters = {"prefills_chunked": 0, "prefills_layer_major": 0, "layer_major_windows": 0,
                         "prefills_through_slots": 0}
        self.use_graph = config.cuda_graphs
        if self.use_graph and not (model.device.type == "cuda" and model.kernels.graph_safe):
            raise ValueError("the config asks for CUDA graphs but the model's kernels cannot be captured")
        self._state: SequenceState | None = None
        self._graph: DecodeGraph | None = None
        self.epoch = 0  # counts new_state() calls: a Session sharing the graph's state knows when it was reused

    @property
    def shares_state(self) -> bool:
        return self.use_graph

    def new_state(self) -> SequenceState:
        """An empty sequence. With graphs, the one graph-bound state, reset in place."""
        self.epoch += 1
        if not self.use_graph:
            return self._make_state()
        if self._state is None:
            self._state = self._make_state()
            self._graph = DecodeGraph(self.model, self._state)
            self._graph.capture()
        self._state.reset()
        return self._state

    @property
    def decode_graph_bytes(self) -> int:
        """Device memory of the captured decode graph's private pool; 0 before capture (or without graphs)."""
        return self._graph.pool_bytes if self._graph is not None else 0

    def _make_state(self) -> SequenceState:
        m = self.model
        return SequenceState(m.cfg, m.dtype, m.device, self.max_context, m.kernels.attention)

    @torch.inference_mode()
    def _forward(self, state: SequenceState, ids: torch.Tensor, decode: bool) -> torch.Tensor:
        t, start = ids.shape[0], state.seq_len
        state.check_room(t)
        positions = torch.arange(start, start + t, device=self.model.device)
        self.model.kernels.attention.prepare(start, t, decode)
        hidden = self.model.forward(ids, positions, state, start, decode)
        if self.model.routing is not None:
            self.model.routing.advance(t)
        state.seq_len += t
        return hidden

    @torch.inference_mode()
    def prefill(self, state: SequenceState, ids: torch.Tensor, all_logits: bool = False,
                cancel: threading.Event | None = None) -> torch.Tensor:
        """Run ids [T] in chunks of prefill_chunk. Returns float32 logits of every token, or of the last only.

        Prompts longer than one chunk go layer-major when the plan says so (bitwise the same result)."""
        try:
            return self._prefill(state, ids, all_logits, cancel)
        finally:
            if self.model.cache is not None:
                self.model.cache.end_stream()  # slots lent as stream buffers come back refilled

    def _prefill(self, state: SequenceState, ids: torch.Tensor, all_logits: bool,
                 cancel: threading.Event | None) -> torch.Tensor:
        state.check_room(ids.shape[0])
        if self.layer_major and ids.shape[0] > self.prefill_chunk:
            logits, windows = layer_major_prefill(self.model, state, ids, self.prefill_chunk, self.prefill_window,
                                                  all_logits, cancel)
            self.counters["prefills_layer_major"] += 1
            self.counters["layer_major_windows"] += windows
            return logits
        self.counters["prefills_chunked"] += 1
        outputs = []
        short = 0 < ids.shape[0] <= self.slot_prefill_tokens
        if short:  # only this prompt's missing experts cross PCIe (the decode path's slots), not every bank
            self.counters["prefills_through_slots"] += 1
            self.model.cache.prefill_through_slots = True
        try:
            for start in range(0, ids.shape[0], self.prefill_chunk):
                if cancel is not None and cancel.is_set():
                    raise GenerationCancelled("prefill cancelled")
                hidden = self._forward(state, ids[start:start + self.prefill_chunk], decode=False)
                if all_logits:
                    outputs.append(self.model.logits(hidden))
        finally:
            if short:
                self.model.cache.prefill_through_slots = False
        if all_logits:
            return torch.cat(outputs)
        return self.model.logits(hidden[-1:])

    @torch.inference_mode()
    def decode(self, state: SequenceState, token: torch.Tensor) -> torch.Tensor:
        """One token [1] through the decode step -> float32 logits [1, V]."""
        if self.use_graph and state is self._state:
            state.check_room(1)
            logits = self._graph.replay(token, state.seq_len)
            state.seq_len += 1
            return logits.clone()
        return self.model.logits(self._forward(state, token, decode=True))
