"""The GPU expert slot cache: N slots of one expert each, shared by all layers, least-recently-used eviction.

Device-side bookkeeping (all fixed shapes, no host sync, so a decode step can be captured in a CUDA graph):
  slot_map  [L*E + 1]  (layer, expert) -> slot or -1; the last entry is a scratch target for masked writes
  slot_key  [N + 1]    slot -> layer*E + expert or -1; the last entry is scratch
  stamps    [N]        last use; unique (clock * (N + 1) + position), free slots start lowest: no ties
One writer: `ensure` (on the compute stream) is the only code that changes the maps. It writes a fixed-size
miss plan (src expert rows, dst slots, misses first) and a device-side miss count that `copy_missing` reads.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import ModelConfig
from ..memory import BORROW_STREAM_MIN_LAYERS
from ..quant.nvfp4_rows import NVFP4_ROWS
from .bank import HostExpertBank, split_rows
from .overlap import dedicated_stream


@dataclass
class MissPlan:
    src: torch.Tensor  # [k] bank rows (layer*E + expert), misses first
    dst: torch.Tensor  # [k] slots, misses first
    count: torch.Tensor  # [1] int64: how many leading entries are misses


def _fused_ensure(num_layers: int, top_k: int, num_slots: int, device: torch.device):
    """The one-launch decode ensure (kernels/slot_ensure.py), or None where Triton is missing."""
    try:
        from ..kernels.slot_ensure import FusedEnsure
    except ImportError:
        return None
    return FusedEnsure(num_layers, top_k, num_slots, device)


class ExpertSlotCache:
    def __init__(self, cfg: ModelConfig, bank: HostExpertBank, num_slots: int, device: torch.device,
                 fused_ensure: bool | None = None):
        """fused_ensure: decode's ensure as one Triton launch (default: on a GPU) instead of the torch ops."""
        e, layers, k = cfg.moe.num_experts, cfg.num_layers, cfg.moe.top_k
        if num_slots < k:
            raise ValueError(f"the slot cache needs at least top_k={k} slots, got {num_slots}")
        self.cfg, self.bank, self.device = cfg, bank, device
        self.num_experts, self.num_slots, self.top_k = e, num_slots, k
        self.rows = torch.zeros(num_slots + 1, bank.row_elems, dtype=bank.dtype, device=device)
        self.row_bytes = bank.row_elems * self.rows.element_size()
        # What the decode kernels read, by slot id: dense views, or the NVFP4 rows themselves.
        self.fmt = bank.fmt
        self.decode_weights = (self.rows,) if bank.fmt == NVFP4_ROWS else split_rows(self.rows, cfg)
        self.slot_map = torch.full((layers * e + 1,), -1, dtype=torch.long, device=device)
        self.slot_key = torch.full((num_slots + 1,), -1, dtype=torch.long, device=device)
        self.stamps = torch.arange(-num_slots, 0, dtype=torch.long, device=device)
        self.clock = torch.zeros(1, dtype=torch.long, device=device)
        self.hits = torch.zeros(1, dtype=torch.long, device=device)
        self.misses = torch.zeros(1, dtype=torch.long, device=device)
        self._positions = torch.arange(k, device=device)
        self._scratch_key = layers * e
        if fused_ensure is None:
            fused_ensure = device.type == "cuda"
        self._fused = _fused_ensure(layers, k, num_slots, device) if fused_ensure else None
        # Prefill streams each layer's whole bank into one of two buffers (the baseline layer-major improves on).
        # With enough slots the buffers are the trailing 2 x E slots, lent for the prefill and refilled from the
        # bank after it (the slots are idle while a prompt streams); else a dedicated allocation.
        self.borrows_stream = num_slots >= BORROW_STREAM_MIN_LAYERS * e
        self._dedicated = None if self.borrows_stream else torch.empty(2, e, bank.row_elems, dtype=bank.dtype,
                                                                       device=device)
        self._region = (num_slots - 2 * e, num_slots) if self.borrows_stream else (num_slots, num_slots)
        self.stream_lent = False
        self.stream_refill_bytes = 0
        self._stream_layer = [-1, -1]  # which layer each buffer holds: a repeat visit skips the copy
        on_gpu = device.type == "cuda"
        # Named stream: prefill bank copies run here so they overlap the compute stream's GEMMs.
        self._copy = dedicated_stream(device) if on_gpu else None
        self._copy_done = [torch.cuda.Event() for _ in range(2)] if on_gpu else []
        self._buffer_free = [torch.cuda.Event() for _ in range(2)] if on_gpu else []
        self.prefill_through_slots = False  # set by the runner for a short prompt (experts/for_prefill)
        self.stream_bytes = 0  # bytes the prefill streaming moved (host -> GPU on a GPU)
        self.stream_copies = 0
        # Layer-major prefill parks activations in the slots' bytes and refills them after (offload/parking.py).
        self.parking_borrowed_bytes = 0
        self.parking_refill_bytes = 0

    @property
    def one_launch_ensure(self) -> bool:
        """decode's ensure is one Triton launch (kernels/slot_ensure.py), which can also route (route=)."""
        return self._fused is not None

    def ensure(self, layer: int, ids: torch.Tensor | None, route: tuple | None = None) -> tuple[torch.Tensor, MissPlan]:
        """ids [1, k] expert ids of one token -> (slot ids [1, k], the miss plan). Updates the LRU state.
        Fixed shapes, no host sync: the decode graph captures it. route: route_topk's work in the same launch
        (slot_ensure.ROUTE, the one-launch ensure only; FusedEnsure says what it takes); ids then None or a
        trace's."""
        if route is not None and self._fused is None:
            raise ValueError("route= needs the one-launch ensure (kernels/slot_ensure.py)")
        if self._fused is not None:
            final, src, dst, count = self._fused(self, layer, ids, route)
            return final.reshape(1, -1), MissPlan(src, dst, count)
        final, plan = self._ensure(layer, ids.reshape(-1), self._positions)
        return final.reshape(ids.shape), plan

    def ensure_many(self, layer: int, ids: torch.Tensor) -> tuple[torch.Tensor, MissPlan] | None:
        """A short prefill through the slots: ids [T, k] -> (slot ids [T, k], the plan for its distinct
        experts), or None when they outnumber the slots (the caller streams the layer instead). One host sync
        (the distinct count); prefill is never captured."""
        distinct, inverse = torch.unique(ids.reshape(-1), return_inverse=True)
        if distinct.numel() > self.num_slots:
            return None
        positions = torch.arange(distinct.numel(), device=self.device)
        final, plan = self._ensure(layer, distinct, positions)
        return final[inverse].reshape(ids.shape), plan

    def _ensure(self, layer: int, e: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, MissPlan]:
        """e [n] distinct expert ids, n <= num_slots -> (their slots [n], the miss plan)."""
        n = e.shape[0]
        key = layer * self.num_experts + e
        slot = self.slot_map[key]
        hit = slot >= 0
        miss = ~hit
        # Protect the slots this step hits; evict the least recently used of the rest.
        protect = torch.zeros(self.num_slots, dtype=torch.long, device=self.device)
        protect.index_add_(0, slot.clamp(min=0), hit.long())
        big = torch.iinfo(torch.long).max
        candidates = torch.where(protect > 0, torch.full_like(self.stamps, big), self.stamps)
        victims = torch.topk(candidates, n, largest=False, sorted=True).indices
        rank = torch.cumsum(miss.long(), 0) - 1
        new_slot = victims[rank.clamp(min=0)]
        final = torch.where(hit, slot, new_slot)
        old_key = self.slot_key[new_slot]
        evicted = miss & (old_key >= 0)
        self.slot_map.index_put_((torch.where(evicted, old_key, self._scratch_key),),
                                 torch.full_like(old_key, -1))
        self.slot_map.index_put_((torch.where(miss, key, self._scratch_key),), new_slot)
        self.slot_key.index_put_((torch.where(miss, new_slot, self.num_slots),), key)
        self.clock += 1
        # Unique stamps: a stride larger than any n, so a later call always stamps above an earlier one.
        self.stamps.index_put_((final,), self.clock * (self.num_slots + 1) + positions)
        order = torch.argsort(hit.long(), stable=True)  # misses (0) first, in id order
        count = miss.sum().reshape(1)
        self.hits += hit.sum()
        self.misses += count
        plan = MissPlan(key[order], torch.where(miss[order], new_slot[order], self.num_slots), count)
        return final, plan

    def copy_missing(self, plan: MissPlan) -> None:
        """Bring the planned experts from the bank into their slots."""
        if self.bank.rows.device == self.device:
            # Same memory space (the CPU path): a fixed-shape gather; non-miss entries land in the scratch row.
            self.rows.index_copy_(0, plan.dst, self.bank.rows.index_select(0, plan.src))
            return
        from ..kernels.expert_copy import gather_experts

        gather_experts(self.bank.rows, plan.src, plan.dst, plan.count, self.rows)

    @property
    def stream_rows(self) -> torch.Tensor:
        """[2, E, row]: the two stream buffers (a view of the trailing slots when borrowed)."""
        if self._dedicated is not None:
            return self._dedicated
        a, b = self._region
        return self.rows[a:b].view(2, self.num_experts, self.rows.shape[1])

    @property
    def stream_buffer_bytes(self) -> int:
        """Device bytes the stream buffers take beyond the slots (0 when they borrow slots)."""
        return 0 if self._dedicated is None else self._dedicated.numel() * self._dedicated.element_size()

    @property
    def parkable_slots(self) -> int:
        """Leading slots layer-major may lend to its parked activations (never the streaming region)."""
        return self._region[0]

    def _lend_stream(self) -> None:
        if self._copy is not None:
            # Copies into the region wait for every earlier reader/writer of these slots on the compute
            # stream (decode steps, the last refill).
            for event in self._buffer_free:
                event.record(torch.cuda.current_stream())
        self.stream_lent = True
        self._stream_layer = [-1, -1]

    def end_stream(self) -> None:
        """After a prefill: give the lent slots back, refilled (the runner calls it, also on error/cancel)."""
        if not self.stream_lent:
            return
        if self._copy is not None:  # every copy was consumed by compute; order the refill after them anyway
            for event in self._copy_done:
                torch.cuda.current_stream().wait_event(event)
        self.stream_refill_bytes += self.refill_slots(*self._region)
        self.stream_lent = False
        self._stream_layer = [-1, -1]

    def refill_slots(self, start: int, stop: int) -> int:
        """Slots start:stop get back the bank rows their keys name (zeros where empty): -> bytes copied.
        One host sync for the keys: only ever called between prefill and decode."""
        keys = self.slot_key[start:stop].tolist()
        held = [s for s, k in enumerate(keys, start) if k >= 0]
        for s, k in enumerate(keys, start):
            if k < 0:
                self.rows[s].zero_()  # a never-used slot reads as zeros in a cache that was never lent
        bank = self.bank.rows
        if held and bank.device == self.rows.device:
            src = torch.tensor([keys[s - start] for s in held], dtype=torch.long, device=bank.device)
            self.rows.index_copy_(0, torch.tensor(held, device=self.rows.device), bank.index_select(0, src))
        else:
            # Pinned bank -> device on the current stream, behind the prefill's last reads of these bytes.
            for s in held:
                self.rows[s].copy_(bank[keys[s - start]], non_blocking=True)
        return len(held) * self.row_bytes

    def stream_layer(self, layer: int) -> tuple[torch.Tensor, ...]:
        """Prefill: this layer's whole bank in a device buffer -> stacked (gate_up, down) views by expert id, or
        (NVFP4 rows,) for a 4-bit bank.

        Two buffers: while layer L computes from one, layer L+1's bank streams into the other on the copy
        stream (behind the previous layer's compute). Chunked prefill visits layer L once per chunk and finds
        it overwritten by L+2: one bank copy per chunk. Layer-major prefill visits L for every chunk in a
        row: one copy per prompt. Call `release_layer(L)` after each use, so the copy into a buffer waits for
        its readers."""
        if self.borrows_stream and not self.stream_lent:
            self._lend_stream()
        which = layer % 2
        if self._stream_layer[which] != layer:
            self._start_copy(layer)
        if self._copy is not None:
            torch.cuda.current_stream().wait_event(self._copy_done[which])
        if layer + 1 < self.cfg.num_layers and self._stream_layer[(layer + 1) % 2] != layer + 1:
            self._start_copy(layer + 1)
        if self.fmt == NVFP4_ROWS:
            return (self.stream_rows[which],)
        return split_rows(self.stream_rows[which], self.cfg)

    def release_layer(self, layer: int) -> None:
        """The compute stream is done reading this layer's buffer (until its next use is queued)."""
        if self._copy is not None:
            self._buffer_free[layer % 2].record(torch.cuda.current_stream())

    def _start_copy(self, layer: int) -> None:
        which = layer % 2
        src, buf = self.bank.layer_rows(layer), self.stream_rows[which]
        if self._copy is None:
            buf.copy_(src)
        else:
            self._copy.wait_event(self._buffer_free[which])
            with torch.cuda.stream(self._copy):
                buf.copy_(src, non_blocking=True)
            self._copy_done[which].record(self._copy)
        self._stream_layer[which] = layer
        self.stream_bytes += src.numel() * src.element_size()
        self.stream_copies += 1

    def counters(self) -> dict:
        hits, misses = int(self.hits), int(self.misses)
        miss_bytes = misses * self.row_bytes  # every miss copies one whole expert row from the bank
        return {"expert_hits": hits, "expert_misses": misses, "expert_slots": self.num_slots,
                "hit_rate": hits / (hits + misses) if hits + misses else None,
                "miss_bytes": miss_bytes,
                "h2d_bytes": miss_bytes + self.stream_bytes + self.parking_refill_bytes + self.stream_refill_bytes,
                "prefill_stream_bytes": self.stream_bytes, "prefill_stream_copies": self.stream_copies,
                "stream_refill_bytes": self.stream_refill_bytes,
                "parking_borrowed_bytes": self.parking_borrowed_bytes, "parking_refill_bytes": self.parking_refill_bytes}
