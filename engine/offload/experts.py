"""A layer's routed experts served from the slot cache (decode) or streamed whole (prefill)."""
from __future__ import annotations

import torch

from .cache import ExpertSlotCache


class OffloadedExperts:
    def __init__(self, layer: int, cache: ExpertSlotCache):
        self.layer, self.cache = layer, cache

    def for_decode(self, ids: torch.Tensor):
        slots, plan = self.cache.ensure(self.layer, ids)
        self.cache.copy_missing(plan)
        return slots, self.cache.gate_up, self.cache.down

    def for_prefill(self):
        return self.cache.stream_layer(self.layer)
