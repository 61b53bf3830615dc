"""`synthetic:` models: the real geometry without a download, and small ones that run anywhere."""
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
    b = Engine.from_pretrained("synthetic:tiny", device="cpu")
    ids = list(range(1, 40))
    la = a.score(ids, prefill=20)
    assert torch.equal(la, b.score(ids, prefill=20)) and la.std() > 0.1
    done = list(a.chat([{"role": "user", "content": "hi"}], {"max_tokens": 6, "seed": 1}))[-1]
    assert done.completion_tokens <= 6


def test_unknown_synthetic_name_is_a_clear_error():
    with pytest.raises(OptionError, match="synthetic:qwen3.6-35b-a3b"):
        Engine.from_pretrained("synthetic:qwen9", device="cpu")
