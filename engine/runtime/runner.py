"""The model runner: prefill in chunks and the one-token decode step over a SequenceState.

Every caller (score, chat, bench) goes through these two entry points, so comparing their outputs compares
the real paths.
"""
from __future__ import annotations

import threading

import torch

from ..errors import GenerationCancelled
from ..model.cache import SequenceState
from ..model.qwen3_5_moe import Qwen35MoeModel


class Runner:
    def __init__(self, model: Qwen35MoeModel, prefill_chunk: int, max_context: int):
        self.model = model
        self.prefill_chunk = prefill_chunk
        self.max_context = max_context

    def new_state(self) -> SequenceState:
        return SequenceState(self.model.cfg, self.model.dtype, self.model.device, self.max_context)

    @torch.inference_mode()
    def prefill(self, state: SequenceState, ids: torch.Tensor, all_logits: bool = False,
                cancel: threading.Event | None = None) -> torch.Tensor:
        """Run ids [T] in chunks of prefill_chunk. Returns float32 logits of every token, or of the last only."""
        state.check_room(ids.shape[0])
        outputs = []
        for start in range(0, ids.shape[0], self.prefill_chunk):
            if cancel is not None and cancel.is_set():
                raise GenerationCancelled("prefill cancelled")
            chunk = ids[start:start + self.prefill_chunk]
            hidden = self.model.forward(chunk, state, decode=False)
            if all_logits:
                outputs.append(self.model.logits(hidden))
        if all_logits:
            return torch.cat(outputs)
        return self.model.logits(hidden[-1:])

    @torch.inference_mode()
    def decode(self, state: SequenceState, token: torch.Tensor) -> torch.Tensor:
        """One token [1] through the decode step -> float32 logits [1, V]."""
        return self.model.logits(self.model.forward(token, state, decode=True))
