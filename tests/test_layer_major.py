"""Layer-major prefill on the CPU: bitwise equal to chunked prefill (logits, KV, GDN states, the slot cache
after prefill), with and without windows, for lengths that are and are not multiples of the chunk; one bank
copy per layer per window instead of one per chunk; conversation reuse; cancellation. The activations are
parked in borrowed expert slots: a warm slot cache comes back byte-identical (refilled from the bank), too
few slots split the prompt into windows by themselves, and a cancel still gives the slots back."""
import threading

import pytest
import torch

from qwenlocal.engine import Engine
from qwenlocal.engine.errors import GenerationCancelled
from qwenlocal.engine.offload.parking import SlotParking

CHUNK = 64


def engines(ckpt, **extra):
    base = {"prefill_chunk": CHUNK, "expert_slots": 20, **extra}
    chunked = Engine.from_pretrained(ckpt, device="cpu", options={**base, "prefill_mode": "chunked"})
    layer_major = Engine.from_pretrained(ckpt, device="cpu", options={**base, "prefill_mode": "layer-major"})
    return chunked, layer_major


def warm_slots(engine):
    """A short chunked prefill and a few decode steps, so every slot holds an expert the parking must refill."""
    state = engine.runner.new_state()
    engine.runner.prefill(state, torch.arange(40))
    for tok in (3, 7, 11):
        engine.runner.decode(state, torch.tensor([tok]))


def assert_same_slots(ca, cb):
    assert torch.equal(ca.slot_map, cb.slot_map) and torch.equal(ca.slot_key, cb.slot_key)
    assert torch.equal(ca.rows, cb.rows)


def state_bytes(state):
    kv = {i: (c.k[: state.seq_len].clone(), c.v[: state.seq_len].clone()) for i, c in state.kv.items()}
    return state.seq_len, kv, {i: t.clone() for i, t in state.conv.items()}, {i: t.clone() for i, t in state.recurrent.items()}


def assert_same_state(a, b):
    assert a[0] == b[0]
    for part in (1, 2, 3):
        assert a[part].keys() == b[part].keys()
        for i in a[part]:
            x, y = a[part][i], b[part][i]
            assert all(torch.equal(p, q) for p, q in zip(x, y)) if isinstance(x, tuple) else torch.equal(x, y)


@pytest.mark.parametrize("length", [CHUNK * 4, CHUNK * 4 + 37, 150])
@pytest.mark.parametrize("window", [None, 2 * CHUNK])
def test_layer_major_is_bitwise_chunked(tiny_ckpt, length, window):
    chunked, layer_major = engines(tiny_ckpt, prefill_window=window)
    ca, cb = chunked.model.cache, layer_major.model.cache
    for engine in (chunked, layer_major):
        warm_slots(engine)
    assert (cb.slot_key[:-1] >= 0).all()  # the borrowed slots hold experts: give_back must refill them
    copies0 = (ca.stream_copies, cb.stream_copies, ca.stream_bytes, cb.stream_bytes)
    ids = torch.randint(0, 600, (length,), generator=torch.Generator().manual_seed(length))
    sa, sb = chunked.runner.new_state(), layer_major.runner.new_state()
    la = chunked.runner.prefill(sa, ids, all_logits=True)
    lb = layer_major.runner.prefill(sb, ids, all_logits=True)
    assert torch.equal(la, lb)
    assert_same_state(state_bytes(sa), state_bytes(sb))
    assert cb.parking_refill_bytes > 0
    assert_same_slots(ca, cb)  # parked activations gone, experts back: byte-identical slot cache
    # Decode right after resumes identically.
    for tok in (5, 9, 200):
        assert torch.equal(chunked.runner.decode(sa, torch.tensor([tok])), layer_major.runner.decode(sb, torch.tensor([tok])))
    chunks = -(-length // CHUNK)
    windows = 1 if window is None else -(-length // window)
    layers = chunked.config.num_layers
    assert ca.stream_copies - copies0[0] == layers * chunks
    assert cb.stream_copies - copies0[1] == layers * windows
    assert layer_major.runner.counters["layer_major_windows"] == windows
    per_layer = (ca.stream_bytes - copies0[2]) // (ca.stream_copies - copies0[0])
    assert cb.stream_bytes - copies0[3] == per_layer * layers * windows


def test_score_with_decode_tail_is_bitwise_equal(tiny_ckpt):
    chunked, layer_major = engines(tiny_ckpt)
    ids = torch.randint(0, 600, (CHUNK * 3 + 11 + 180,), generator=torch.Generator().manual_seed(1))
    assert torch.equal(chunked.score(ids, prefill=CHUNK * 3 + 11), layer_major.score(ids, prefill=CHUNK * 3 + 11))


def test_short_prompts_stay_chunked_and_auto_follows_offload(tiny_ckpt):
    _, layer_major = engines(tiny_ckpt)
    layer_major.runner.prefill(layer_major.runner.new_state(), torch.arange(CHUNK))
    assert layer_major.runner.counters == {"prefills_chunked": 1, "prefills_layer_major": 0, "layer_major_windows": 0,
                                           "prefills_through_slots": 1}  # 64 tokens: through the slot cache
    auto_offloaded = Engine.from_pretrained(tiny_ckpt, device="cpu", options={"expert_slots": 20})
    auto_resident = Engine.from_pretrained(tiny_ckpt, device="cpu")
    assert auto_offloaded.runner.layer_major and not auto_resident.runner.layer_major
    assert auto_offloaded.plan["prefill_mode"]["value"].startswith("layer-major")


def test_long_new_turn_after_a_cached_prefix_runs_layer_major_on_the_new_tokens(tiny_ckpt):
    chunked, layer_major = engines(tiny_ckpt)
    first = torch.randint(0, 600, (50,), generator=torch.Generator().manual_seed(2)).tolist()
    more = torch.randint(0, 600, (3 * CHUNK + 5,), generator=torch.Generator().manual_seed(3)).tolist()
    results = []
    for engine in (chunked, layer_major):
        session = engine.new_session()
        session.prefill(first)
        results.append(session.prefill(first + more))
        assert session.last_reused == len(first)
    assert torch.equal(*results)
    assert layer_major.runner.counters["prefills_layer_major"] == 1  # only the long new turn


def test_cancel_restores_the_state_within_one_step(tiny_ckpt):
    _, layer_major = engines(tiny_ckpt)
    runner = layer_major.runner
    state = runner.new_state()
    runner.prefill(state, torch.arange(40))
    before = state_bytes(state)
    cancel = threading.Event()
    steps = []
    real = layer_major.model.layers[1].forward

    def counting(*args, **kwargs):
        steps.append(1)
        if len(steps) == 2:
            cancel.set()  # mid-prompt: layer 0 done for all chunks, layer 1 part-way
        return real(*args, **kwargs)

    layer_major.model.layers[1].forward = counting
    with pytest.raises(GenerationCancelled):
        runner.prefill(state, torch.arange(5 * CHUNK), cancel=cancel)
    assert len(steps) == 2  # stopped at the next step after the flag
    after = state_bytes(state)
    assert after[0] == before[0]
    assert all(torch.equal(after[3][i], before[3][i]) for i in before[3])
    assert all(torch.equal(after[2][i], before[2][i]) for i in before[2])


def test_activations_are_parked_in_the_slot_bytes(tiny_ckpt):
    _, layer_major = engines(tiny_ckpt)
    cache, model = layer_major.model.cache, layer_major.model
    warm_slots(layer_major)
    rows = cache.rows
    lo, hi = rows.data_ptr(), rows.data_ptr() + rows[:-1].numel() * rows.element_size()
    inputs = []
    real = model.layers[2].forward

    def recording(x, *args, **kwargs):
        inputs.append(x.data_ptr())
        return real(x, *args, **kwargs)

    model.layers[2].forward = recording
    length = 3 * CHUNK + 9
    layer_major.runner.prefill(layer_major.runner.new_state(), torch.arange(length))
    assert len(inputs) == 4 and all(lo <= p < hi for p in inputs)  # every chunk's input lives in the slots
    slot_bytes = rows.shape[1] * rows.element_size()
    slots = -(-length * model.cfg.hidden_size * model.dtype.itemsize // slot_bytes)
    assert cache.parking_borrowed_bytes == cache.parking_refill_bytes == slots * slot_bytes
    assert all(torch.equal(rows[s], cache.bank.rows[int(k)]) for s, k in enumerate(cache.slot_key[:-1]))


def test_parking_views_any_dtype_over_the_rows(tiny_ckpt):
    _, layer_major = engines(tiny_ckpt)
    cache = layer_major.model.cache
    parking = SlotParking(cache)
    assert parking.capacity_tokens(64, torch.bfloat16) == 2 * parking.capacity_tokens(64, torch.float32)
    park = parking.borrow(100, 64, torch.bfloat16)
    assert park.shape == (100, 64) and park.dtype == torch.bfloat16 and park.data_ptr() == cache.rows.data_ptr()
    park.fill_(1.5)
    parking.give_back()
    assert parking.slots == 0 and not cache.rows[:-1].any()  # never-used slots read as zeros again
    with pytest.raises(ValueError):
        parking.borrow(parking.capacity_tokens(64, torch.float32) + 1, 64, torch.float32)
    # Quantized (uint8, NVFP4) rows lend their bytes the same way, and refill from a uint8 bank.
    from qwenlocal.engine.offload.bank import HostExpertBank
    from qwenlocal.engine.offload.cache import ExpertSlotCache

    bank = HostExpertBank(layer_major.config, torch.float32, pin=False, fmt="nvfp4")
    bank.rows.copy_(torch.randint(0, 255, bank.rows.shape, dtype=torch.uint8))
    cache8 = ExpertSlotCache(layer_major.config, bank, 4, torch.device("cpu"))
    cache8.slot_key[0] = 5
    parking = SlotParking(cache8)
    assert parking.capacity_tokens(8, torch.bfloat16) == 4 * bank.row_bytes // 16
    parking.borrow(12, 8, torch.bfloat16).fill_(3.0)
    parking.give_back()
    assert torch.equal(cache8.rows[0], bank.rows[5]) and not cache8.rows[1:].any()
    assert parking.refill_bytes == bank.row_bytes and cache8.parking_borrowed_bytes == bank.row_bytes


def test_few_slots_split_the_prompt_into_windows_by_themselves(tiny_ckpt):
    top_k = 4  # the fewest slots the cache accepts: room for 384 tokens of activations (6 chunks)
    chunked, layer_major = engines(tiny_ckpt, expert_slots=top_k)
    parking = SlotParking(layer_major.model.cache)
    fit = parking.capacity_tokens(layer_major.config.hidden_size, layer_major.model.dtype) // CHUNK * CHUNK
    length = 10 * CHUNK + 13
    windows = -(-length // fit)
    assert windows == 2
    ids = torch.randint(0, 600, (length,), generator=torch.Generator().manual_seed(4))
    sa, sb = chunked.runner.new_state(), layer_major.runner.new_state()
    assert torch.equal(chunked.runner.prefill(sa, ids, all_logits=True), layer_major.runner.prefill(sb, ids, all_logits=True))
    assert_same_state(state_bytes(sa), state_bytes(sb))
    assert_same_slots(chunked.model.cache, layer_major.model.cache)  # a cold cache: its slots are zeros again
    assert layer_major.runner.counters["layer_major_windows"] == windows
    assert layer_major.model.cache.stream_copies == layer_major.config.num_layers * windows
    for tok in (5, 9):
        assert torch.equal(chunked.runner.decode(sa, torch.tensor([tok])), layer_major.runner.decode(sb, torch.tensor([tok])))


def test_cancel_mid_prefill_gives_the_slots_back(tiny_ckpt):
    _, layer_major = engines(tiny_ckpt)
    cache, model = layer_major.model.cache, layer_major.model
    warm_slots(layer_major)
    before = (cache.rows.clone(), cache.slot_map.clone(), cache.slot_key.clone())
    cancel = threading.Event()
    real = model.layers[1].forward

    def cancelling(*args, **kwargs):
        cancel.set()  # layer 0 has overwritten the parked chunks' bytes by now
        return real(*args, **kwargs)

    model.layers[1].forward = cancelling
    with pytest.raises(GenerationCancelled):
        layer_major.runner.prefill(layer_major.runner.new_state(), torch.arange(4 * CHUNK), cancel=cancel)
    assert cache.parking_refill_bytes > 0
    keys = cache.slot_key[:-1]
    assert (keys >= 0).all() and torch.equal(cache.rows[:-1], cache.bank.rows[keys])
    assert all(torch.equal(a, b) for a, b in zip(before, (cache.rows, cache.slot_map, cache.slot_key)))


@pytest.mark.parametrize("mode", ["chunked", "layer-major"])
def test_every_attention_call_runs_on_its_own_plan_and_no_plan_is_wasted(tiny_ckpt, mode):
    """FlashInfer's plan (prepare) is the expensive host step, and each one now waits for the previous plan's
    copy: layer-major plans right before each attention layer's chunk and nowhere else; chunked once a chunk.
    Either way an attention call always runs on the plan for its own (start, length)."""
    eng = Engine.from_pretrained(tiny_ckpt, device="cpu", options={"prefill_chunk": CHUNK, "expert_slots": 20,
                                                                   "prefill_mode": mode})
    backend, log = eng.model.kernels.attention, []
    prepare, attend = backend.prepare, backend.attend_rows

    def logged_prepare(start, t, decode):
        log.append(("plan", start, t))
        return prepare(start, t, decode)

    def logged_attend(kv, q, start, decode):
        log.append(("attend", start, q.shape[0]))
        return attend(kv, q, start, decode)

    backend.prepare, backend.attend_rows = logged_prepare, logged_attend
    length = 3 * CHUNK + 9
    eng.runner.prefill(eng.runner.new_state(), torch.arange(length))
    plans = [e for e in log if e[0] == "plan"]
    attends = [e for e in log if e[0] == "attend"]
    attention_layers = sum(layer.is_attention for layer in eng.model.layers)
    assert attention_layers >= 1 and len(attends) == attention_layers * 4
    last = None
    for event in log:
        if event[0] == "plan":
            last = event[1:]
        else:
            assert event[1:] == last
    assert len(plans) == (len(attends) if mode == "layer-major" else 4)
