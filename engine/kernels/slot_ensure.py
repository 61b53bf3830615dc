"""The batch-1 decode `ensure` of the expert slot cache as one Triton program.

The torch version (offload/cache.py `ExpertSlotCache._ensure`, the reference) launches ~25 small kernels per
layer (a topk over all slots among them); in the captured decode step they cost ~150-200 us per layer on an
H200 (the overlap micro-bench: the copy started ~200 us after the fork when it queued behind ensure), i.e.
~6-8 ms of a ~20 ms step over 40 layers. This does the same bookkeeping in one launch:

  hits: slot_map[layer*E + id] >= 0; the slots they hit are protected from eviction;
  victims: the m smallest stamps among the other slots (m = this step's misses; none without a miss), in
    ascending order (stamps are unique, so the order is total), found in one pass over the stamps in tiles, each
    tile merged into a running sorted list;
  the i-th miss (in id order) takes the i-th victim; evicted keys leave the slot map, new keys enter it;
  clock += 1; stamps[final] = clock * (N + 1) + position; hit/miss counters;
  the miss plan: bank rows (src) and slots (dst), misses first in id order, then hits (dst = N, the scratch row).

The scratch entries (slot_map[-1], slot_key[-1]) are not written: the torch version only parks masked writes
there. Everything else is byte-equal to the reference (tests/test_slot_ensure.py).

route= (the switch ROUTE, profile arm "routeensure"): the launch first does route_topk's work from the router's
16-bit logits (route_keys.store_route: the weights, ids and the shared gate's sigmoid for the expert launches)
and ensures the ids it found, kept in registers; under a benchmark's routing trace it ensures the trace's ids.
route_topk's one-program launch goes, one launch fewer a layer on the offloaded step's critical path; the bytes
are route_topk + ensure's.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .route_keys import route_args, store_route

BIG = 2**62  # above any stamp (clock * (N + 1) + position stays far below it)
# Stamps per tile of the victim pass: fewer tiles, fewer merge rounds (16 int64 a thread at 8 warps).
TILE_MAX = 4096
# The offloaded decode's route_topk in this launch (route=; moe_fused.routes_in_ensure). Off until its GPU A/B
# (profile_decode arm "routeensure"); the same bytes.
ROUTE = False


@triton.jit
def _ensure_kernel(ids_ptr, slot_map_ptr, slot_key_ptr, stamps_ptr, clock_ptr, hits_ptr, misses_ptr,
                   final_ptr, src_ptr, dst_ptr, count_ptr, key_base, num_slots,
                   K: tl.constexpr, KP: tl.constexpr, TILE: tl.constexpr, BIG: tl.constexpr,
                   logits_ptr=None, E=0, wts_out_ptr=None, ids_out_ptr=None, shared_out_ptr=None,
                   ROUTE: tl.constexpr = 0, BLOCK_E: tl.constexpr = 32, F16: tl.constexpr = False,
                   W_BF16: tl.constexpr = True):
    """ROUTE 1: route_topk's outputs stored first and their ids ensured; ROUTE 2 (a trace): the outputs stored,
    the trace's ids (ids_ptr) ensured."""
    lane = tl.arange(0, KP)
    valid = lane < K
    if ROUTE == 1:
        routed = store_route(logits_ptr, wts_out_ptr, ids_out_ptr, shared_out_ptr, E, K, KP, BLOCK_E, F16, W_BF16)
        key = key_base + tl.where(valid, routed, 0).to(tl.int64)
    else:
        if ROUTE == 2:
            store_route(logits_ptr, wts_out_ptr, ids_out_ptr, shared_out_ptr, E, K, KP, BLOCK_E, F16, W_BF16)
        key = key_base + tl.load(ids_ptr + lane, mask=valid, other=0)
    slot = tl.load(slot_map_ptr + key, mask=valid, other=-1)
    hit = valid & (slot >= 0)
    miss = valid & (slot < 0)

    miss_i = miss.to(tl.int64)
    count = tl.sum(miss_i, axis=0)

    # The `count` smallest stamps of the unprotected slots, ascending, in run_idx[:count]: the victims. Only
    # the first `count` are ever used, so a step without a miss (most steps, at a high hit rate) scans nothing.
    run_idx = tl.zeros([KP], dtype=tl.int64)
    if count > 0:
        run_val = tl.full([KP], BIG, tl.int64)
        offs = tl.arange(0, TILE)
        for t0 in range(0, num_slots, TILE):
            at = t0 + offs
            inside = at < num_slots
            stamp = tl.load(stamps_ptr + at, mask=inside, other=BIG)
            protected = tl.sum(((at[:, None] == slot[None, :]) & hit[None, :]).to(tl.int32), axis=1) > 0
            cand = tl.where(inside & ~protected, stamp, BIG)
            new_val = tl.full([KP], BIG, tl.int64)
            new_idx = tl.zeros([KP], dtype=tl.int64)
            for r in range(0, count):  # merge: take the smaller head of the tile and of the running list
                tile_min = tl.min(cand, axis=0)
                tile_arg = tl.argmin(cand, axis=0)
                run_min = tl.min(run_val, axis=0)
                run_arg = tl.argmin(run_val, axis=0)
                from_tile = tile_min < run_min
                run_at = tl.sum(tl.where(lane == run_arg, run_idx, 0), axis=0)
                new_val = tl.where(lane == r, tl.where(from_tile, tile_min, run_min), new_val)
                new_idx = tl.where(lane == r, tl.where(from_tile, t0 + tile_arg, run_at), new_idx)
                cand = tl.where(from_tile & (offs == tile_arg), BIG, cand)
                run_val = tl.where(~from_tile & (lane == run_arg), BIG, run_val)
            run_val, run_idx = new_val, new_idx

    # The i-th miss in id order takes the i-th victim.
    hit_i = hit.to(tl.int64)
    miss_rank = tl.cumsum(miss_i, axis=0) - 1
    rank = tl.maximum(miss_rank, 0)
    new_slot = tl.sum(tl.where(lane[None, :] == rank[:, None], run_idx[None, :], 0), axis=1)
    final = tl.where(hit, slot, new_slot)

    old_key = tl.load(slot_key_ptr + new_slot, mask=miss, other=-1)
    tl.store(slot_map_ptr + old_key, tl.full([KP], -1, tl.int64), mask=miss & (old_key >= 0))
    tl.debug_barrier()  # evictions before insertions (distinct keys, but keep the reference's order)
    tl.store(slot_map_ptr + key, new_slot, mask=miss)
    tl.store(slot_key_ptr + new_slot, key, mask=miss)

    clock = tl.load(clock_ptr) + 1
    tl.store(clock_ptr, clock)
    tl.store(stamps_ptr + final, clock * (num_slots + 1) + lane, mask=valid)
    tl.store(hits_ptr, tl.load(hits_ptr) + tl.sum(hit_i, axis=0))
    tl.store(misses_ptr, tl.load(misses_ptr) + count)

    # The plan: misses first (id order), then hits (the reference's stable argsort of hit).
    pos = tl.where(miss, miss_rank, count + tl.cumsum(hit_i, axis=0) - 1)
    tl.store(final_ptr + lane, final, mask=valid)
    tl.store(src_ptr + pos, key, mask=valid)
    tl.store(dst_ptr + pos, tl.where(miss, new_slot, num_slots), mask=valid)
    tl.store(count_ptr, count)


class FusedEnsure:
    """Per-layer output buffers (fixed addresses for the decode graph; a layer's plan is still read by its
    side-stream copy until the layer's join, so layers never share them) and the launch."""

    def __init__(self, num_layers: int, top_k: int, num_slots: int, device: torch.device):
        self.k = top_k
        self.kp = triton.next_power_of_2(top_k)
        self.tile = min(TILE_MAX, triton.next_power_of_2(num_slots))  # stamps scanned per step of the victim pass
        self.final = torch.zeros(num_layers, self.kp, dtype=torch.long, device=device)
        self.src = torch.zeros(num_layers, self.kp, dtype=torch.long, device=device)
        self.dst = torch.zeros(num_layers, self.kp, dtype=torch.long, device=device)
        self.count = torch.zeros(num_layers, 1, dtype=torch.long, device=device)

    def __call__(self, cache, layer: int, ids: torch.Tensor | None, route: tuple | None = None):
        """-> (final slots [k], src [k], dst [k], count [1]) as views of this layer's buffers. route = (logits
        [E + 1] bf16/fp16, E, weights_out [1, k], ids_out [1, k] int64, shared_out [1] fp32): route_topk's work in
        this launch, its outs filled; ids then None (the routed ids ensured) or a trace's ids [1, k]."""
        k = self.k
        if route is None and ids is None:
            raise ValueError("ensure needs the ids, or a route to find them")
        if route is not None and route[3].shape != (1, k):
            raise ValueError(f"route's ids must be [1, {k}] (the cache's top_k)")
        extra = route_args(route, ids)
        if ids is None:
            ids = route[3]
        _ensure_kernel[(1,)](ids.reshape(-1), cache.slot_map, cache.slot_key, cache.stamps, cache.clock,
                             cache.hits, cache.misses, self.final[layer], self.src[layer], self.dst[layer],
                             self.count[layer], layer * cache.num_experts, cache.num_slots,
                             K=k, KP=self.kp, TILE=self.tile, BIG=BIG, num_warps=8, **extra)
        return self.final[layer, :k], self.src[layer, :k], self.dst[layer, :k], self.count[layer]
