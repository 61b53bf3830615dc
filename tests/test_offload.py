"""Expert offload on the CPU: the LRU slot cache against a plain-Python model of it after every step, and the
offloaded engine byte-equal to the all-resident one (same kernels) over >= 180 decode steps."""
import json
from collections import OrderedDict

import pytest
import torch

from qwenlocal.engine import Engine
from qwenlocal.engine.config import parse_model_config
from qwenlocal.engine.errors import OptionError
from qwenlocal.engine.offload.bank import HostExpertBank, split_rows
from qwenlocal.engine.offload.cache import ExpertSlotCache
from qwenlocal.engine.tiny import GEOMETRIES, config_dict


class LruModel:
    """The reference: a dict (layer, expert) -> slot with least-recently-used eviction, free slots first."""

    def __init__(self, slots):
        self.free = list(range(slots))
        self.lru = OrderedDict()  # key -> slot, least recent first

    def step(self, keys):
        out = []
        for key in keys:
            if key in self.lru:
                out.append(self.lru[key])
                continue
            # Never evict a key this step uses (hit or just brought in).
            slot = self.free.pop(0) if self.free else self.lru.pop(next(k for k in self.lru if k not in keys))
            self.lru[key] = slot
            out.append(slot)
        for key in keys:  # this step's keys become the most recent, in top-k order
            self.lru.move_to_end(key)
        return out


def small_cfg(experts=12, top_k=3, layers=3):
    g = GEOMETRIES["tiny"]
    raw = config_dict(g, 640, 1)
    raw["text_config"].update(num_experts=experts, num_experts_per_tok=top_k, num_hidden_layers=layers,
                              layer_types=["linear_attention"] * layers)
    return parse_model_config(raw)


@pytest.mark.parametrize("slots", [3, 7, 20])
def test_slot_cache_matches_a_python_lru_after_every_step(slots):
    cfg = small_cfg()
    e, k = cfg.moe.num_experts, cfg.moe.top_k
    bank = HostExpertBank(cfg, torch.float32, pin=False)
    bank.rows.copy_(torch.arange(bank.rows.shape[0], dtype=torch.float32)[:, None].expand_as(bank.rows))
    cache = ExpertSlotCache(cfg, bank, slots, torch.device("cpu"))
    model = LruModel(slots)
    gen = torch.Generator().manual_seed(slots)
    misses = 0
    for step in range(300):
        layer = step % cfg.num_layers
        # Routes with reuse: often the same few experts, sometimes fresh ones.
        pool = torch.randperm(e, generator=gen)[: k + 2]
        ids = pool[torch.randperm(k + 2, generator=gen)[:k]][None]
        keys = [layer * e + int(x) for x in ids[0]]
        slot_ids, plan = cache.ensure(layer, ids)
        cache.copy_missing(plan)
        expected = model.step(keys)
        assert slot_ids[0].tolist() == expected
        misses += int(plan.count)
        for key, slot in model.lru.items():
            assert int(cache.slot_map[key]) == slot and int(cache.slot_key[slot]) == key
            assert torch.equal(cache.rows[slot], bank.rows[key])  # the slot holds that expert's bytes
        assert int((cache.slot_map[:-1] >= 0).sum()) == len(model.lru)
        gu, dn = split_rows(cache.rows, cfg)
        assert torch.equal(gu[expected[0]], split_rows(bank.rows, cfg)[0][keys[0]])
    assert int(cache.misses) == misses and int(cache.hits) == 300 * k - misses
    assert misses > 0
    if slots > k * cfg.num_layers:  # room for more than one step per layer: some reuse must happen
        assert misses < 300 * k


@pytest.fixture(scope="module")
def resident_and_offloaded(tiny_ckpt):
    opts = {"prefill_chunk": 16}
    resident = Engine.from_pretrained(tiny_ckpt, device="cpu", options=opts)
    few = Engine.from_pretrained(tiny_ckpt, device="cpu", options={**opts, "expert_slots": 6})
    some = Engine.from_pretrained(tiny_ckpt, device="cpu", options={**opts, "expert_slots": 40})
    return resident, few, some


@pytest.mark.parametrize("prefill", [1, 37])
def test_offloaded_logits_are_byte_equal_to_resident(resident_and_offloaded, prefill):
    resident, few, some = resident_and_offloaded
    ids = torch.randint(0, resident.tokenizer.vocab_size, (prefill + 185,), generator=torch.Generator().manual_seed(3))
    ref = resident.score(ids, prefill=prefill)
    for engine in (few, some):
        assert torch.equal(engine.score(ids, prefill=prefill), ref)
    stats = some.stats()
    assert stats["expert_misses"] > 0 and stats["expert_hits"] > 0  # the cache really evicted and reused
    assert few.stats()["hit_rate"] is not None


def test_offloaded_chat_matches_resident(resident_and_offloaded):
    resident, few, _ = resident_and_offloaded
    m = [{"role": "user", "content": "Name three colours."}]
    params = {"temperature": 1.0, "seed": 9, "max_tokens": 20}
    a, b = list(resident.chat(m, params))[-1], list(few.chat(m, params))[-1]
    assert (a.text, a.reasoning) == (b.text, b.reasoning)


def test_bad_slot_counts_are_refused_before_loading(tiny_ckpt):
    for slots in (1, 10_000):
        with pytest.raises(OptionError, match="expert_slots"):
            Engine.from_pretrained(tiny_ckpt, device="cpu", options={"expert_slots": slots})
    with pytest.raises(OptionError):
        Engine.from_pretrained(tiny_ckpt, device="cpu", options={"expert_slots": 0})


def test_bank_rows_are_the_checkpoint_experts(tiny_ckpt):
    from qwenlocal.engine.checkpoint import Checkpoint
    from qwenlocal.engine.config import load_model_config
    from qwenlocal.engine.load import load_weights

    cfg = load_model_config(tiny_ckpt)
    weights = load_weights(Checkpoint(tiny_ckpt), cfg, torch.float32)
    bank = HostExpertBank(cfg, torch.float32, pin=False)
    rest = load_weights(Checkpoint(tiny_ckpt), cfg, torch.float32, expert_sink=bank.put)
    assert not any(".experts." in n for n in rest)
    for layer in range(cfg.num_layers):
        gu, dn = split_rows(bank.layer_rows(layer), cfg)
        assert torch.equal(gu, weights[f"layers.{layer}.mlp.experts.gate_up_proj"])
        assert torch.equal(dn, weights[f"layers.{layer}.mlp.experts.down_proj"])
    assert json.dumps(bank.bytes)  # a plain int, reported by the fit check


def test_zero_copy_gather_kernel_matches_reference():
    pytest.importorskip("triton")
    from qwenlocal.engine.kernels.expert_copy import gather_experts

    device = "cuda" if torch.cuda.is_available() else "cpu"
    bank = torch.randn(30, 1000, pin_memory=device == "cuda")
    rows = torch.full((9, 1000), float("nan"), device=device)
    src = torch.tensor([7, 3, 29, 0], device=device)
    dst = torch.tensor([8, 0, 4, 2], device=device)
    gather_experts(bank, src, dst, torch.tensor([3], device=device), rows, block=256)
    for s, d in [(7, 8), (3, 0), (29, 4)]:
        assert torch.equal(rows[d].cpu(), bank[s])
    assert torch.isnan(rows[2]).all()  # beyond the device-side count: untouched


@pytest.mark.parametrize("dtype, row", [(torch.uint8, 1772), (torch.uint8, 1771), (torch.bfloat16, 998),
                                        (torch.bfloat16, 999)])
def test_zero_copy_gather_as_words_or_not_copies_the_exact_bytes(dtype, row):
    """NVFP4 rows (uint8) and BF16 rows are copied as int32 words when the row is a multiple of 4 bytes, else in
    their own dtype: either way the exact bytes, and rows past the count untouched."""
    pytest.importorskip("triton")
    from qwenlocal.engine.kernels.expert_copy import _as_words, gather_experts

    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(row)
    bank = torch.randint(0, 256, (12, row * torch.finfo(dtype).bits // 8 if dtype.is_floating_point else row),
                         dtype=torch.uint8, generator=gen).view(dtype)
    bank = bank.pin_memory() if device == "cuda" else bank
    rows = torch.zeros(5, row, dtype=dtype, device=device)
    words = (row * bank.element_size()) % 4 == 0
    assert (_as_words(bank) is not None) == words
    src, dst = torch.tensor([11, 2, 5], device=device), torch.tensor([4, 0, 1], device=device)
    gather_experts(bank, src, dst, torch.tensor([2], device=device), rows, block=64)
    got = rows.cpu().view(torch.uint8)
    assert torch.equal(got[4], bank[11].view(torch.uint8)) and torch.equal(got[0], bank[2].view(torch.uint8))
    assert not got[1].any() and not got[2:4].any()  # dst 1 is the third entry, beyond the count
    with pytest.raises(ValueError, match="same length"):
        gather_experts(bank, src, dst, torch.tensor([2], device=device), rows[:, :-1].contiguous())


def test_short_prefill_through_slots_matches_the_lru_model_and_moves_fewer_bytes(tiny_ckpt):
    """ensure_many (a short prompt's distinct experts at once) interleaved with ensure (decode steps) keeps the
    slot map equal to the plain-Python LRU; a short prompt through the slots gives the streamed bytes exactly,
    while only its missing experts cross PCIe."""
    cfg = small_cfg(experts=12, top_k=3, layers=2)
    e = cfg.moe.num_experts
    bank = HostExpertBank(cfg, torch.float32, pin=False)
    bank.rows.copy_(torch.arange(bank.rows.shape[0], dtype=torch.float32)[:, None].expand_as(bank.rows))
    cache, model = ExpertSlotCache(cfg, bank, 9, torch.device("cpu")), LruModel(9)
    gen = torch.Generator().manual_seed(4)
    for step in range(120):
        layer = step % 2
        if step % 3 == 0:  # a short prefill: several tokens at once
            ids = torch.stack([torch.randperm(e, generator=gen)[:3] for _ in range(3)])
            found = cache.ensure_many(layer, ids)
            distinct = sorted(set(ids.flatten().tolist()))
            if len(distinct) > 9:
                assert found is None
                continue
            slots, plan = found
            expected = dict(zip(distinct, model.step([layer * e + x for x in distinct])))
            assert slots.tolist() == [[expected[int(x)] for x in row] for row in ids]
        else:
            ids = torch.randperm(e, generator=gen)[:3][None]
            slots, plan = cache.ensure(layer, ids)
            assert slots[0].tolist() == model.step([layer * e + int(x) for x in ids[0]])
        cache.copy_missing(plan)
        for key, slot in model.lru.items():
            assert int(cache.slot_map[key]) == slot and torch.equal(cache.rows[slot], bank.rows[key])

    streamed = Engine.from_pretrained(tiny_ckpt, device="cpu", options={"expert_slots": 40, "slot_prefill_tokens": 0})
    through = Engine.from_pretrained(tiny_ckpt, device="cpu", options={"expert_slots": 40})
    ids = torch.randint(0, 600, (9 + 20,), generator=torch.Generator().manual_seed(8))
    assert torch.equal(through.score(ids, prefill=9), streamed.score(ids, prefill=9))
    a, b = through.stats(), streamed.stats()
    assert a["prefills_through_slots"] == 1 and b["prefills_through_slots"] == 0
    assert a["prefill_stream_bytes"] == 0 and b["prefill_stream_bytes"] > 0
    assert a["h2d_bytes"] < b["h2d_bytes"]  # the prompt's misses, not every layer's bank


def test_stream_buffers_borrow_slots_and_give_them_back_refilled(tiny_ckpt):
    """With >= 3 layers of slots, prefill's two stream buffers are the trailing 2 x E slots, lent for the prompt
    and refilled from the bank after it; fewer slots keep a dedicated allocation. Same logits either way."""
    e = Engine.from_pretrained(tiny_ckpt, device="cpu").config.moe.num_experts
    opts = {"prefill_chunk": 16, "slot_prefill_tokens": 0}
    lent = Engine.from_pretrained(tiny_ckpt, device="cpu", options={**opts, "expert_slots": 3 * e})
    own = Engine.from_pretrained(tiny_ckpt, device="cpu", options={**opts, "expert_slots": 3 * e - 1})
    assert lent.model.cache.borrows_stream and not own.model.cache.borrows_stream
    assert lent.placement()["prefill_stream_buffers"] == 0 and own.placement()["prefill_stream_buffers"] > 0
    ids = torch.randint(0, 600, (40 + 60,), generator=torch.Generator().manual_seed(9))
    a = lent.score(ids, prefill=40)  # the decode steps fill slots, so the second prompt must refill them
    b = lent.score(ids, prefill=40)
    assert torch.equal(a, b) and torch.equal(a, own.score(ids, prefill=40))
    cache = lent.model.cache
    assert not cache.stream_lent and cache.stream_refill_bytes > 0
    keys = cache.slot_key[:-1]
    for slot in torch.nonzero(keys >= 0).flatten().tolist():
        assert torch.equal(cache.rows[slot], cache.bank.rows[int(keys[slot])])
