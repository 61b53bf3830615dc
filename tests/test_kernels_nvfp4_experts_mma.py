"""The tensor-core NVFP4 expert gate/up (kernels/nvfp4_experts_mma.py) against expert_gate_up's torch reference
on awkward sizes (masked row tiles, K split over programs, the shared expert, bf16/fp32 x, every code and scale
byte), its split combine (counters back at 0; a negative control where a program is told it arrived last), bank
vs slot rows byte for byte, and the fused decode step with it on the tiny checkpoint. In Triton's interpreter on
the CPU; natively (the inline-PTX decode, real streams) on the GPU tier."""
import pytest
import torch

pytest.importorskip("triton")

from qwenlocal.engine.kernels.nvfp4_experts_decode import expert_gate_up_reference  # noqa: E402
from qwenlocal.engine.kernels.nvfp4_experts_mma import (  # noqa: E402
    expert_gate_up_mma, fp16_safe_norm, step_codes,
)
from qwenlocal.engine.kernels.nvfp4_grouped import random_nvfp4_rows  # noqa: E402
from test_kernels_nvfp4_experts_decode import DEVICE, _dev, _problem, _to_dev, slot_copy  # noqa: E402


def _rel(out, ref):
    out, ref = out.cpu().float(), ref.cpu().float()
    assert torch.isfinite(out).all()
    return ((out - ref).abs().max() / ref.abs().max()).item()


# (H, I, E, ids with repeats); I = 48 leaves a masked row tile at block_n 32
SIZES = [(512, 48, 6, [5, 0, 3, 3, 1]), (256, 32, 4, [2, 1])]
CONFIGS = [dict(split=1), dict(split=2, block_n=32), dict(split=2, scale_in_a=False), dict(split=4, block_n=16)]


@pytest.mark.parametrize("hidden, inter, experts, ids", SIZES)
@pytest.mark.parametrize("with_extra, dtype", [(True, torch.bfloat16), (False, torch.float32)])
def test_gate_up_matches_the_reference(hidden, inter, experts, ids, with_extra, dtype, nan_empty):
    """bf16 x converts to fp16 exactly, so the products are exact and the sums fp32: ~1e-6 of the largest
    output. fp32 x rounds to fp16 (11 bits): ~1e-4."""
    x, _, ids_t, rows, shared, _, _ = _problem(hidden, inter, experts, ids, hidden + with_extra, dtype)
    extra = shared[0] + shared[1] if with_extra else None
    ref = expert_gate_up_reference(x, ids_t, rows, hidden, inter, extra)
    for cfg in CONFIGS:
        if step_codes(hidden, cfg["split"], cfg.get("scale_in_a", True)) is None:
            continue
        out = expert_gate_up_mma(*_dev(x, ids_t, rows), hidden, inter, _to_dev(extra) if extra else None, **cfg)
        assert out.dtype == torch.float32 and out.shape == ref.shape
        assert _rel(out, ref) < (1e-5 if dtype == torch.bfloat16 else 1e-3), cfg


def test_every_code_and_scale_byte(nan_empty):
    """Uniform random bytes: every E2M1 code and E4M3 scale byte (subnormal and negative scales included). The
    scaled fp16 weights round where e2m1 * scale < 1 (fp16 subnormals): far below the row's largest terms."""
    hidden, inter = 256, 32
    gen = torch.Generator().manual_seed(4)
    rows = random_nvfp4_rows(5, hidden, inter, generator=gen, scale_bits=(0, 256))
    ids = torch.tensor([[4, 1, 1, 0]])
    x = torch.randn(1, hidden, generator=gen).to(torch.bfloat16)
    ref = expert_gate_up_reference(x, ids, rows, hidden, inter)
    for cfg in (dict(split=1), dict(split=1, scale_in_a=False)):
        assert _rel(expert_gate_up_mma(*_dev(x, ids, rows), hidden, inter, **cfg), ref) < 1e-4, cfg


def test_split_combine_resets_its_counters_and_a_false_last_arrival_changes_the_bytes(nan_empty):
    """The tile's last program adds the partials in a fixed order and puts the counter back to 0: two launches
    through one set of counters give the same bytes. Negative control: a counter preset to "all but one
    arrived" makes the first program of that tile combine partials not yet written (NaN-poisoned here)."""
    hidden, inter = 512, 32
    x, _, ids_t, rows, shared, _, _ = _problem(hidden, inter, 5, [1, 4], 21, torch.bfloat16)
    args = (*_dev(x, ids_t, rows), hidden, inter, _to_dev(shared[0] + shared[1]))
    counters = torch.zeros(3 * 2, dtype=torch.int32, device=DEVICE)  # 3 experts x 2 row tiles of 16
    first = expert_gate_up_mma(*args, split=2, counters=counters)
    assert torch.count_nonzero(counters) == 0
    assert torch.equal(expert_gate_up_mma(*args, split=2, counters=counters), first)
    if DEVICE == "cpu":  # the interpreter runs a tile's programs in order: program 0 arrives first
        counters[2] = 1  # expert 1, row tile 0: "one of two already arrived"
        wrong = expert_gate_up_mma(*args, split=2, counters=counters)
        assert not torch.equal(wrong[1, :16], first[1, :16])
        assert torch.equal(wrong[0], first[0]) and torch.equal(wrong[2], first[2])


def test_bank_and_slot_rows_give_identical_bytes(nan_empty):
    hidden, inter = 256, 32
    x, _, ids, bank, shared, _, _ = _problem(hidden, inter, 7, [3, 6, 3, 1], 5, torch.bfloat16)
    slots, slot_ids = slot_copy(bank, ids)
    got = [expert_gate_up_mma(*_dev(x, which, rows), hidden, inter, _to_dev(shared[0] + shared[1]), split=2)
           for rows, which in ((bank, ids), (slots, slot_ids))]
    assert torch.equal(got[0], got[1])


def test_shapes_it_cannot_take_are_refused():
    rows = torch.zeros(3, 2 * 256 * 32, dtype=torch.uint8)
    ids = torch.zeros(1, 2, dtype=torch.long)
    with pytest.raises(ValueError, match="whole K steps"):
        expert_gate_up_mma(torch.zeros(1, 256), ids, rows, 256, 32, split=3)
    with pytest.raises(ValueError, match="block-diagonal"):
        expert_gate_up_mma(torch.zeros(1, 256), ids, rows, 256, 32, split=2, scale_in_a=False)
    with pytest.raises(ValueError, match="block_n"):
        expert_gate_up_mma(torch.zeros(1, 256), ids, rows, 256, 32, split=1, block_n=8)
    assert step_codes(2048, 4) == 256 and step_codes(2048, 16) == 128 and step_codes(64, 4) == 16
    assert step_codes(64, 8) is None and step_codes(96, 1) is None


def test_fp16_safe_norm_bounds_the_norm_outputs():
    hidden = 2048
    assert fp16_safe_norm(torch.zeros(hidden), hidden)  # (1 + 0) * sqrt(2048) * 2 = 90.5
    assert fp16_safe_norm(torch.full((hidden,), 700.0), hidden)  # 701 * 45.25 * 2 = 63,443
    assert not fp16_safe_norm(torch.full((hidden,), 730.0), hidden)  # 731 * 45.25 * 2 = 66,158
    # the bound holds: the largest possible output (all of x in one channel) against it
    w = torch.randn(hidden) * 3
    x = torch.zeros(hidden)
    x[int(w.abs().argmax())] = 5.0
    out = x / x.pow(2).mean().sqrt() * (1 + w)
    assert out.abs().max() <= (1 + w).abs().max() * hidden ** 0.5 * (1 + 1e-6)
