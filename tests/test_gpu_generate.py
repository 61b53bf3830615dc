"""GPU tier of the chat's decode loop (runtime/generate.py): a step ahead, sampled on the device, the ids read
through pinned memory behind an event; the same tokens as the one-step loop, and a negative control: a read
that does not wait for its event gets the id before its copy lands."""
import pytest
import torch

from qwenlocal.engine import Engine
from qwenlocal.engine.runtime.generate import GenerationStats, TokenReader, generate_tokens
from qwenlocal.engine.runtime.sampler import SamplingParams, sample

pytestmark = pytest.mark.gpu
PARAMS = SamplingParams(temperature=0.9, top_p=0.9, top_k=40, seed=7, max_tokens=150)


def _one_step_loop(runner, prompt, params):
    gen = torch.Generator().manual_seed(params.seed)
    state = runner.new_state()
    logits = runner.prefill(state, torch.tensor(prompt, device="cuda"))
    out = []
    while True:
        out.append(sample(logits[-1][:600], params, gen))
        if len(out) == params.max_tokens:
            return out
        logits = runner.decode(state, torch.tensor([out[-1]], device="cuda"))


def test_the_loop_a_step_ahead_gives_the_one_step_loops_tokens_on_the_gpu():
    eng = Engine.from_pretrained("synthetic:small-nvfp4", device="cuda", dtype=torch.bfloat16)
    prompt = list(range(5, 80))
    want = _one_step_loop(eng.runner, prompt, PARAMS)
    got = list(generate_tokens(eng.runner, eng.runner.new_state(), prompt, PARAMS, (), GenerationStats(),
                               vocab_limit=600))
    assert got == want


def test_a_read_that_skips_its_event_sees_the_id_before_its_copy(monkeypatch):
    """Negative control: with the GPU held busy before the copy, the pinned buffer still has the last id when
    an unguarded read looks; the guarded read waits and sees this one."""
    reader = TokenReader(torch.device("cuda"))
    for guarded in (True, False):
        reader._host.fill_(-1)
        picked = torch.tensor([1234], device="cuda")  # before the sleep: a copy from pageable memory syncs
        torch.cuda._sleep(50_000_000)  # ~25 ms of GPU time queued before the copy
        reader.stage(picked)
        if not guarded:
            monkeypatch.setattr(reader._event, "synchronize", lambda: None)
        seen = reader.read()
        assert (seen == 1234) == guarded
        torch.cuda.synchronize()
