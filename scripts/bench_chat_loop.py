#!/usr/bin/env python3
"""Benchmark (prints figures): the decode rate a chat user sees, by where the token is sampled, paired.

One engine, one prefilled sequence (CUDA graph on, as chat runs); then rounds of `--tokens` decode steps per arm
in turn (DESIGN.md's interleaving; the context grows by tokens x arms a round, the same for every arm):
  - host:   what runtime/generate.py did before session 10: the [V] logits copied to the host as fp32 and
            sampled there (top-k, softmax, full-vocabulary sort for top-p, multinomial), the id sent back;
  - device: sampler.sample_tensor on the GPU (torch's draw), one host sync a token for the id, then the next
            decode (the loop of session 10's call 2);
  - chat:   runtime/generate.py generate_tokens itself (a step ahead: the next decode is launched before a token's
            id is read), continuing the same sequence, with torch's draw;
  - argmax: greedy, the token kept on the GPU, no host sync: the decode step alone (the bench's --sampling argmax);
  - fused:  the chat loop with the sampler's draw in two Triton launches (kernels/sample_fused.py, sampler.FUSED_DRAW).
Sampling: the checkpoint's defaults (Qwen3.6: T=1.0, top_p 0.95, top_k 20) over the full logits width (248,320 for
the real geometry; a synthetic model's tokenizer has fewer ids, the real one has 248K).

    python scripts/bench_chat_loop.py --model synthetic:qwen3.6-35b-a3b-nvfp4 --context 16384 --rounds 5
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace

import torch

from profile_decode import add_step_arguments  # scripts/ is on the path when this runs as a script
from qwenlocal.engine import Engine
from qwenlocal.engine.errors import OptionError
from qwenlocal.engine.runtime.generate import GenerationStats, generate_tokens
from qwenlocal.engine.runtime import sampler
from qwenlocal.engine.runtime.sampler import SamplingParams, sample_tensor


def host_sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """runtime/sampler.py's sample() before session 10 (on a host fp32 copy), kept here as the 'before' arm."""
    scores = logits.float().cpu() / params.temperature
    if params.top_k and params.top_k < scores.shape[-1]:
        kth = torch.topk(scores, params.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        drop = sorted_probs.cumsum(-1) - sorted_probs >= params.top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return int(torch.multinomial(probs, 1, generator=generator))


def run_arm(name: str, runner, state, token: torch.Tensor, params, gen, steps: int) -> tuple[float, torch.Tensor]:
    """tok/s over `steps` decode steps of this arm's loop; the last token (a [1] device tensor). The draw is set
    by the arm, not by the switch's default: "fused" the two launches, every other arm torch's."""
    default = sampler.FUSED_DRAW
    sampler.FUSED_DRAW = name == "fused"
    try:
        return _run_loop("chat" if name == "fused" else name, runner, state, token, params, gen, steps)
    finally:
        sampler.FUSED_DRAW = default


def _run_loop(name: str, runner, state, token: torch.Tensor, params, gen, steps: int) -> tuple[float, torch.Tensor]:
    dev = token.device
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    if name == "chat":  # `steps` decodes: the first gives the logits generate_tokens starts from
        loop = replace(params, max_tokens=steps, seed=None)
        for last in generate_tokens(runner, state, [], loop, (), GenerationStats(),
                                    prefill=lambda: runner.decode(state, token)):
            pass
        torch.cuda.synchronize()
        return steps / (time.perf_counter() - t0), torch.tensor([last], device=dev)
    for _ in range(steps):
        logits = runner.decode(state, token)
        if name == "host":
            token = torch.tensor([host_sample(logits[-1], params, gen)], device=dev)
        elif name == "device":
            token = sample_tensor(logits[-1], params, gen)
            int(token)  # the id the loop yields: one sync a token
        else:
            token = logits[-1:].argmax(-1)
    torch.cuda.synchronize()
    return steps / (time.perf_counter() - t0), token


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_step_arguments(p)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--tokens", type=int, default=64, help="decode steps per arm per round")
    p.add_argument("--arms", default="host,device,chat,argmax")
    p.add_argument("--json", default=None)
    # The synthetic models carry no generation_config (T=1, no top-k / top-p cut); Qwen3.6's is T=1.0, top_p 0.95,
    # top_k 20: give those here to time the sampler a user of the real checkpoint runs.
    p.add_argument("--temperature", type=float, default=None, help="override the checkpoint's sampling")
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--top-k", type=int, default=None)
    a = p.parse_args()
    arms = [x for x in a.arms.split(",") if x]
    if not arms or any(x not in ("host", "device", "chat", "argmax", "fused") for x in arms):
        raise SystemExit("--arms: a comma-separated choice of host, device, chat, argmax, fused")
    if a.rounds < 3:
        raise SystemExit("--rounds: at least 3 (the protocol's pairs)")
    overrides = {"temperature": a.temperature, "top_p": a.top_p, "top_k": a.top_k}
    try:  # a bad value stops here, before the model's minutes of loading
        SamplingParams().updated(overrides)
    except OptionError as e:
        raise SystemExit(f"sampling: {e}")
    extra = a.rounds * len(arms) * a.tokens + 64
    opts = {"max_context": a.context + extra, "routing": a.routing}
    t0 = time.perf_counter()
    eng = Engine.from_pretrained(a.model, device="cuda", dtype=torch.bfloat16, vram_budget=a.vram_budget, options=opts)
    params = eng.sampling_defaults.updated(overrides)
    runner = eng.runner
    state = runner.new_state()
    print(f"loaded in {time.perf_counter() - t0:.1f} s", flush=True)  # progress: a cut-off run says where
    logits = runner.prefill(state, torch.randint(0, 600, (a.context,), device="cuda"))
    token = logits[-1:].argmax(-1)
    print(f"prefilled {a.context:,} tokens at {time.perf_counter() - t0:.1f} s", flush=True)
    gen = torch.Generator().manual_seed(0)
    for name in arms:  # warm-up: the graph captured, each loop's kernels compiled
        _, token = run_arm(name, runner, state, token, params, gen, 4)
    print(f"warmed up at {time.perf_counter() - t0:.1f} s", flush=True)
    per = {n: [] for n in arms}
    for _ in range(a.rounds):
        for name in arms:
            rate, token = run_arm(name, runner, state, token, params, gen, a.tokens)
            per[name].append(rate)
    print(f"\n== chat loop: {a.model} · context {a.context:,} · budget {a.vram_budget or 'all'} · sampling "
          f"T={params.temperature} top_p={params.top_p} top_k={params.top_k} over {logits.shape[-1]:,} logits · "
          f"{a.rounds} rounds x {a.tokens} tokens ==")
    first = per[arms[0]]
    for name, v in per.items():
        ratios = ", ".join(f"{x / y:.3f}" for x, y in zip(v, first))
        print(f"{name:<8} {statistics.median(v):8.1f} tok/s (median)  {1e3 / statistics.median(v):7.3f} ms/token   "
              f"rate ratio to {arms[0]} per round: {ratios}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": a.model, "context": a.context, "vram_budget": a.vram_budget, "rounds": a.rounds,
                       "tokens": a.tokens, "sampling": vars(params), "tok_s": per}, f, indent=1)


if __name__ == "__main__":
    main()
