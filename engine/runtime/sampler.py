"""Sampling: greedy, temperature, top-k, top-p, seeded. Defaults come from the checkpoint's generation_config."""
from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Mapping

import torch

from ..errors import OptionError

# The draw in two Triton launches (kernels/sample_fused.py) for CUDA logits, where Triton imports (torch's path
# otherwise). On: its GPU A/B (bench_chat_loop.py's arm "fused", docs/RESULTS.md session 22) made the chat loop
# 1.050-1.056x faster with top-k 20 / top-p 0.95 and 1.041-1.042x with no cut, 3 of 3 rounds each, the same ids
# as torch's path (tests/test_kernels_sample_fused.py, natively and in the interpreter).
FUSED_DRAW = True


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = no top-k cut
    max_tokens: int = 1024
    seed: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.temperature, (int, float)) or isinstance(self.temperature, bool) or self.temperature < 0:
            raise OptionError(f"temperature must be a number >= 0, got {self.temperature!r}")
        if not isinstance(self.top_p, (int, float)) or isinstance(self.top_p, bool) or not 0 < self.top_p <= 1:
            raise OptionError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise OptionError(f"top_k must be an integer >= 0, got {self.top_k!r}")
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1:
            raise OptionError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            raise OptionError(f"seed must be an integer, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def updated(self, values: Mapping[str, Any] | None) -> "SamplingParams":
        """Overrides from a dict (None values ignored); unknown keys are an error."""
        if not values:
            return self
        known = {f.name for f in fields(self)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise OptionError(f"unknown sampling setting(s) {unknown}; known: {sorted(known)}")
        return replace(self, **{k: v for k, v in values.items() if v is not None})


def defaults_from_generation_config(model_dir: str | Path) -> SamplingParams:
    """The checkpoint's recommended sampling (Qwen3.6: T=1.0, top_p=0.95, top_k=20)."""
    path = Path(model_dir) / "generation_config.json"
    if not path.is_file():
        return SamplingParams()
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return SamplingParams()
    params = {}
    if raw.get("do_sample") is False:
        params["temperature"] = 0.0
    elif isinstance(raw.get("temperature"), (int, float)):
        params["temperature"] = float(raw["temperature"])
    if isinstance(raw.get("top_p"), (int, float)):
        params["top_p"] = float(raw["top_p"])
    if isinstance(raw.get("top_k"), int):
        params["top_k"] = raw["top_k"]
    return SamplingParams(**params)


def eos_from_generation_config(model_dir: str | Path) -> tuple[int, ...]:
    path = Path(model_dir) / "generation_config.json"
    try:
        raw = json.loads(path.read_text(encoding="utf-8")).get("eos_token_id")
    except (OSError, json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return ()
    ids = raw if isinstance(raw, list) else [raw]
    return tuple(i for i in ids if isinstance(i, int))


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """logits [V] -> one token id (a host int: one device sync)."""
    return int(sample_tensor(logits, params, generator))


def sample_tensor(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
    """logits [V] -> the sampled id as a [1] int64 tensor on the logits' device, without a host sync.

    Why on the device: the full-vocabulary sort of top-p on the host cost ~13.6 ms a token on a 2-core CPU (248K
    logits), more than four decode steps; on the GPU the top-k cut, softmax, cumulative sum and search are a few
    small launches. The one uniform draw comes from the seeded CPU generator as a Python float, so a seed gives
    the same tokens on every device (up to the float sums) and nothing crosses PCIe for it.
    Inverse CDF over the kept tokens in descending order: top-k first (torch.topk, sorted), then the smallest
    prefix whose mass reaches top_p (the first always kept)."""
    if params.greedy:
        return logits.argmax(-1, keepdim=True)
    u = float(torch.rand((), generator=generator))
    sample_fused = _fused_draw_for(logits)
    if sample_fused is not None and sample_fused.handles(logits, params.temperature, params.top_k, params.top_p):
        return sample_fused.sample(logits, params.temperature, params.top_k, params.top_p, u)
    return draw(logits, params.temperature, params.top_k, params.top_p, u)


def _fused_draw_for(logits: torch.Tensor):
    """kernels.sample_fused where it draws these logits (FUSED_DRAW, CUDA logits, Triton importable), else None:
    then torch's draw, the same ids."""
    if not (FUSED_DRAW and logits.is_cuda):
        return None
    try:
        from ..kernels import sample_fused
    except ImportError:
        return None
    return sample_fused


def draw(logits: torch.Tensor, temperature: float, top_k: int, top_p: float, u: float) -> torch.Tensor:
    """sample_tensor's draw with the uniform u given, in torch (also kernels/sample_fused.py's reference)."""
    scores = logits.float() / temperature
    order = None
    if top_k and top_k < scores.shape[-1]:
        scores, order = torch.topk(scores, top_k)
    elif top_p < 1.0:
        scores, order = torch.sort(scores, descending=True)
    probs = torch.softmax(scores, dim=-1)
    if top_p < 1.0:
        drop = probs.cumsum(-1) - probs >= top_p
        probs = probs.masked_fill(drop, 0.0)
    cdf = probs.cumsum(-1)
    # right=True: the first index whose cumulative mass exceeds u * total, so a zero-mass token is never drawn.
    pick = torch.searchsorted(cdf, cdf[-1:] * u, right=True).clamp_(max=cdf.shape[-1] - 1)
    return order[pick] if order is not None else pick
