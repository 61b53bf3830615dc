"""The one-launch decode ensure (kernels/slot_ensure.py) against the torch reference (ExpertSlotCache._ensure):
after every step the same slots, plan, slot map, slot keys, stamps, clock and counters (Triton interpreter on
the CPU; on the GPU tier the real kernel)."""
import pytest
import torch
import triton

from qwenlocal.engine.kernels import slot_ensure
from qwenlocal.engine.offload.bank import HostExpertBank
from qwenlocal.engine.offload.cache import ExpertSlotCache
from test_offload import small_cfg

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _pair(cfg, slots):
    bank = HostExpertBank(cfg, torch.float32, pin=False)
    dev = torch.device(DEVICE)
    return (ExpertSlotCache(cfg, bank, slots, dev, fused_ensure=True),
            ExpertSlotCache(cfg, bank, slots, dev, fused_ensure=False))


def _state(cache):
    # The scratch entries (last of slot_map / slot_key) only park the reference's masked writes.
    return (cache.slot_map[:-1], cache.slot_key[:-1], cache.stamps, cache.clock, cache.hits, cache.misses)


# (experts, top_k, layers, slots): one partial tile; one tile of 2,048; top_k not a power of 2; slots == top_k;
# three tiles (TILE_MAX cut to 64, as 4,096 would need > 4,096 slots); a cache holding every expert (after the
# first steps no miss: the scan-free path).
@pytest.mark.parametrize("experts, top_k, layers, slots, tile_max", [
    (12, 3, 3, 7, None), (64, 8, 3, 37, None), (256, 6, 6, 1030, None), (16, 8, 1, 8, None), (64, 8, 4, 150, 64),
    (16, 4, 2, 32, None)])
def test_fused_ensure_matches_the_torch_reference(experts, top_k, layers, slots, tile_max, monkeypatch):
    if tile_max is not None:
        monkeypatch.setattr(slot_ensure, "TILE_MAX", tile_max)
    cfg = small_cfg(experts=experts, top_k=top_k, layers=layers)
    fused, ref = _pair(cfg, slots)
    assert fused._fused is not None and ref._fused is None
    assert fused._fused.tile == min(tile_max or slot_ensure.TILE_MAX, triton.next_power_of_2(slots))
    gen = torch.Generator().manual_seed(slots)
    steps = 300 if slots > 100 else 120  # > slots misses: the big cases evict too
    seen_hits = seen_evictions = seen_all_hits = 0
    for step in range(steps):
        layer = step % layers
        pool = torch.randperm(experts, generator=gen)[: top_k + 3]  # reuse: some hits, some misses
        ids = pool[torch.randperm(top_k + 3, generator=gen)[:top_k]][None].to(DEVICE)
        before = int(ref.misses)
        a_slots, a_plan = fused.ensure(layer, ids)
        b_slots, b_plan = ref.ensure(layer, ids)
        assert torch.equal(a_slots, b_slots), step
        assert torch.equal(a_plan.count, b_plan.count), step
        assert torch.equal(a_plan.src, b_plan.src) and torch.equal(a_plan.dst, b_plan.dst), step
        for x, y in zip(_state(fused), _state(ref)):
            assert torch.equal(x, y), step
        seen_hits += int(ref.misses) - before < top_k
        seen_all_hits += int(ref.misses) == before
        seen_evictions += int((ref.slot_key[:-1] >= 0).sum()) == slots and int(ref.misses) > before
    assert seen_hits and seen_evictions  # both paths of the kernel ran
    if experts * layers <= slots:
        assert seen_all_hits  # steps without a miss (no victim scan) ran too


@pytest.mark.parametrize("traced", [False, True])
@pytest.mark.parametrize("experts, top_k, slots", [(13, 5, 9), (64, 8, 37)])
def test_the_ensure_routing_first_is_route_topk_then_ensure(experts, top_k, slots, traced):
    """slot_ensure.ROUTE (route=): the ensure launch does route_topk's work from 16-bit logits first and ensures
    the ids it found (or a trace's): step after step, the same slots, plan and cache state as route_topk + the
    ensure given its ids, and route_topk's weights, ids and shared gate byte for byte."""
    from qwenlocal.engine.kernels.decode_router import route_topk
    from test_kernels_decode_fused import distinct_logits

    cfg = small_cfg(experts=experts, top_k=top_k, layers=2)
    bank = HostExpertBank(cfg, torch.float32, pin=False)
    dev = torch.device(DEVICE)
    routed, given = (ExpertSlotCache(cfg, bank, slots, dev, fused_ensure=True) for _ in range(2))
    gen = torch.Generator().manual_seed(experts)
    for step in range(24):
        layer = step % 2
        logits = distinct_logits(experts, 100 * experts + step, torch.bfloat16)
        ref_w, ref_ids, ref_shared = route_topk(logits, experts, top_k, torch.bfloat16)
        trace = torch.randperm(experts, generator=gen)[:top_k][None].to(DEVICE) if traced else None
        outs = (torch.full((1, top_k), float("nan"), dtype=torch.bfloat16, device=DEVICE),
                torch.full((1, top_k), -1, dtype=torch.int64, device=DEVICE),
                torch.full((1,), float("nan"), device=DEVICE))
        a_slots, a_plan = routed.ensure(layer, trace, route=(logits, experts, *outs))
        b_slots, b_plan = given.ensure(layer, trace if traced else ref_ids)
        assert torch.equal(outs[0], ref_w) and torch.equal(outs[1], ref_ids) and torch.equal(outs[2], ref_shared)
        assert torch.equal(a_slots, b_slots) and torch.equal(a_plan.count, b_plan.count), step
        assert torch.equal(a_plan.src, b_plan.src) and torch.equal(a_plan.dst, b_plan.dst), step
        for x, y in zip(_state(routed), _state(given)):
            assert torch.equal(x, y), step
    assert int(given.misses) > 0 and int(given.hits) > 0


def test_the_ensure_refuses_a_route_it_cannot_take():
    from test_kernels_decode_fused import distinct_logits

    cfg = small_cfg(experts=13, top_k=5, layers=1)
    bank = HostExpertBank(cfg, torch.float32, pin=False)
    outs = (torch.empty(1, 5, dtype=torch.bfloat16, device=DEVICE), torch.empty(1, 5, dtype=torch.int64, device=DEVICE),
            torch.empty(1, device=DEVICE))
    torch_ensure = ExpertSlotCache(cfg, bank, 9, torch.device(DEVICE), fused_ensure=False)
    with pytest.raises(ValueError, match="one-launch ensure"):
        torch_ensure.ensure(0, None, route=(distinct_logits(13, 1, torch.bfloat16), 13, *outs))
    fused = ExpertSlotCache(cfg, bank, 9, torch.device(DEVICE), fused_ensure=True)
    with pytest.raises(ValueError, match="bf16/fp16"):
        fused.ensure(0, None, route=(distinct_logits(13, 1, torch.float32), 13, *outs))
    with pytest.raises(ValueError, match="the ids, or a route"):
        fused.ensure(0, None)
