"""A layer's routed experts served from the slot cache (decode) or streamed whole (prefill)."""
from __future__ import annotations

import torch

from .cache import ExpertSlotCache


class OffloadedExperts:
    def __init__(self, layer: int, cache: ExpertSlotCache):
        self.layer, self.cache = layer, cache
        self.fmt = cache.fmt

    def for_decode(self, ids: torch.Tensor | None, route: tuple | None = None):
        """ensure now (on the compute stream: the single writer of the slot map); the copy is returned for the
        caller to run serially or beside the shared expert. route: the ensure's launch routes first (its ids
        then None or a trace's; ExpertSlotCache.ensure)."""
        slots, plan = self.cache.ensure(self.layer, ids, route)
        copy = lambda: self.cache.copy_missing(plan)  # noqa: E731
        copy.inputs = (plan.src, plan.dst, plan.count)  # read on the side stream when the copy is forked
        return slots, self.cache.decode_weights, copy

    def for_prefill(self, ids: torch.Tensor):
        """-> (ids as the kernel indexes them, its weights). A short prompt (the runner says so) goes through
        the slots: only its missing experts cross PCIe, not the layer's whole bank."""
        self._streamed = False
        if self.cache.prefill_through_slots and not self.cache.stream_lent:  # never into the lent slots
            found = self.cache.ensure_many(self.layer, ids)
            if found is not None:
                slots, plan = found
                self.cache.copy_missing(plan)
                return slots, self.cache.decode_weights
        self._streamed = True
        return ids, self.cache.stream_layer(self.layer)

    def release_prefill(self) -> None:
        if self._streamed:
            self.cache.release_layer(self.layer)
