"""Sampling, the generation loop and Engine.chat on a tiny checkpoint (CPU)."""
import threading

import pytest
import torch

from qwenlocal.engine.errors import ContextLimitError, OptionError
from qwenlocal.engine.events import ReasoningDelta, Stats, TokenDelta, TurnDone
from qwenlocal.engine.runtime.sampler import SamplingParams, defaults_from_generation_config, sample

MSG = [{"role": "user", "content": "Tell me about the sea."}]


def test_greedy_is_argmax_and_top_k_1_agrees():
    logits = torch.randn(50, generator=torch.Generator().manual_seed(0))
    assert sample(logits, SamplingParams(temperature=0), None) == int(logits.argmax())
    gen = torch.Generator().manual_seed(1)
    assert sample(logits, SamplingParams(temperature=1.0, top_k=1), gen) == int(logits.argmax())


def test_top_p_keeps_the_smallest_covering_set():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    gen = torch.Generator().manual_seed(0)
    seen = {sample(logits, SamplingParams(temperature=1.0, top_p=0.7), gen) for _ in range(300)}
    assert seen == {0, 1}


def test_seeded_sampling_is_reproducible():
    logits = torch.randn(1000)
    params = SamplingParams(temperature=0.8, top_p=0.9, top_k=50)
    draws = [[sample(logits, params, torch.Generator().manual_seed(5)) for _ in range(3)] for _ in range(2)]
    assert draws[0] == draws[1]


def test_sampled_frequencies_follow_the_top_k_top_p_distribution():
    """The inverse-CDF draw over the kept tokens: frequencies within 4 sigma of the renormalized probabilities,
    and never a token outside the top-k / top-p set."""
    logits = torch.randn(300, generator=torch.Generator().manual_seed(2)) * 2
    params = SamplingParams(temperature=0.7, top_k=12, top_p=0.8)
    probs = torch.softmax(logits / 0.7, -1)
    top, order = torch.topk(probs, 12)
    top = top / top.sum()
    keep = (top.cumsum(0) - top) < 0.8
    want = torch.zeros(300, dtype=torch.float64)
    want[order[keep]] = (top[keep] / top[keep].sum()).double()
    n = 6000
    gen = torch.Generator().manual_seed(9)
    counts = torch.bincount(torch.tensor([sample(logits, params, gen) for _ in range(n)]), minlength=300).double()
    assert set(counts.nonzero().flatten().tolist()) <= set(order[keep].tolist())
    sigma = (n * want * (1 - want)).sqrt()
    assert ((counts - n * want).abs() <= 4 * sigma + 1).all()


def test_pure_temperature_sampling_never_draws_a_zero_probability_token():
    logits = torch.full((64,), -1e4)
    logits[[3, 40]] = 0.0  # exp(-1e4) is 0 in fp32: only these two can be drawn
    gen = torch.Generator().manual_seed(0)
    assert {sample(logits, SamplingParams(temperature=1.0), gen) for _ in range(400)} == {3, 40}


def test_sample_tensor_stays_a_tensor_and_never_picks_padding_rows():
    from qwenlocal.engine.runtime.generate import _valid
    from qwenlocal.engine.runtime.sampler import sample_tensor

    logits = torch.zeros(40)
    logits[32:] = 50.0  # the padding rows would win every draw if they were kept
    picked = sample_tensor(_valid(logits, 32), SamplingParams(temperature=1.0, top_k=5), torch.Generator())
    assert picked.shape == (1,) and picked.dtype == torch.int64 and int(picked) < 32
    assert int(sample_tensor(_valid(logits, 32), SamplingParams(temperature=0), None)) < 32


@pytest.mark.parametrize("bad", [{"temperature": -1}, {"top_p": 0}, {"top_p": 1.5}, {"top_k": -2},
                                 {"max_tokens": 0}, {"seed": "x"}])
def test_bad_sampling_values_are_rejected(bad):
    with pytest.raises(OptionError):
        SamplingParams().updated(bad)


def test_unknown_sampling_key_is_rejected():
    with pytest.raises(OptionError, match="unknown sampling"):
        SamplingParams().updated({"temprature": 0.5})


def test_generation_config_defaults(tiny_ckpt):
    p = defaults_from_generation_config(tiny_ckpt)
    assert (p.temperature, p.top_p, p.top_k) == (1.0, 0.95, 20)


def test_greedy_generation_follows_score_argmax(tiny_engine):
    """Greedy tokens from prefill + decode steps are the argmax of teacher-forced logits of the same sequence."""
    from qwenlocal.engine.runtime.generate import GenerationStats, generate_tokens

    prompt = tiny_engine.tokenizer.encode_chat(MSG, enable_thinking=False)
    runner = tiny_engine.runner
    tokens = list(generate_tokens(runner, runner.new_state(), prompt, SamplingParams(temperature=0, max_tokens=12),
                                  (), GenerationStats(), vocab_limit=tiny_engine.tokenizer.vocab_size))
    assert len(tokens) == 12
    logits = tiny_engine.score(prompt + tokens[:-1], prefill=len(prompt))
    assert logits[len(prompt) - 1:, : tiny_engine.tokenizer.vocab_size].argmax(-1).tolist() == tokens


def test_chat_events_and_max_tokens(tiny_engine):
    events = list(tiny_engine.chat(MSG, {"temperature": 1.0, "seed": 3, "max_tokens": 20}))
    done = events[-1]
    assert isinstance(done, TurnDone)
    assert done.completion_tokens <= 20
    if done.finish_reason == "length":
        assert done.completion_tokens == 20
    streamed_answer = "".join(e.text for e in events if isinstance(e, TokenDelta))
    streamed_reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    assert streamed_answer == done.text and streamed_reasoning == done.reasoning
    assert done.stats["prompt_tokens"] == done.prompt_tokens
    assert all(isinstance(e, (TokenDelta, ReasoningDelta, Stats)) for e in events[:-1])


def test_same_seed_same_reply(tiny_engine):
    runs = [list(tiny_engine.chat(MSG, {"temperature": 1.0, "seed": 11, "max_tokens": 16}))[-1] for _ in range(2)]
    assert runs[0].text == runs[1].text and runs[0].reasoning == runs[1].reasoning


def test_thinking_off_starts_in_the_answer(tiny_engine):
    text = tiny_engine.tokenizer.render(MSG, enable_thinking=False)
    assert text.endswith("<think>\n\n</think>\n\n")
    done = list(tiny_engine.chat(MSG, {"temperature": 1.0, "seed": 2, "max_tokens": 16}, enable_thinking=False))[-1]
    # With thinking off no reasoning segment opens, even where the model emits a <think> token (think_split.py).
    assert done.reasoning == ""


def test_count_tokens_is_the_prompt_chat_builds(tiny_engine):
    for thinking in (True, False):
        done = list(tiny_engine.chat(MSG, {"max_tokens": 1}, enable_thinking=thinking))[-1]
        assert tiny_engine.count_tokens(MSG, enable_thinking=thinking) == done.prompt_tokens


def test_cancel_stops_within_one_step(tiny_engine):
    cancel = threading.Event()
    produced = 0
    for event in tiny_engine.chat(MSG, {"temperature": 1.0, "seed": 4, "max_tokens": 200}, cancel=cancel):
        if isinstance(event, (TokenDelta, ReasoningDelta)):
            produced += 1
            if produced == 3:
                cancel.set()
        if isinstance(event, TurnDone):
            done = event
    assert done.finish_reason == "cancelled"
    # Tokens already sampled when the flag was set may still stream; no new decode step runs.
    assert done.completion_tokens <= 6


def test_bad_messages_fail_before_any_work(tiny_engine):
    with pytest.raises(OptionError, match="role"):
        tiny_engine.chat([{"role": "wizard", "content": "hi"}])
    with pytest.raises(OptionError):
        tiny_engine.chat([])


def test_prompt_past_the_context_is_a_clear_error(tiny_ckpt):
    from qwenlocal.engine import Engine

    small = Engine.from_pretrained(tiny_ckpt, device="cpu", options={"max_context": 16})
    with pytest.raises(ContextLimitError, match="context limit"):
        small.chat(MSG)
    with pytest.raises(ContextLimitError):
        small.score(list(range(17)))


def test_reply_stops_at_the_context_limit(tiny_ckpt):
    from qwenlocal.engine import Engine

    prompt_len = len(Engine.from_pretrained(tiny_ckpt, device="cpu").tokenizer.encode_chat(MSG))
    small = Engine.from_pretrained(tiny_ckpt, device="cpu", options={"max_context": prompt_len + 4})
    done = list(small.chat(MSG, {"temperature": 1.0, "seed": 1, "max_tokens": 50}))[-1]
    assert done.finish_reason in ("context", "stop") and done.completion_tokens <= 5


def test_score_argument_checks(tiny_engine):
    with pytest.raises(OptionError):
        tiny_engine.score([1, 2, 3], prefill=4)
    with pytest.raises(OptionError):
        tiny_engine.score([tiny_engine.config.vocab_size])
    assert tiny_engine.score([1, 2, 3], prefill=0).shape == (3, tiny_engine.config.vocab_size)


def test_padding_rows_of_the_vocabulary_are_never_sampled(tiny_engine):
    limit = tiny_engine.tokenizer.vocab_size
    assert limit < tiny_engine.config.vocab_size  # the tiny embedding is padded like the real one
    for seed in range(5):
        done = list(tiny_engine.chat(MSG, {"temperature": 2.0, "top_p": 1.0, "top_k": 0, "seed": seed,
                                           "max_tokens": 40}))[-1]
        assert isinstance(done, TurnDone)


def test_special_tokens_never_reach_the_reply_text(tiny_engine):
    specials = ["<|vision_start|>", "<|im_start|>", "<|endoftext|>", "<|image_pad|>"]
    for seed in range(6):
        done = list(tiny_engine.chat(MSG, {"temperature": 3.0, "top_k": 0, "top_p": 1.0, "seed": seed,
                                           "max_tokens": 60}))[-1]
        assert not any(s in done.text or s in done.reasoning for s in specials)


def _reference_loop(runner, prompt, params, eos_ids, vocab_limit):
    """The loop one step at a time (sample, read, then decode): what generate_tokens must equal."""
    from qwenlocal.engine.runtime.generate import _valid

    gen = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
    state = runner.new_state()
    logits = runner.prefill(state, torch.tensor(prompt))
    out = []
    while True:
        token = sample(_valid(logits[-1], vocab_limit), params, gen)
        out.append(token)
        if token in eos_ids or len(out) == params.max_tokens:
            return out, state.seq_len
        logits = runner.decode(state, torch.tensor([token]))


@pytest.mark.parametrize("params", [SamplingParams(temperature=0, max_tokens=9),
                                    SamplingParams(temperature=0.9, top_p=0.9, top_k=30, seed=4, max_tokens=9)])
def test_the_loop_a_step_ahead_gives_the_one_step_loops_tokens(tiny_engine, params):
    """generate_tokens launches the next decode before reading a token's id: the same tokens and draws as the
    plain loop; at max_tokens the last token is not fed (max_tokens - 1 decodes), at EOS the step launched ahead
    has fed it (state.seq_len counts the EOS)."""
    from qwenlocal.engine.runtime.generate import GenerationStats, generate_tokens

    runner, limit = tiny_engine.runner, tiny_engine.tokenizer.vocab_size
    prompt = tiny_engine.tokenizer.encode_chat(MSG, enable_thinking=False)
    want, want_len = _reference_loop(runner, prompt, params, (), limit)
    state, stats = runner.new_state(), GenerationStats()
    got = list(generate_tokens(runner, state, prompt, params, (), stats, vocab_limit=limit))
    assert got == want and stats.finish_reason == "length"
    assert state.seq_len == want_len == len(prompt) + params.max_tokens - 1
    eos = (want[3],)  # stop at the first time that id comes
    stop = want.index(want[3]) + 1
    state, stats = runner.new_state(), GenerationStats()
    got = list(generate_tokens(runner, state, prompt, params, eos, stats, vocab_limit=limit))
    assert got == want[:stop] and stats.finish_reason == "stop" and stats.completion_tokens == stop
    assert state.seq_len == len(prompt) + stop  # the EOS too: the step ahead consumed it


def test_a_session_records_the_eos_the_step_ahead_fed(tiny_engine, monkeypatch):
    """After a reply that ends with EOS the session's tokens are the prompt and the whole reply, EOS included,
    so the next prompt that extends them (the template writes the EOS after a reply) prefills only what is new."""
    greedy = {"temperature": 0, "max_tokens": 12}
    first = tiny_engine.new_session()
    assert list(tiny_engine.chat(MSG, greedy, session=first))[-1].finish_reason == "length"
    reply = first.tokens[-11:]  # length: the prompt and 11 of the 12 tokens were fed
    monkeypatch.setattr(tiny_engine, "eos_ids", (reply[4],))  # the tiny model's own EOS never comes this early
    session = tiny_engine.new_session()
    done = list(tiny_engine.chat(MSG, greedy, session=session))[-1]
    assert done.finish_reason == "stop"
    held = session.tokens
    assert held[-1] == reply[4] and held[-(reply.index(reply[4]) + 1):] == reply[:reply.index(reply[4]) + 1]
    assert session.state.seq_len == len(held)
    session.prefill(held + tiny_engine.tokenizer.encode("\nmore"))
    assert session.last_reused == len(held)
