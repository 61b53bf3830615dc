"""Layer-major prefill on the CPU: bitwise equal to chunked prefill (logits, KV, GDN states, the slot cache
after prefill), with and without windows, for lengths that are and are not multiples of the chunk; one bank
copy per layer per window instead of one per chunk; conversation reuse; cancellation."""
import threading

import pytest
import torch

from qwenlocal.engine import Engine
from qwenlocal.engine.errors import GenerationCancelled

CHUNK = 64


def engines(ckpt, **extra):
    base = {"prefill_chunk": CHUNK, "expert_slots": 20, **extra}
    chunked = Engine.from_pretrained(ckpt, device="cpu", options={**base, "prefill_mode": "chunked"})
    layer_major = Engine.from_pretrained(ckpt, device="cpu", options={**base, "prefill_mode": "layer-major"})
    return chunked, layer_major


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
    ids = torch.randint(0, 600, (length,), generator=torch.Generator().manual_seed(length))
    sa, sb = chunked.runner.new_state(), layer_major.runner.new_state()
    la = chunked.runner.prefill(sa, ids, all_logits=True)
    lb = layer_major.runner.prefill(sb, ids, all_logits=True)
    assert torch.equal(la, lb)
    assert_same_state(state_bytes(sa), state_bytes(sb))
    ca, cb = chunked.model.cache, layer_major.model.cache
    assert torch.equal(ca.slot_map, cb.slot_map) and torch.equal(ca.rows, cb.rows)  # slot cache untouched alike
    # Decode right after resumes identically.
    for tok in (5, 9, 200):
        assert torch.equal(chunked.runner.decode(sa, torch.tensor([tok])), layer_major.runner.decode(sb, torch.tensor([tok])))
    chunks = -(-length // CHUNK)
    windows = 1 if window is None else -(-length // window)
    layers = chunked.config.num_layers
    assert ca.stream_copies == layers * chunks
    assert cb.stream_copies == layers * windows
    assert layer_major.runner.counters["layer_major_windows"] == windows
    per_layer = ca.stream_bytes // ca.stream_copies
    assert cb.stream_bytes == per_layer * layers * windows


def test_score_with_decode_tail_is_bitwise_equal(tiny_ckpt):
    chunked, layer_major = engines(tiny_ckpt)
    ids = torch.randint(0, 600, (CHUNK * 3 + 11 + 180,), generator=torch.Generator().manual_seed(1))
    assert torch.equal(chunked.score(ids, prefill=CHUNK * 3 + 11), layer_major.score(ids, prefill=CHUNK * 3 + 11))


def test_short_prompts_stay_chunked_and_auto_follows_offload(tiny_ckpt):
    _, layer_major = engines(tiny_ckpt)
    layer_major.runner.prefill(layer_major.runner.new_state(), torch.arange(CHUNK))
    assert layer_major.runner.counters == {"prefills_chunked": 1, "prefills_layer_major": 0, "layer_major_windows": 0}
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
