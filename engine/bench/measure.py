"""One timed trial on the embedded engine: prefill a prompt, then decode steps, through `engine.runner` (the same
prefill and decode entry points as chat and score). Imports torch; the app imports this lazily.

Two decode loops (--sampling of `qwenlocal bench`):
  - "model" (the default): chat's own loop (runtime/generate.py generate_tokens) with the checkpoint's sampling
    (Qwen3.6: T=1.0, top_p 0.95, top_k 20), one host sync a token for the id, EOS ignored so every trial makes
    output_tokens tokens: the rate a user of `qwenlocal chat` sees.
  - "argmax": the next token is the argmax kept on the device (no per-step host sync beyond what the engine
    itself does): the decode step alone.
Timing: TTFT is the prefill plus the first token, as chat measures it (the state is allocated before the clock
starts, as in generation). Decode tok/s is (output_tokens - 1) / the time of the decode steps, the device
synchronized before each clock read. Counters are engine.stats() deltas around each phase.
"""
from __future__ import annotations

import time
from typing import Any, Sequence

from ..errors import OptionError
from ..options import EngineOptions
from .protocol import delta

_DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16", "fp32": "float32",
           "float32": "float32"}


SAMPLING_LOOPS = ("model", "argmax")


def _check_sampling(sampling: str) -> str:
    if sampling not in SAMPLING_LOOPS:
        raise OptionError(f"sampling {sampling!r}: one of {', '.join(SAMPLING_LOOPS)}")
    return sampling


def timed_trial(engine, prompt: Sequence[int], output_tokens: int, sampling: str = "argmax",
                vocab_limit: int | None = None) -> dict:
    import torch

    _check_sampling(sampling)
    dev = engine.device
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    runner = engine.runner
    state = runner.new_state()
    s0 = engine.stats()
    sync()
    on_gpu = dev.type == "cuda"
    if on_gpu:  # what the trial allocates beyond what is already placed (activations, workspaces)
        torch.cuda.reset_peak_memory_stats(dev)
        held = torch.cuda.memory_allocated(dev)
    steps = max(0, output_tokens - 1)
    if sampling == "model":
        from dataclasses import replace

        from ..runtime.generate import GenerationStats, generate_tokens

        # Seeded: every arm of a pair draws from the same stream. No EOS: every trial makes output_tokens.
        params = replace(engine.sampling_defaults, max_tokens=output_tokens, seed=0)
        t0 = time.perf_counter()
        tokens = generate_tokens(runner, state, list(prompt), params, (), GenerationStats(), vocab_limit=vocab_limit)
        last = next(tokens)
        t1 = time.perf_counter()
        s1 = engine.stats()
        for last in tokens:
            pass
        sync()
        t2 = time.perf_counter()
        token = torch.tensor([last], device=dev)
    else:
        ids = torch.tensor(list(prompt), dtype=torch.long, device=dev)
        t0 = time.perf_counter()
        logits = runner.prefill(state, ids)
        token = logits[-1:].argmax(-1)
        sync()
        t1 = time.perf_counter()
        s1 = engine.stats()
        for _ in range(steps):
            token = runner.decode(state, token)[-1:].argmax(-1)
        sync()
        t2 = time.perf_counter()
    s2 = engine.stats()
    out = {"ttft_s": t1 - t0, "decode_s": t2 - t1, "decode_steps": steps, "prompt_tokens": len(prompt),
           "stats_prefill": delta(s0, s1), "stats_decode": delta(s1, s2), "stats": s2, "sampling": sampling}
    if on_gpu:
        out["transient_peak_bytes"] = torch.cuda.max_memory_allocated(dev) - held
        # What the allocator held at its peak (allocated + its caching slack) and the whole card's use: the
        # plan's workspace reservation can be set from these, not from an estimate.
        out["reserved_peak_bytes"] = torch.cuda.max_memory_reserved(dev)
        free, total = torch.cuda.mem_get_info(dev)
        out["device_used_bytes"] = total - free
        out.update(decode_step_facts(engine, state, token, len(prompt) + steps // 2))
    return out


_DEVICE_GBPS: dict[str, float] = {}


def device_gbps(dev) -> float:
    """The device's memory bandwidth (GB/s) as a 1 GiB device-to-device copy measures it (read + write),
    once per process and device: the HBM roofline's denominator."""
    import torch

    key = str(dev)
    if key not in _DEVICE_GBPS:
        src = torch.empty(2**29, dtype=torch.uint16, device=dev)
        dst = torch.empty_like(src)
        dst.copy_(src)
        times = []
        for _ in range(5):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        _DEVICE_GBPS[key] = 2 * src.numel() * 2 / sorted(times)[len(times) // 2] / 1e9
        del src, dst
    return _DEVICE_GBPS[key]


def decode_step_facts(engine, state, token, context: int) -> dict:
    """After the timed steps (the trial's state is discarded after this): the bytes one decode step must read
    at this context (weights as stored, top-k experts, KV, GDN states), the device bandwidth, and the kernels
    one step launches, counted once per engine by the profiler over two steps (a graph's kernels are seen one
    by one). derive() turns them into the step's HBM roofline and the fraction of it reached."""
    from ..roofline import model_step_bytes

    facts = {"step_bytes": model_step_bytes(engine.model, context)["total"], "device_gbps": device_gbps(engine.device)}
    if getattr(engine, "_kernels_per_step", None) is None:
        import torch
        from torch.profiler import ProfilerActivity, profile

        runner = engine.runner
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(2):
                token = runner.decode(state, token)[-1:].argmax(-1)
            torch.cuda.synchronize()
        kernels = sum(1 for ev in prof.events() if ev.device_type == torch.autograd.DeviceType.CUDA)
        engine._kernels_per_step = kernels / 2
    facts["kernels_per_step"] = engine._kernels_per_step
    return facts


class EngineSession:
    """An ArmSession over the embedded engine."""

    def __init__(self, engine, sampling: str = "argmax"):
        self.engine = engine
        self.sampling = sampling
        self.max_context = int(getattr(engine, "max_context", 0) or engine.config.max_position_embeddings)
        tok = getattr(engine, "tokenizer", None)
        limit = getattr(tok, "vocab_size", None) if tok is not None else None
        # Ids the tokenizer can produce: the embedding's padding rows are never real input.
        self.vocab_size = int(min(limit, engine.config.vocab_size) if limit else engine.config.vocab_size)

    def trial(self, prompt: Sequence[int], output_tokens: int) -> dict:
        return timed_trial(self.engine, prompt, output_tokens, self.sampling, self.vocab_size)

    def describe(self) -> dict:
        plan = self.engine.plan
        plan = plan.to_dict() if hasattr(plan, "to_dict") else plan
        opts = self.engine.options
        config = getattr(self.engine, "engine_config", None)  # every decision, as data (resolve's EngineConfig)
        return {"plan": plan, "config": config.to_dict() if config is not None else None, "options": {k: getattr(opts, k) for k in opts.__dataclass_fields__},
                "stats": self.engine.stats(), "device": str(self.engine.device),
                "dtype": str(getattr(self.engine.model, "dtype", "")).replace("torch.", "")}

    def close(self) -> None:
        self.engine = None
        try:
            import gc

            import torch

            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except ImportError:
            pass


class EngineRunner:
    """The default runner: Engine.from_pretrained with the arm's options; trials decode with `sampling`'s loop."""

    def __init__(self, sampling: str = "argmax"):
        self.sampling = _check_sampling(sampling)  # before any engine loads

    def open(self, model: Any, *, device: str | None, dtype: str | None, vram_budget: Any,
             options: EngineOptions) -> EngineSession:
        import torch

        from ..api import Engine

        torch_dtype = getattr(torch, _DTYPES[dtype]) if dtype else None
        return EngineSession(Engine.from_pretrained(model, device=device, dtype=torch_dtype, vram_budget=vram_budget,
                                                    options=options), self.sampling)
