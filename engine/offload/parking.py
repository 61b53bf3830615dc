"""Park prefill activations in the expert slot cache's bytes, and give the slots back refilled.

Why the slots and not a dedicated pool: during prefill the experts come from the stream buffers, so the slot
region is idle memory that the VRAM budget already pays for. A dedicated activation pool would have to be
carved out of the same budget for good, i.e. cost decode slots (hit rate) on every token of every turn, to
serve a phase that lasts one prompt. Borrowing costs one refill per prompt instead: the borrowed slots'
experts cross PCIe again once, e.g. 120K tokens x 2048 x bf16 = 0.5 GB ~ 10 ms at 50 GB/s, next to a
prefill of many seconds. Only the leading slots the window needs are borrowed; the scratch row never is.

Counters accumulate on the cache object (`parking_borrowed_bytes`, `parking_refill_bytes`) so they outlive
the per-prompt parking object without a change to ExpertSlotCache.
"""
from __future__ import annotations

import torch

from .cache import ExpertSlotCache


class SlotParking:
    def __init__(self, cache: ExpertSlotCache):
        self.cache = cache
        self.slot_bytes = cache.rows.shape[1] * cache.rows.element_size()
        self.slots = 0  # leading slots lent out (their contents are garbage until give_back)
        self.borrowed_bytes = 0
        self.refill_bytes = 0

    def capacity_tokens(self, hidden: int, dtype: torch.dtype) -> int:
        """Tokens of [T, hidden] activations the borrowable slots (all but the scratch row) can hold."""
        return self.cache.parkable_slots * self.slot_bytes // (hidden * dtype.itemsize)

    def borrow(self, tokens: int, hidden: int, dtype: torch.dtype) -> torch.Tensor:
        """-> [tokens, hidden] of `dtype` over the leading slots' bytes, whatever dtype the rows hold."""
        if self.slots:
            raise RuntimeError("the slots are already lent: give_back() first")
        need = tokens * hidden * dtype.itemsize
        slots = -(-need // self.slot_bytes)
        if slots > self.cache.parkable_slots:
            raise ValueError(f"{tokens} tokens need {slots} slots, {self.cache.parkable_slots} can be lent")
        self.slots = slots
        self.borrowed_bytes += slots * self.slot_bytes
        _bump(self.cache, "parking_borrowed_bytes", slots * self.slot_bytes)
        # Raw bytes first: a byte view reinterprets any row dtype (bf16, fp32, future quantized uint8 rows).
        raw = self.cache.rows[:slots].reshape(-1).view(torch.uint8)[:need]
        return raw.view(dtype).view(tokens, hidden)

    def give_back(self) -> None:
        """Restore the lent slots to what the slot cache says they hold. Idempotent; safe after an error."""
        n, self.slots = self.slots, 0
        if not n:
            return
        # Queued on the compute stream behind the prefill's last reads of the parked activations.
        refill = self.cache.refill_slots(0, n)
        self.refill_bytes += refill
        _bump(self.cache, "parking_refill_bytes", refill)


def _bump(cache: ExpertSlotCache, name: str, value: int) -> None:
    setattr(cache, name, getattr(cache, name, 0) + value)
