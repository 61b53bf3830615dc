"""`synthetic:` models: the real geometry without a download, and small ones that run anywhere."""
import gc

import pytest
import torch

from qwenlocal.engine import Engine
from qwenlocal.engine.config import parse_model_config
from qwenlocal.engine.errors import OptionError
from qwenlocal.engine.synthetic import synthetic_config
from test_config import real_config


def test_full_size_synthetic_has_the_real_geometry():
    cfg = synthetic_config("synthetic:qwen3.6-35b-a3b", vocab_size=640)
    real = parse_model_config(real_config())
    for field in ("hidden_size", "num_layers", "layer_types", "vocab_size", "attention", "linear", "moe",
                  "rms_norm_eps", "tie_word_embeddings", "max_position_embeddings"):
        assert getattr(cfg, field) == getattr(real, field), field


def test_synthetic_tiny_runs_and_is_seeded():
    a = Engine.from_pretrained("synthetic:tiny", device="cpu")
    ids = list(range(1, 40))
    la = a.score(ids, prefill=20)
    done = list(a.chat([{"role": "user", "content": "hi"}], {"max_tokens": 6, "seed": 1}))[-1]
    assert done.completion_tokens <= 6
    first_embed = a.model.embed
    del a
    gc.collect()  # nothing shares the weights any more: the next engine makes them again, from the seed
    b = Engine.from_pretrained("synthetic:tiny", device="cpu")
    assert b.model.embed is not first_embed
    assert torch.equal(la, b.score(ids, prefill=20)) and la.std() > 0.1


def test_engines_of_one_synthetic_model_share_weights_and_bank():
    chunk = {"prefill_chunk": 16}
    resident = Engine.from_pretrained("synthetic:tiny", device="cpu", options=chunk)
    few = Engine.from_pretrained("synthetic:tiny", device="cpu", options={**chunk, "expert_slots": 8})
    many = Engine.from_pretrained("synthetic:tiny", device="cpu", options={**chunk, "expert_slots": 40})
    assert few.model.cache.bank is many.model.cache.bank  # one host bank, filled once
    assert few.model.embed is many.model.embed  # (the resident engine has its own: it keeps the experts)
    # The experts streamed layer by layer into the bank are the resident experts' bytes.
    ids = torch.randint(0, 600, (30 + 40,), generator=torch.Generator().manual_seed(4))
    ref = resident.score(ids, prefill=30)
    assert torch.equal(few.score(ids, prefill=30), ref) and torch.equal(many.score(ids, prefill=30), ref)


def test_unknown_synthetic_name_is_a_clear_error():
    with pytest.raises(OptionError, match="synthetic:qwen3.6-35b-a3b"):
        Engine.from_pretrained("synthetic:qwen9", device="cpu")
