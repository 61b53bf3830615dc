"""The sampler's draw in two launches (kernels/sample_fused.py) against sample_tensor's torch arithmetic
(sampler.draw) on awkward vocabulary sizes: the same id for uniforms away from the CDF's boundaries (where
the order of the float sums cannot decide), top-k with and without top-p, the no-cut draw over whole chunks and a
ragged last one, ties to the lower id, the cases it leaves to torch; and sample_tensor with the switch on draws
the same tokens from the same seeds. In Triton's interpreter on the CPU, natively on a GPU."""
import pytest
import torch

pytest.importorskip("triton")

from qwenlocal.engine.kernels import sample_fused  # noqa: E402
from qwenlocal.engine.kernels.sample_fused import handles, sample  # noqa: E402
from qwenlocal.engine.runtime import sampler  # noqa: E402
from qwenlocal.engine.runtime.sampler import SamplingParams, draw, sample_tensor  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _logits(v: int, seed: int) -> torch.Tensor:
    """Distinct fp32 logits (a permutation of spaced values: no ties for topk's unspecified order)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randperm(v, generator=g).float() * (6.0 / v) - 3.0).to(DEVICE)


def _inner_uniforms(logits: torch.Tensor, temperature: float, top_k: int, top_p: float, picks: int = 12):
    """(u, expected id) pairs: u at the middle of a kept token's CDF interval (float64 from the reference's kept
    set), so that no float ordering can move the draw across a boundary."""
    scores = logits.double().cpu() / temperature
    order = torch.argsort(scores, descending=True)
    if top_k and top_k < scores.numel():
        order = order[:top_k]
        probs = torch.softmax(scores[order], 0)
        if top_p < 1.0:
            probs = probs.masked_fill(probs.cumsum(0) - probs >= top_p, 0.0)
    else:
        order = torch.arange(scores.numel())
        probs = torch.softmax(scores, 0)
    cdf = probs.cumsum(0) / probs.sum()
    lows = torch.cat([torch.zeros(1, dtype=cdf.dtype), cdf[:-1]])
    live = torch.nonzero(probs > 1e-6).flatten()
    chosen = live[torch.linspace(0, live.numel() - 1, min(picks, live.numel())).long()]
    return [(float((lows[i] + cdf[i]) / 2), int(order[i])) for i in chosen]


@pytest.mark.parametrize("v, top_k, top_p, temperature", [
    (5000, 20, 0.95, 1.0), (2049, 1, 1.0, 1.0), (4097, 64, 0.5, 1.3), (3001, 7, 1.0, 0.6), (2048, 20, 0.3, 1.0),
    (248_320, 20, 0.95, 1.0)])
def test_top_k_draws_the_references_id(v, top_k, top_p, temperature):
    logits = _logits(v, v + top_k)
    for u, want in _inner_uniforms(logits, temperature, top_k, top_p, picks=4 if v > 100_000 else 12):
        got = sample(logits, temperature, top_k, top_p, u)
        assert got.dtype == torch.int64 and got.shape == (1,) and got.device == logits.device
        assert int(got) == want == int(draw(logits, temperature, top_k, top_p, u)), u


@pytest.mark.parametrize("v, temperature", [(3000, 0.7), (2048, 1.0), (4097, 1.0), (248_320, 1.0), (17, 2.0)])
def test_the_no_cut_draw_finds_the_references_id_across_chunks(v, temperature):
    logits = _logits(v, v)
    for u, want in _inner_uniforms(logits, temperature, 0, 1.0, picks=6 if v > 100_000 else 16):
        assert int(sample(logits, temperature, 0, 1.0, u)) == want == int(
            draw(logits, temperature, 0, 1.0, u)), u


def test_random_uniforms_agree_with_the_reference():
    """Uniforms as the generator draws them (no care for boundaries): the same ids (a boundary within an ulp is
    ~1e-6 likely a draw)."""
    g = torch.Generator().manual_seed(3)
    for v, k, p in [(5003, 20, 0.95), (6000, 0, 1.0)]:
        logits = torch.randn(v, generator=g).mul(2.5).to(DEVICE)
        for u in torch.rand(24, generator=g).tolist():
            assert int(sample(logits, 1.0, k, p, u)) == int(draw(logits, 1.0, k, p, u))


def test_ties_take_the_lower_id_and_a_chunk_of_minus_inf_has_no_mass():
    logits = torch.full((4100,), -5.0, device=DEVICE)
    logits[3000] = logits[100] = 4.0  # equal best: rank 0 is id 100, rank 1 id 3000
    assert int(sample(logits, 1.0, 2, 1.0, 0.1)) == 100
    assert int(sample(logits, 1.0, 2, 1.0, 0.9)) == 3000
    logits[:2048] = float("-inf")  # the first chunk holds no mass: the draw lands after it
    logits[3000] = 4.0
    assert int(sample(logits, 1.0, 0, 1.0, 0.0)) >= 2048
    assert int(sample(logits, 1.0, 0, 1.0, 0.5)) == 3000


def test_the_cases_left_to_torch():
    x = torch.zeros(100, device=DEVICE)
    assert handles(x, 1.0, 20, 0.95) and handles(x, 1.0, 0, 1.0) and handles(x, 1.0, 100, 1.0)
    assert not handles(x, 0.0, 20, 1.0)  # greedy: argmax
    assert not handles(x, 1.0, 0, 0.9)  # top-p alone: a full sort
    assert not handles(x, 1.0, sample_fused.MAX_K + 1, 1.0)
    assert not handles(x[::2], 1.0, 5, 1.0) and not handles(x[None], 1.0, 5, 1.0)
    with pytest.raises(ValueError, match="top-k 1"):
        sample(x, 1.0, 0, 0.9, 0.5)


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0, top_p=0.95, top_k=20),
                                    SamplingParams(temperature=0.8), SamplingParams(temperature=0.0),
                                    SamplingParams(temperature=1.0, top_p=0.9)])
def test_sample_tensor_with_the_switch_draws_the_same_tokens(params, monkeypatch):
    """FUSED_DRAW: the same generator draw (one uniform a token), the same ids; greedy and top-p alone stay on torch."""
    logits = torch.randn(3000, generator=torch.Generator().manual_seed(9)).mul(3).to(DEVICE)
    monkeypatch.setattr(sampler, "FUSED_DRAW", False)
    plain = [int(sample_tensor(logits, params, torch.Generator().manual_seed(s))) for s in range(8)]
    monkeypatch.setattr(sampler, "FUSED_DRAW", True)
    if DEVICE == "cpu":  # the engine draws CPU logits with torch; here the kernel runs in Triton's interpreter
        monkeypatch.setattr(sampler, "_fused_draw_for", lambda x: sample_fused)
    called, real = [], sample_fused.sample
    monkeypatch.setattr(sample_fused, "sample", lambda *a: called.append(1) or real(*a))
    fused = [int(sample_tensor(logits, params, torch.Generator().manual_seed(s))) for s in range(8)]
    assert fused == plain
    assert bool(called) == handles(logits, params.temperature, params.top_k, params.top_p)


def test_the_switch_leaves_cpu_logits_to_torch(monkeypatch):
    """FUSED_DRAW (on by default) draws only CUDA logits: the engine's CPU path has no Triton device to run on."""
    monkeypatch.setattr(sampler, "FUSED_DRAW", True)
    assert sampler._fused_draw_for(torch.zeros(3000)) is None
    monkeypatch.setattr(sampler, "FUSED_DRAW", False)
    assert sampler._fused_draw_for(torch.zeros(3000)) is None
