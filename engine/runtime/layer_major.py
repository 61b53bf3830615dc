"""Layer-major prefill: every chunk of the prompt goes through layer L before any chunk enters layer L+1.

The chunks, their shapes and their kernels are those of chunked prefill, and each (layer, chunk) step sees
the same inputs: the full-attention KV of earlier chunks of this layer is already written, and the
GatedDeltaNet conv/recurrent states of this layer are carried from chunk to chunk in order. So the result is
bitwise equal to chunked prefill, while an offloaded layer's expert bank crosses PCIe once per prompt (the
slot cache's stream buffer still holds layer L for the next chunk) instead of once per chunk.

The hidden state of every chunk is parked between layers. With offloaded experts it is parked in the slot
cache's own bytes (idle during prefill; see offload/parking.py), refilled from the bank when prefill ends,
also on error or cancel; only the input addresses differ from chunked prefill, so the bytes do not. A prompt
whose activations do not fit the slots (or the caller's `window`) is split into windows of whole chunks, each
run layer-major (each window streams every bank once). With resident experts the chunks stay fresh tensors.
Cancellation is checked before every (layer, chunk) step; a cancelled window leaves layers at different
positions, so the recurrent state is restored to where the window began (KV past seq_len is ignored).
"""
from __future__ import annotations

import threading
from contextlib import contextmanager

import torch

from ..errors import GenerationCancelled
from ..model.cache import SequenceState
from ..model.qwen3_5_moe import Qwen35MoeModel
from ..offload.parking import SlotParking
from ..quant.linear import dequantized_once


def layer_major_prefill(model: Qwen35MoeModel, state: SequenceState, ids: torch.Tensor, chunk: int,
                        window: int | None, all_logits: bool,
                        cancel: threading.Event | None = None) -> tuple[torch.Tensor, int]:
    """-> (logits of every token or of the last one, number of windows)."""
    total = ids.shape[0]
    parking = SlotParking(model.cache) if model.cache is not None else None
    # Windows are whole chunks, so the chunk boundaries (and the bytes) match chunked prefill.
    window = total if window is None else max(chunk, window // chunk * chunk)
    if parking is not None:
        fit = parking.capacity_tokens(model.cfg.hidden_size, model.dtype) // chunk * chunk
        if fit:
            window = min(window, fit)  # the activations must fit the slots: more windows, never more memory
        else:
            parking = None  # not even one chunk fits: one chunk per window is chunked prefill, park nothing
    outputs, windows = [], 0
    try:
        park = None
        if parking is not None:
            park = parking.borrow(min(window, total), model.cfg.hidden_size, model.dtype)
        for w0 in range(0, total, window):
            hidden = _window(model, state, ids[w0:w0 + window], chunk, cancel, park)
            windows += 1
            if all_logits:
                outputs.extend(model.logits(h) for h in hidden)
            last = hidden[-1]
        # Computed before the slots go back: final_norm made fresh tensors, but keep nothing on the parked bytes.
        return (torch.cat(outputs) if all_logits else model.logits(last[-1:])), windows
    finally:
        if parking is not None:
            parking.give_back()


def _window(model: Qwen35MoeModel, state: SequenceState, ids: torch.Tensor, chunk: int,
            cancel: threading.Event | None, park: torch.Tensor | None) -> list[torch.Tensor]:
    start = state.seq_len
    bounds = [(s, min(s + chunk, ids.shape[0])) for s in range(0, ids.shape[0], chunk)]
    positions = [torch.arange(start + a, start + b, device=model.device) for a, b in bounds]
    snap = state.snapshot() if cancel is not None else None
    if park is None:
        xs = [model.embed_ids(ids[a:b]) for a, b in bounds]
    else:
        xs = [park[a:b] for a, b in bounds]
        for x, (a, b) in zip(xs, bounds):
            x.copy_(model.embed_ids(ids[a:b]))
    attention, routing = model.kernels.attention, model.routing
    lengths = [b - a for a, b in bounds]
    singles = [(i,) for i in range(len(bounds))]
    # Attention layers may take two chunks' q in one call where that gives each chunk its own call's bytes
    # (model/attention_pairs.py); decided once per window, before any layer runs (it plans on the wrapper).
    groups = attention.pair_plan(start, lengths) if any(layer.is_attention for layer in model.layers) else singles

    def finish(i: int, out: torch.Tensor) -> None:
        if park is None:
            xs[i] = out
        else:
            xs[i].copy_(out)  # back into the parking bytes; `out` (one chunk) is freed right away

    try:
        for layer in model.layers:
            with dequantized_once():  # the layer's FP8/NVFP4 weights dequantized for its first chunk only
                for group in groups if layer.is_attention else singles:
                    if cancel is not None and cancel.is_set():
                        raise GenerationCancelled("prefill cancelled")
                    if len(group) > 1:
                        _attention_group(layer, attention, routing, state, xs, positions, bounds, start, group,
                                         finish)
                        continue
                    i = group[0]
                    a, b = bounds[i]
                    if layer.is_attention:  # the plan only serves attention layers (3 in 4 are GatedDeltaNet)
                        attention.prepare(start + a, b - a, decode=False)
                    with _trace_rows(routing, a):
                        finish(i, layer.forward(xs[i], positions[i], state, start + a, decode=False))
    except GenerationCancelled:
        state.restore(snap)
        raise
    if routing is not None:
        routing.advance(ids.shape[0])
    state.seq_len = start + ids.shape[0]
    return [model.final_norm(x) for x in xs]


def _attention_group(layer, attention, routing, state: SequenceState, xs, positions, bounds, start: int,
                     group: tuple[int, ...], finish) -> None:
    """An attention layer over adjacent chunks with one attention call: each chunk's q/k/v (its KV written),
    the call over their q together, then each chunk's gate, projection and MoE in order."""
    begun = [layer.attention_begin(xs[i], positions[i], state, start + bounds[i][0]) for i in group]
    first = bounds[group[0]][0]
    rows = [bounds[i][1] - bounds[i][0] for i in group]
    attention.prepare(start + first, sum(rows), decode=False)
    out = attention.attend_rows(state.kv[layer.mixer.layer], torch.cat([q for q, _ in begun]), start + first, False)
    for i, q_gate, part in zip(group, begun, out.split(rows)):
        with _trace_rows(routing, bounds[i][0]):
            finish(i, layer.attention_end(xs[i], q_gate, part))


@contextmanager
def _trace_rows(routing, offset: int):
    """A benchmark's routing trace at the rows chunked prefill would give the chunk at `offset` (none: no-op)."""
    if routing is not None:
        routing.advance(offset)
    yield
    if routing is not None:
        routing.advance(-offset)
