"""Token generation for one conversation: prefill, then sample/decode until EOS, max tokens or cancel."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from ..errors import GenerationCancelled
from ..model.cache import SequenceState
from .runner import Runner
from .sampler import SamplingParams, sample_tensor


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served from a session's cached state (not prefilled)
    completion_tokens: int = 0
    prefill_s: float = 0.0
    ttft_s: float = 0.0
    decode_s: float = 0.0
    finish_reason: str = ""
    started: float = field(default_factory=time.perf_counter)

    @property
    def decode_tok_s(self) -> float:
        steps = self.completion_tokens - 1
        return steps / self.decode_s if steps > 0 and self.decode_s > 0 else 0.0

    @property
    def prefill_tok_s(self) -> float:
        prefilled = self.prompt_tokens - self.cached_tokens
        return prefilled / self.prefill_s if self.prefill_s > 0 else 0.0

    def as_dict(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
                "completion_tokens": self.completion_tokens,
                "prefill_s": self.prefill_s, "ttft_s": self.ttft_s, "decode_s": self.decode_s,
                "decode_tok_s": self.decode_tok_s, "prefill_tok_s": self.prefill_tok_s,
                "finish_reason": self.finish_reason}


def generate_tokens(runner: Runner, state: SequenceState, prompt: list[int], params: SamplingParams,
                    eos_ids: tuple[int, ...], stats: GenerationStats, cancel: threading.Event | None = None,
                    vocab_limit: int | None = None,
                    prefill: Callable[[], torch.Tensor] | None = None) -> Iterator[int]:
    """Yields each sampled token id (EOS included, then stops). Sets stats.finish_reason.

    vocab_limit: ids at or above it (the embedding's padding rows, which the tokenizer cannot decode) are
    never sampled. prefill: returns the logits after the prompt (a Session reusing cached state); default:
    prefill the whole prompt into `state`."""
    device = runner.model.device
    gen = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
    stats.prompt_tokens = len(prompt)
    reader = TokenReader(device)
    # A sampled token is fed back when another one may be wanted: max_tokens costs max_tokens - 1 decodes, and an
    # EOS has been fed by the step launched before it was read.
    try:
        t0 = time.perf_counter()
        if prefill is None:
            logits = runner.prefill(state, torch.tensor(prompt, dtype=torch.long, device=device), cancel=cancel)
        else:
            logits = prefill()
        picked = sample_tensor(_valid(logits[-1], vocab_limit), params, gen)
        token = int(picked)  # the first id: nothing to overlap with yet
        stats.prefill_s = stats.ttft_s = time.perf_counter() - t0
        for produced in range(1, params.max_tokens + 1):
            t1 = time.perf_counter()
            # One step ahead: the next decode goes to the device before this token's id is read (it takes the id
            # where it already is), so the GPU is not idle while the host reads, yields and launches. If this
            # token is EOS, that step has consumed it: state.seq_len counts it, and a Session records it.
            ahead = (produced < params.max_tokens and not (cancel is not None and cancel.is_set())
                     and state.seq_len + 1 <= state.max_len)
            if ahead:
                logits = runner.decode(state, picked)
                following = sample_tensor(_valid(logits[-1], vocab_limit), params, gen)
            if produced > 1:
                token = reader.read()  # staged before the decode above: waits for this token's draw alone
            if ahead:
                reader.stage(following)  # after the read: one pinned buffer serves every token
            stats.decode_s += time.perf_counter() - t1
            stats.completion_tokens = produced
            yield token
            if token in eos_ids:
                stats.finish_reason = "stop"
                return
            if produced == params.max_tokens:
                break
            if cancel is not None and cancel.is_set():
                raise GenerationCancelled("decode cancelled")
            if not ahead:
                stats.finish_reason = "context"
                return
            picked = following
        stats.finish_reason = "length"
    except GenerationCancelled:
        stats.finish_reason = "cancelled"


class TokenReader:
    """A sampled id [1] on the device -> a host int, without waiting for what was queued after it: stage() copies
    it to pinned host memory behind an event, read() waits for that event alone (on the CPU: the value)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self._host = torch.empty(1, dtype=torch.long, pin_memory=True) if self.cuda else None
        self._event = torch.cuda.Event() if self.cuda else None
        self._staged: torch.Tensor | None = None

    def stage(self, picked: torch.Tensor) -> None:
        if self.cuda:
            self._host.copy_(picked.reshape(1), non_blocking=True)
            self._event.record()
        self._staged = picked

    def read(self) -> int:
        staged, self._staged = self._staged, None
        if staged is None:
            raise RuntimeError("TokenReader.read() before stage()")
        if self.cuda:
            self._event.synchronize()
            return int(self._host[0])
        return int(staged)


def _valid(logits: torch.Tensor, vocab_limit: int | None) -> torch.Tensor:
    """The logits of ids the tokenizer can decode (the embedding's padding rows cut off), where they are."""
    if vocab_limit is not None and vocab_limit < logits.shape[-1]:
        return logits[:vocab_limit]
    return logits
