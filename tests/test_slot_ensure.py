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
