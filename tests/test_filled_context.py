"""engine/bench/filled_context.py: a decode benchmark's sequence at its length without a prefill touches what a
prefill to that length touches (the same KV rows, every recurrent state, the routing trace's position), and the
decode step then runs at that position."""
import pytest
import torch

from qwenlocal.engine import Engine
from qwenlocal.engine.bench.filled_context import fill_context
from qwenlocal.engine.errors import ContextLimitError

LENGTH = 37  # over two of the tiny model's prefill chunks, not a multiple of anything


@pytest.fixture(scope="module")
def engine(tiny_ckpt):
    return Engine.from_pretrained(tiny_ckpt, device="cpu", options={
        "prefill_chunk": 16, "max_context": 64, "routing": {"preset": "calibrated-28", "seed": 3}})


def _written_rows(state) -> dict:
    """Each attention layer's KV rows that hold anything (rows past a prefill are still zeros)."""
    return {i: (kv.k.flatten(1).ne(0).any(1) | kv.v.flatten(1).ne(0).any(1)).nonzero().flatten().tolist()
            for i, kv in state.kv.items()}


def test_the_filled_sequence_has_the_prefills_shape_and_decodes_at_its_position(engine):
    runner = engine.runner
    prefilled = runner.new_state()
    runner.prefill(prefilled, torch.randint(0, 600, (LENGTH,), generator=torch.Generator().manual_seed(1)))
    routed_at = engine.model.routing.position.clone()

    engine.model.routing.reset()
    filled = runner.new_state()
    fill_context(engine.model, filled, LENGTH, seed=4)
    assert filled.seq_len == prefilled.seq_len == LENGTH
    assert torch.equal(engine.model.routing.position, routed_at)
    assert _written_rows(filled) == _written_rows(prefilled) == {i: list(range(LENGTH)) for i in filled.kv}
    for layer in filled.conv:
        assert filled.conv[layer].ne(0).all() and filled.recurrent[layer].ne(0).all()
        assert torch.isfinite(filled.recurrent[layer]).all()

    logits = runner.decode(filled, torch.tensor([5]))
    assert filled.seq_len == LENGTH + 1 and torch.isfinite(logits).all()
    assert _written_rows(filled) == {i: list(range(LENGTH + 1)) for i in filled.kv}  # the step's own row
    # The values are the seed's: another seed gives another step.
    engine.model.routing.reset()
    other = runner.new_state()
    fill_context(engine.model, other, LENGTH, seed=5)
    assert not torch.equal(runner.decode(other, torch.tensor([5])), logits)


def test_a_sequence_that_is_not_empty_or_too_long_is_refused_before_any_write(engine):
    state = engine.runner.new_state()
    with pytest.raises(ContextLimitError):
        fill_context(engine.model, state, 65)
    assert state.seq_len == 0 and all(not kv.k.any() for kv in state.kv.values())
    fill_context(engine.model, state, 3)
    with pytest.raises(ValueError, match="empty sequence"):
        fill_context(engine.model, state, 3)
    with pytest.raises(ValueError, match="positive"):
        fill_context(engine.model, engine.runner.new_state(), 0)
