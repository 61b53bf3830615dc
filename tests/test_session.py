"""Conversation reuse: turn 2 prefills only new tokens, byte-equal to replaying the same path; regenerate
and edit restore turn snapshots instead of prefilling the history."""
import pytest
import torch

from qwenlocal.engine.events import TurnDone
from qwenlocal.engine.runtime.session import Session, common_prefix

GREEDY = {"temperature": 0, "max_tokens": 12}


def msgs(*turns):
    out = []
    for i, text in enumerate(turns):
        out.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return out


def done(events):
    last = list(events)[-1]
    assert isinstance(last, TurnDone), last
    return last


def greedy_reply(runner, state, logits, n):
    """Decode n greedy tokens on `state`; returns (tokens fed, the logits of each step)."""
    tokens, steps = [], []
    for _ in range(n):
        tok = int(logits[-1].argmax())
        tokens.append(tok)
        logits = runner.decode(state, torch.tensor([tok]))
        steps.append(logits)
    return tokens, steps


def test_turn_two_is_byte_equal_to_replaying_the_same_path(tiny_engine):
    eng = tiny_engine
    runner = eng.runner
    p1 = eng.tokenizer.encode_chat(msgs("Tell me about the sea."))
    b1 = len(eng.tokenizer.encode(eng.tokenizer.render(msgs("Tell me about the sea."), add_generation_prompt=False)))
    session = Session(runner)
    logits1 = session.prefill(p1, boundary=b1)
    reply, _ = greedy_reply(runner, session.state, logits1, 9)
    session.record_generated(reply + [0])  # the last sampled token is never fed back
    assert session.tokens == p1 + reply
    new = eng.tokenizer.encode("<|im_end|>\n<|im_start|>user\nAnd the sky?<|im_end|>\n<|im_start|>assistant\n")
    p2 = p1 + reply + new
    logits2 = session.prefill(p2)
    assert session.last_reused == len(p1) + len(reply)  # only `new` was prefilled

    fresh = runner.new_state()
    runner.prefill(fresh, torch.tensor(p1[:b1]))
    replay1 = runner.prefill(fresh, torch.tensor(p1[b1:]))
    assert torch.equal(replay1, logits1)
    for tok in reply:
        runner.decode(fresh, torch.tensor([tok]))
    replay2 = runner.prefill(fresh, torch.tensor(new))
    assert torch.equal(replay2, logits2)

    # Against one fresh prefill of the whole history: the same up to float32 noise (other kernel shapes).
    whole = runner.prefill(runner.new_state(), torch.tensor(p2))
    assert (whole - logits2).abs().max().item() <= 1e-4


def test_regenerate_restores_the_prompt_snapshot_and_repeats_with_the_same_seed(tiny_engine):
    session = tiny_engine.new_session()
    m = msgs("Write a short poem.")
    sampling = {"temperature": 1.0, "seed": 5, "max_tokens": 16}
    first = done(tiny_engine.chat(m, sampling, session=session))
    again = done(tiny_engine.chat(m, sampling, session=session))
    assert (again.text, again.reasoning) == (first.text, first.reasoning)
    assert again.stats["cached_tokens"] == again.prompt_tokens  # nothing prefilled
    fresh = done(tiny_engine.chat(m, sampling))
    assert (fresh.text, fresh.reasoning) == (first.text, first.reasoning)


def test_next_turn_and_edit_reuse_history(tiny_engine):
    session = tiny_engine.new_session()
    t1 = done(tiny_engine.chat(msgs("Hello there."), GREEDY, session=session))
    history = msgs("Hello there.", t1.text, "What is two plus two?")
    t2 = done(tiny_engine.chat(history, GREEDY, session=session))
    b1 = len(tiny_engine.tokenizer.encode(tiny_engine.tokenizer.render(msgs("Hello there."),
                                                                       add_generation_prompt=False)))
    assert t2.stats["cached_tokens"] >= b1 > 0
    edited = msgs("Hello there.", t1.text, "What is three plus three?")
    t2b = done(tiny_engine.chat(edited, GREEDY, session=session))
    assert t2b.stats["cached_tokens"] >= b1
    # The edited turn's reply is what a fresh, uncached run gives (greedy; same tokens up to fp32 noise).
    fresh = done(tiny_engine.chat(edited, GREEDY))
    assert t2b.text == fresh.text and t2b.reasoning == fresh.reasoning


def test_session_starts_over_when_the_shared_state_was_used_elsewhere(tiny_engine, monkeypatch):
    runner = tiny_engine.runner
    monkeypatch.setattr(type(runner), "shares_state", property(lambda self: True))
    session = Session(runner)
    p = tiny_engine.tokenizer.encode_chat(msgs("Hi"))
    session.prefill(p)
    assert session.tokens == p
    runner.new_state()  # another sequence (score, another chat) took the graph's state
    session.prefill(p)
    assert session.last_reused == 0  # nothing trusted from the overwritten state


@pytest.mark.parametrize("a, b, n", [([1, 2, 3], [1, 2, 4], 2), ([], [1], 0), ([1, 2], [1, 2, 3], 2), ([5], [5], 1)])
def test_common_prefix(a, b, n):
    assert common_prefix(a, b) == n
