"""Layer-major prefill: every chunk of the prompt goes through layer L before any chunk enters layer L+1.

The chunks, their shapes and their kernels are those of chunked prefill, and each (layer, chunk) step sees
the same inputs: the full-attention KV of earlier chunks of this layer is already written, and the
GatedDeltaNet conv/recurrent states of this layer are carried from chunk to chunk in order. So the result is
bitwise equal to chunked prefill, while an offloaded layer's expert bank crosses PCIe once per prompt (the
slot cache's stream buffer still holds layer L for the next chunk) instead of once per chunk.

The hidden state of every chunk is parked between layers. A prompt whose activations should not all be held
at once is split into windows of `window` tokens, each run layer-major (each window streams every bank once).
Cancellation is checked before every (layer, chunk) step; a cancelled window leaves layers at different
positions, so the recurrent state is restored to where the window began (KV past seq_len is ignored).
"""
from __future__ import annotations

import threading

import torch

from ..errors import GenerationCancelled
from ..model.cache import SequenceState
from ..model.qwen3_5_moe import Qwen35MoeModel


def layer_major_prefill(model: Qwen35MoeModel, state: SequenceState, ids: torch.Tensor, chunk: int,
                        window: int | None, all_logits: bool,
                        cancel: threading.Event | None = None) -> tuple[torch.Tensor, int]:
    """-> (logits of every token or of the last one, number of windows)."""
    # Windows are whole chunks, so the chunk boundaries (and the bytes) match chunked prefill.
    window = ids.shape[0] if window is None else max(chunk, window // chunk * chunk)
    outputs, windows = [], 0
    for w0 in range(0, ids.shape[0], window):
        hidden = _window(model, state, ids[w0:w0 + window], chunk, cancel)
        windows += 1
        if all_logits:
            outputs.extend(model.logits(h) for h in hidden)
        last = hidden[-1]
    return (torch.cat(outputs) if all_logits else model.logits(last[-1:])), windows


def _window(model: Qwen35MoeModel, state: SequenceState, ids: torch.Tensor, chunk: int,
            cancel: threading.Event | None) -> list[torch.Tensor]:
    start = state.seq_len
    bounds = [(s, min(s + chunk, ids.shape[0])) for s in range(0, ids.shape[0], chunk)]
    positions = [torch.arange(start + a, start + b, device=model.device) for a, b in bounds]
    snap = state.snapshot() if cancel is not None else None
    xs = [model.embed_ids(ids[a:b]) for a, b in bounds]
    attention, routing = model.kernels.attention, model.routing
    try:
        for layer in model.layers:
            for i, (a, b) in enumerate(bounds):
                if cancel is not None and cancel.is_set():
                    raise GenerationCancelled("prefill cancelled")
                attention.prepare(start + a, b - a, decode=False)
                if routing is not None:
                    routing.advance(a)  # the trace rows chunked prefill would give this chunk
                xs[i] = layer.forward(xs[i], positions[i], state, start + a, decode=False)
                if routing is not None:
                    routing.advance(-a)
    except GenerationCancelled:
        state.restore(snap)
        raise
    if routing is not None:
        routing.advance(ids.shape[0])
    state.seq_len = start + ids.shape[0]
    return [model.final_norm(x) for x in xs]
