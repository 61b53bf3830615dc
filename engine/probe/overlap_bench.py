"""The decode-overlap micro-bench (seed 002's): one MoE layer of the real geometry, decode step by step with a
fixed number of expert misses per step, for each split (off / copy-side / shared-side).

Per split it reports the layer's time per step (median over replays of the captured step, as decode runs it),
the copy start slip (from the fork to the copy's start, timed eagerly with events on the stream each half
runs on), and how often the shared expert ends while the copy still runs (the overlap the split can give).
The hardware profile stores {"off": us, "copy-side": us, "shared-side": us} as `overlap_microbench`, and the
plan then picks the faster split when it beats serial (engine/plan.py `_auto_overlap`). Needs CUDA.
"""
from __future__ import annotations

import statistics
from dataclasses import replace
from types import SimpleNamespace

import torch

from ..config import ModelConfig
from ..offload.bank import DENSE, HostExpertBank
from ..offload.cache import ExpertSlotCache
from ..offload.experts import OffloadedExperts
from ..offload.overlap import SPLITS, CudaStreams, DecodeOverlap
from ..quant.nvfp4_rows import NVFP4_ROWS, quantize_expert_rows


class _StaticIds:
    """Stands in for the routing trace: the expert ids of the step come from one device buffer."""

    def __init__(self, k: int, device):
        self.buffer = torch.zeros(1, k, dtype=torch.long, device=device)

    def ids(self, layer: int, num_tokens: int) -> torch.Tensor:
        return self.buffer


def miss_schedule(steps: int, num_experts: int, top_k: int, misses: int) -> torch.Tensor:
    """[steps, k] ids where each step shares k - misses ids with the step before: with k + misses to
    num_experts - misses slots and LRU eviction, exactly `misses` experts miss per step (after the first)."""
    if not 0 < misses <= top_k or top_k + misses > num_experts:
        raise ValueError(f"misses per step must be in 1..{top_k} and top_k + misses <= {num_experts}")
    base = torch.arange(steps)[:, None] * misses + torch.arange(top_k)[None, :]
    return base % num_experts


def summarize(per_split: dict[str, dict]) -> dict:
    """The profile's fact: {split: us per layer step} plus the details kept for the report."""
    out = {split: round(r["us_per_step"], 2) for split, r in per_split.items()}
    out["details"] = per_split
    return out


def describe(summary: dict) -> str:
    """One line for the profile's note: the setting and what each split did."""
    d = summary["details"]
    off = d["off"]
    parts = [f"{off['misses_per_step']} misses/step, {off['expert_bytes']:,} B experts; us per layer step: "
             + ", ".join(f"{s} {summary[s]:g}" for s in SPLITS)]
    for split in SPLITS[1:]:
        r = d[split]
        parts.append(f"{split}: copy starts {r['copy_start_slip_us']:.1f} us after the fork, shared expert ends "
                     f"inside the copy in {r['shared_ends_inside_copy']:.0%} of steps")
    return "; ".join(parts)


def run_overlap_microbench(cfg: ModelConfig, *, misses: int = 2, slots: int | None = None, steps: int = 400,
                           nvfp4: bool = True, device: str = "cuda", seed: int = 0) -> dict:
    """Measure the three splits on one layer of `cfg`'s MoE geometry. nvfp4: expert rows in NVFP4 bytes (the
    16 GB card's format) else BF16. Returns summarize()'s dict."""
    dev = torch.device(device)
    dtype = torch.bfloat16
    one = replace(cfg, num_layers=1, layer_types=cfg.layer_types[:1])
    e, k, h = one.moe.num_experts, one.moe.top_k, one.hidden_size
    i, i_sh = one.moe.intermediate_size, one.moe.shared_intermediate_size
    gen = torch.Generator(device=dev).manual_seed(seed)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, device=dev, dtype=dtype) * scale)

    bank = HostExpertBank(one, dtype, pin=True, fmt=NVFP4_ROWS if nvfp4 else DENSE)
    gate_up, down = rand(e, 2 * i, h, scale=h ** -0.5), rand(e, h, i, scale=i ** -0.5)
    if nvfp4:
        bank.put_rows(0, quantize_expert_rows(gate_up, down).cpu())
    else:
        bank.put(0, gate_up, down)
    del gate_up, down
    cache = ExpertSlotCache(one, bank, slots or 2 * (k + misses), dev)
    w = {"layers.0.mlp.gate.weight": rand(e, h, scale=h ** -0.5),
         "layers.0.mlp.shared_expert.gate_proj.weight": rand(i_sh, h, scale=h ** -0.5),
         "layers.0.mlp.shared_expert.up_proj.weight": rand(i_sh, h, scale=h ** -0.5),
         "layers.0.mlp.shared_expert.down_proj.weight": rand(h, i_sh, scale=i_sh ** -0.5),
         "layers.0.mlp.shared_expert_gate.weight": rand(1, h, scale=h ** -0.5)}
    from ..kernels.moe_triton import moe_decode
    from ..kernels.nvfp4_triton import nvfp4_moe_decode
    from ..model.moe import SparseMoE

    kernels = SimpleNamespace(experts_decode=moe_decode,
                              experts_decode_nvfp4=lambda x, wt, ids, rows: nvfp4_moe_decode(x, wt, ids, rows, h, i))
    schedule = miss_schedule(steps + 64, e, k, misses).to(dev)
    x = rand(1, h)
    results = {}
    for split in SPLITS:
        overlap = DecodeOverlap(split, CudaStreams(dev) if split != "off" else None)
        moe = SparseMoE(one, 0, w, kernels, OffloadedExperts(0, cache), overlap)
        moe.routing = _StaticIds(k, dev)
        results[split] = _measure(moe, x, schedule, steps, overlap)
    for split, r in results.items():
        r["misses_per_step"] = misses
        r["expert_bytes"] = bank.row_bytes
    return summarize(results)


def _measure(moe, x: torch.Tensor, schedule: torch.Tensor, steps: int, overlap: DecodeOverlap) -> dict:
    ids = moe.routing.buffer
    for s in range(16):  # warm-up: kernels compiled, slots filled
        ids.copy_(schedule[s:s + 1])
        moe.forward(x, decode=True)
    torch.cuda.synchronize()
    # The captured step, as the decode graph replays it.
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        moe.forward(x, decode=True)
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        moe.forward(x, decode=True)
    times = []
    for s in range(steps):
        ids.copy_(schedule[16 + s:17 + s])
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    out = {"us_per_step": statistics.median(times), "us_p90": sorted(times)[int(0.9 * len(times))]}
    if overlap.split != "off":
        out.update(_slip(moe, x, schedule, overlap))
    return out


def _slip(moe, x: torch.Tensor, schedule: torch.Tensor, overlap: DecodeOverlap, steps: int = 50) -> dict:
    """Eager steps with timing events around each half, recorded on the stream the half runs on."""
    ids = moe.routing.buffer
    slips, inside = [], 0
    real_run = overlap.run

    def timed_run(copy, shared, shared_input=None):
        ev = {n: torch.cuda.Event(enable_timing=True) for n in ("fork", "c0", "c1", "s0", "s1")}
        ev["fork"].record()

        def timed_copy():
            ev["c0"].record()
            copy()
            ev["c1"].record()

        def timed_shared():
            ev["s0"].record()
            out = shared()
            ev["s1"].record()
            return out

        timed_copy.inputs = getattr(copy, "inputs", ())
        out = real_run(timed_copy, timed_shared, shared_input)
        events.append(ev)
        return out

    events: list[dict] = []
    overlap.run = timed_run
    try:
        for s in range(steps):
            ids.copy_(schedule[s:s + 1])
            moe.forward(x, decode=True)
        torch.cuda.synchronize()
    finally:
        overlap.run = real_run
    for ev in events:
        slips.append(ev["fork"].elapsed_time(ev["c0"]) * 1e3)
        inside += ev["c0"].elapsed_time(ev["s1"]) >= 0 and ev["s1"].elapsed_time(ev["c1"]) >= 0
    return {"copy_start_slip_us": statistics.median(slips),
            "shared_ends_inside_copy": inside / len(events)}
