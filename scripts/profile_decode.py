#!/usr/bin/env python3
"""Diagnostics (not a benchmark): where one batch-1 decode step spends GPU time, so the next bottleneck is
visible without reading code. Prints, per arm (--decode-kernels, default both):
  - one eager step under the torch profiler: kernels per step, kernel time per step, the top kernels by time
    (calls and microseconds per step);
  - the CUDA-graph step: median ms per step over timed replays (CUDA events) and the kernels per replay
    (the profiler sees a graph's kernels one by one), and each kernel's charge in the replay: the time by which
    it moved the step's end (graph_timeline.py; programmatic launch makes the eager durations overlap);
  - the step's HBM roofline: the bytes it must read (engine/roofline.py model_step_bytes, the weights in their
    stored formats) over the measured device bandwidth, and the fraction of it the graph step reaches.
With --pairs N (N >= 1, several arms), the arms' graph steps are also timed in turn, N rounds of interleaved
A/B/... timings after every arm is built and captured (DESIGN.md's pairing), and the medians and per-round ratios
against the first arm are printed. An arm is a decode_kernels value with optional "/"-joined gemv_multi switches,
each changing no byte: "prefetch" (the weights asked of L2 before the PDL wait), "persistent" (one wave of
persistent programs taking tiles in turn, rows asked of L2 turns ahead), "fp8cvt" (FP8 codes through the
hardware conversion; exact, the sums in another order), "experts" (the NVFP4 expert kernels' persistent
programs, x loaded once a program), e.g. fused-pdl/persistent+prefetch; the other switches are SWITCHES below
("no-NAME" turns a default one off), or NAME=INT for a launch parameter in VALUES (gdnbv=8: gdn_step's V columns
a program). "drop-route" / "drop-prenorm" / "drop-normshift" / "drop-prologue" are ceilings, not results: the
router's top-k launch, the pre-mixer add + RMSNorm, GDN's gated norm + conv shift or the attention's q/k norm +
RoPE + KV write left out of the step (decode_fused.DROP; its bytes are then wrong).
With --fill-context, each arm's context is random KV and recurrent state (engine/bench/filled_context.py) instead
of a prefill: a decode step reads the same bytes, and a fresh machine compiles no prefill kernel (resident arms).
With --json PATH, the same figures as JSON.

    python scripts/profile_decode.py --model synthetic:qwen3.6-35b-a3b-nvfp4 --context 16384 [--vram-budget 16GiB]
    python scripts/profile_decode.py --decode-kernels fused-pdl,fused-pdl/persistent --pairs 5
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from bench_resident import timed  # scripts/ is on the path when this runs as a script
from graph_timeline import print_timeline, timeline
from qwenlocal.engine import Engine
from qwenlocal.engine.kernels import (attention_decode, decode_router, gdn_decode, gemv_mixed, gemv_multi, gemv_norm,
                                      nvfp4_experts_decode, nvfp4_experts_parts, nvfp4_int_experts, nvfp4_mma,
                                      nvfp4_mma_experts,
                                      parts_norm, router_gemv, router_norm, slot_ensure)
from qwenlocal.engine.bench.filled_context import fill_context
from qwenlocal.engine.bench.measure import device_gbps
from qwenlocal.engine.model import decode_fused
from qwenlocal.engine.roofline import model_step_bytes


def kernel_table(prof, steps: int) -> tuple[int, float, list[tuple[str, float, float]]]:
    """(kernels per step, kernel us per step, [(name, calls per step, us per step)] by time)."""
    calls, micros = defaultdict(int), defaultdict(float)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            calls[ev.name] += 1
            micros[ev.name] += ev.device_time if hasattr(ev, "device_time") else ev.cuda_time
    rows = sorted(((n, calls[n] / steps, micros[n] / steps) for n in calls), key=lambda r: -r[2])
    return sum(calls.values()) // steps, sum(micros.values()) / steps, rows


def trace_events(prof) -> list[dict]:
    """The profiler's chrome-trace events."""
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)
    finally:
        os.unlink(path)
    return events.get("traceEvents", events) if isinstance(events, dict) else events


def launch_table(prof, steps: int) -> list[tuple[str, str, float, float]]:
    """[(kernel, grid x block, calls per step, us per step)] by time: the same kernel's launches told apart by
    their launch shape (gemv_multi's in_proj vs o_proj vs lm_head), from the profiler's trace events."""
    events = trace_events(prof)
    calls, micros = defaultdict(int), defaultdict(float)
    for ev in events:
        if ev.get("cat") != "kernel":
            continue
        args = ev.get("args", {})
        key = (ev["name"], f"{args.get('grid')} x {args.get('block')}")
        calls[key] += 1
        micros[key] += float(ev.get("dur", 0.0))
    return sorted(((k[0], k[1], calls[k] / steps, micros[k] / steps) for k in calls), key=lambda r: -r[3])


def back_to_back(fn, steps: int) -> tuple[float, float]:
    """(GPU seconds a step, host seconds a call) of `steps` calls enqueued with no sync between them, as the chat
    loop runs a step ahead. timed() syncs after every call, so its figure also holds the host's launch latency
    (the GPU waits for each replay's launch: ~120-180 us a step in session 21's graph traces)."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    start.record()
    for _ in range(steps):
        fn()
    end.record()
    host = time.perf_counter() - t0
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / steps, host / steps


def profile_steps(runner, state, token, steps: int):
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            runner.decode(state, token)
        torch.cuda.synchronize()
    return prof


def arm(model: str, context: int, decode_kernels: str, budget: str | None, routing: str | None, top: int,
        profile: bool = True, engine=None, fill: bool = False) -> dict:
    """One arm's figures; profile False: its graph timings only (no eager profile, no graph trace). engine: an
    earlier arm's engine whose model (weights, expert banks) this arm's own runner, state and graph share
    (--share-model); None: an engine of its own. fill: the context filled with random KV and state instead of
    prefilled (engine/bench/filled_context.py: no prefill kernel compiles; resident only)."""
    opts = {"max_context": context + 1536, "decode_kernels": decode_kernels}
    if routing:
        opts["routing"] = routing
    if engine is None:
        eng = Engine.from_pretrained(model, device="cuda", dtype=torch.bfloat16, vram_budget=budget, options=opts)
        runner = eng.runner
    else:  # a runner of its own: its graph is captured with this arm's switches, over the shared weights
        from qwenlocal.engine.runtime.runner import Runner

        eng = engine
        runner = Runner(eng.model, eng.engine_config)
    token = torch.tensor([5], device="cuda")
    out = {"decode_kernels": decode_kernels, "context": context, "graph": runner.use_graph}
    state = runner.new_state()
    if fill:
        fill_context(eng.model, state, context)
    else:
        runner.prefill(state, torch.randint(0, 600, (context,), device="cuda"))
    out["context_filled"] = fill
    # Eager: the graph-bound state is driven through the model's own path (runner.decode replays the graph).
    runner.use_graph = False
    for _ in range(3):
        runner.decode(state, token)
    if profile:
        prof = profile_steps(runner, state, token, 3)
        n, us, rows = kernel_table(prof, 3)
        out.update(eager_kernels_per_step=n, eager_kernel_us_per_step=us, top=[list(r) for r in rows[:top]],
                   launches=[list(r) for r in launch_table(prof, 3)[:top]])
    runner.use_graph = out["graph"]
    if runner.use_graph:
        for _ in range(8):
            runner.decode(state, token)
        out["graph_ms_per_step"] = 1e3 * timed(lambda: runner.decode(state, token), 50)
        gpu_s, host_s = back_to_back(lambda: runner.decode(state, token), 50)
        out.update(graph_ms_back_to_back=1e3 * gpu_s, host_us_per_decode=1e6 * host_s)
    if runner.use_graph and profile:
        gprof = profile_steps(runner, state, token, 3)
        gn, gus, _ = kernel_table(gprof, 3)
        out.update(graph_kernels_per_step=gn, graph_kernel_us_per_step=gus)
        try:
            out["graph_timeline"] = timeline(trace_events(gprof), 3)
        except ValueError as e:  # replays the trace cannot tell apart: say so, keep the arm's other figures
            out["graph_timeline_error"] = str(e)
    out["step_bytes"] = model_step_bytes(eng.model, context)
    out["plan"] = {k: v["value"] for k, v in eng.plan.items()}
    _KEEP.append((eng, runner))  # the next arm shares this synthetic model's weights instead of making them again
    if runner.use_graph:  # the captured step, for the interleaved rounds (its switches are baked in)
        _STEPS.append(lambda: runner.decode(state, token))
    return out


_KEEP: list = []
_STEPS: list = []
SWITCHES = {"prefetch": (gemv_multi, "WEIGHT_PREFETCH"), "persistent": (gemv_multi, "PERSISTENT"),
            "fp8cvt": (gemv_multi, "FP8_CVT"), "experts": (nvfp4_experts_decode, "PERSISTENT"),
            "router": (router_gemv, "FUSED"), "gemvnorm": (gemv_norm, "FUSED"),
            "partsnorm": (parts_norm, "FUSED"), "gdntail": (gdn_decode, "NORM_SHIFT_TAIL"),
            "mixed": (gemv_mixed, "MIXED"), "attn": (attention_decode, "TRITON"),
            "routernorm": (router_norm, "FUSED"),
            "keys": (decode_router, "KEYS"), "tilesums": (parts_norm, "TILE_SUMS"),
            "guint": (nvfp4_int_experts, "ON"), "mixedfew": (gemv_mixed, "FEWEST_B_TILES"),
            "routeint": (nvfp4_int_experts, "ROUTE"), "attnmerge": (attention_decode, "MERGE_APART"),
            "routeensure": (slot_ensure, "ROUTE"), "downpf": (nvfp4_int_experts, "DOWN_PREFETCH"),
            "gugroups": (nvfp4_int_experts, "GROUPS"), "fp8mma": (gemv_multi, "FP8_MMA"),
            "dngroups": (nvfp4_experts_parts, "GROUPS"), "dnroute": (nvfp4_experts_parts, "ROUTE"),
            "dnpre": (nvfp4_experts_parts, "PRELOAD"),
            "mmastep": (gemv_multi, "MMA_STEP_SCALE"), "lmimma": (nvfp4_mma, "LM_HEAD"),
            "gumma": (nvfp4_mma_experts, "ON"), "mmapairs": (nvfp4_mma, "PAIRS"),
            "gdnearly": (gdn_decode, "EARLY_STATE")}


SWITCH_DEFAULTS = {name: getattr(module, attr) for name, (module, attr) in SWITCHES.items()}
# Launch parameters an arm may set as NAME=VALUE (an int), e.g. fused-pdl/gdnbv=8.
VALUES = {"gdnbv": (gdn_decode, "BLOCK_V"), "attnsplits": (attention_decode, "SPLITS"),
          "attnbt": (attention_decode, "BLOCK_T"), "downbm": (nvfp4_experts_parts, "BLOCK_M"),
          "gubn": (nvfp4_int_experts, "BLOCK_N_GPU"), "mmabk": (gemv_multi, "MMA_BLOCK_K"),
          "mmastages": (gemv_multi, "MMA_STAGES"), "mmamin": (gemv_multi, "MMA_MIN_TILES"),
          "guwarps": (nvfp4_mma_experts, "WARPS"), "lmwarps": (nvfp4_mma, "LM_WARPS")}
VALUE_DEFAULTS = {name: getattr(module, attr) for name, (module, attr) in VALUES.items()}
# Switches and values read only when a step's kernels are launched (in the kernels' wrappers), never while the
# model is built or loaded: arms that differ only in these can share one model (--share-model).
AT_LAUNCH = {"gugroups", "dngroups", "dnroute", "dnpre", "fp8mma", "mmastep", "downpf", "prefetch", "gubn", "downbm",
             "mmabk", "mmastages", "mmamin", "mixedfew", "lmimma", "gumma", "guwarps",
             "mmapairs", "lmwarps", "gdnearly"}


def shares_model(arm_name: str, first: str) -> bool:
    """Whether arm_name can run over the model built for the arm `first`: the same decode_kernels value, and
    every switch or value either names is read at launch only (AT_LAUNCH)."""
    def parts(name):
        base, _, extra = name.partition("/")
        return base, {n.removeprefix("no-").split("=", 1)[0] for n in extra.split("+") if n}

    (base, names), (first_base, first_names) = parts(arm_name), parts(first)
    return base == first_base and names | first_names <= AT_LAUNCH


def set_switches(arm_name: str) -> str:
    """Set the kernel switches named after the arm's "/" ("name" on, "no-name" off, the rest at their defaults);
    the decode_kernels value."""
    base, _, extra = arm_name.partition("/")
    names = [n for n in extra.split("+") if n]
    # drop-X: a diagnostic ceiling (decode_fused.DROP: the launch left out, the bytes wrong)
    decode_fused.DROP = frozenset(n.removeprefix("drop-") for n in names if n.startswith("drop-"))
    values = dict(n.split("=", 1) for n in names if "=" in n)
    wanted = {n.removeprefix("no-"): not n.startswith("no-") for n in names
              if not n.startswith("drop-") and "=" not in n}
    unknown = [n for n in wanted if n not in SWITCHES] + [n for n in values if n not in VALUES]
    if unknown:
        raise SystemExit(f"unknown arm switch {unknown[0]!r} in {arm_name!r} (known: {', '.join(SWITCHES)}, "
                         f"each also as no-NAME; {', '.join(VALUES)} as NAME=INT)")
    bad = [f"{n}={v}" for n, v in values.items() if not v.isdigit() or int(v) < 1]
    if bad:
        raise SystemExit(f"arm {arm_name!r}: {bad[0]} is not a positive integer")
    for name, (module, attr) in SWITCHES.items():
        setattr(module, attr, wanted.get(name, SWITCH_DEFAULTS[name]))
    for name, (module, attr) in VALUES.items():
        setattr(module, attr, int(values[name]) if name in values else VALUE_DEFAULTS[name])
    return base


def interleaved(names: list[str], rounds: int, steps: int = 50) -> dict:
    """Median graph ms per step of each arm, `rounds` rounds of one timing per arm in turn, each timing twice:
    synced after every step (timed: the host's launch latency in it) and back to back (the GPU's step, as the
    chat loop a step ahead sees it); per-round ratios of each arm to the first, for both."""
    synced, b2b = {n: [] for n in names}, {n: [] for n in names}
    for _ in range(rounds):
        for name, step in zip(names, _STEPS):
            synced[name].append(1e3 * timed(step, steps))
            b2b[name].append(1e3 * back_to_back(step, steps)[0])
    out = {}
    for n in names:
        out[n] = {"ms": statistics.median(synced[n]), "rounds_ms": synced[n],
                  "ratio_to_first": [a / b for a, b in zip(synced[n], synced[names[0]])],
                  "b2b_ms": statistics.median(b2b[n]), "b2b_rounds_ms": b2b[n],
                  "b2b_ratio_to_first": [a / b for a, b in zip(b2b[n], b2b[names[0]])]}
    return out


def add_step_arguments(p: argparse.ArgumentParser) -> None:
    """The model and the decode step's setting, as the decode scripts take them (bench_chat_loop.py too)."""
    p.add_argument("--model", default="synthetic:qwen3.6-35b-a3b-nvfp4")
    p.add_argument("--context", type=int, default=16384)
    p.add_argument("--vram-budget", default=None)
    p.add_argument("--routing", default="calibrated-28")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_step_arguments(p)
    p.add_argument("--decode-kernels", default="reference,fused")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--json", default=None)
    p.add_argument("--pairs", type=int, default=0, help="interleaved rounds of graph timings across the arms")
    p.add_argument("--profile-first-only", action="store_true",
                   help="profile the first arm only; the others give their timings (~20 s an arm less)")
    p.add_argument("--share-model", action="store_true",
                   help="arms that differ from the first only in switches read at launch (AT_LAUNCH) run over "
                        "the first arm's model (each its own runner, state and graph): more arms fit the GPU")
    p.add_argument("--build-deadline", type=float, default=0,
                   help="seconds after which no further arm is built: the rounds run with the arms built so far "
                        "(0: every arm), so that a run inside a device call's timeout still pairs")
    p.add_argument("--fill-context", action="store_true",
                   help="fill the context with random KV and recurrent state instead of prefilling it: the same "
                        "bytes a decode step, no prefill kernel compiled on a fresh machine (resident only)")
    a = p.parse_args()
    if a.fill_context and a.vram_budget:
        raise SystemExit("--fill-context is for resident arms: under --vram-budget a prefill decides what the "
                         "expert slots hold")
    if a.pairs > 12:
        raise SystemExit("--pairs: at most 12 rounds (each arm's context grows by 102 tokens a round)")
    for dk in a.decode_kernels.split(","):  # a misspelt arm stops here, not after the first arm's minutes
        set_switches(dk)
    bw = device_gbps("cuda") * 1e9
    results = []
    failed = []
    t_start = time.monotonic()
    arms = a.decode_kernels.split(",")
    for n, dk in enumerate(arms):
        if a.build_deadline and n > 1 and time.monotonic() - t_start > a.build_deadline:
            print(f"\n== build deadline ({a.build_deadline:.0f} s) passed: arms left out: {', '.join(arms[n:])} ==")
            break
        t_arm = time.monotonic()
        shared = (_KEEP[0][0] if a.share_model and _KEEP and results and shares_model(dk, results[0]["decode_kernels"])
                  else None)
        try:
            r = arm(a.model, a.context, set_switches(dk), a.vram_budget, a.routing, a.top,
                    profile=not (a.profile_first_only and results), engine=shared, fill=a.fill_context)
        except Exception as e:  # an arm whose kernels fail to build or launch: the other arms still report
            print(f"\n== {dk}: FAILED ({type(e).__name__}: {str(e)[:300]}) ==")
            failed.append(dk)
            continue
        r["decode_kernels"] = dk
        r["shares_first_arms_model"] = shared is not None
        r["device_bandwidth_gbps"] = bw / 1e9
        roof_ms = 1e3 * r["step_bytes"]["total"] / bw
        r["hbm_roofline_ms"] = roof_ms
        if "graph_ms_per_step" in r:
            r["hbm_fraction"] = roof_ms / r["graph_ms_per_step"]
        results.append(r)
        print(f"\n== {a.model} · {dk} · context {a.context:,} · budget {a.vram_budget or 'all'} · built and "
              f"timed in {time.monotonic() - t_arm:.0f} s{' · the first arm’s model' if shared is not None else ''} ==")
        if "top" in r:  # a profiled arm
            print(f"eager: {r['eager_kernels_per_step']:,} kernels/step, {r['eager_kernel_us_per_step'] / 1e3:.2f} ms "
                  f"kernel time/step")
            print(f"{'kernel':<72} {'calls/step':>10} {'us/step':>9} {'share':>6}")
            for name, calls, us in r["top"]:
                print(f"{name[:72]:<72} {calls:>10.1f} {us:>9.1f} {us / r['eager_kernel_us_per_step']:>6.1%}")
            print(f"\nby launch shape: {'kernel':<44} {'grid x block':>26} {'calls/step':>10} {'us/step':>8} {'us/call':>7}")
            for name, shape, calls, us in r["launches"]:
                print(f"{name[:60]:<60} {shape:>26} {calls:>10.1f} {us:>8.1f} {us / calls:>7.2f}")
        b = r["step_bytes"]
        print(f"step bytes: {b['total'] / 1e9:.3f} GB (dense {b['dense'] / 1e9:.3f}, experts {b['experts'] / 1e9:.3f}, "
              f"KV {b['kv'] / 1e9:.3f}, state {b['state'] / 1e9:.3f}); device bandwidth {bw / 1e9:,.0f} GB/s; "
              f"roofline {roof_ms:.3f} ms/step")
        if "graph_ms_per_step" in r:
            print(f"graph: {r['graph_ms_per_step']:.3f} ms/step ({1e3 / r['graph_ms_per_step']:.1f} tok/s), "
                  + (f"{r['graph_kernels_per_step']:,} kernels/replay, " if "graph_kernels_per_step" in r else "")
                  + f"{r['hbm_fraction']:.1%} of the HBM roofline; "
                  f"back to back {r['graph_ms_back_to_back']:.3f} ms/step "
                  f"({r['hbm_roofline_ms'] / r['graph_ms_back_to_back']:.1%}), host {r['host_us_per_decode']:.0f} us "
                  f"a decode call")
            if "graph_timeline" in r:
                print_timeline(r["graph_timeline"], a.top)
            elif "graph_timeline_error" in r:
                print(f"graph timeline: {r['graph_timeline_error']}")
    print("\n== summary ==")
    print(f"{'arm':<22} {'eager kernels':>13} {'graph kernels':>13} {'graph ms':>9} {'tok/s':>7} {'roofline ms':>11} "
          f"{'fraction':>8} {'b2b ms':>7} {'b2b frac':>8}")
    for r in results:
        g, b = r.get("graph_ms_per_step"), r.get("graph_ms_back_to_back")
        counts = [f"{r[key]:>13,}" if key in r else f"{'-':>13}"  # "-": an arm timed, not profiled
                  for key in ("eager_kernels_per_step", "graph_kernels_per_step")]
        print(f"{r['decode_kernels']:<22} {counts[0]} {counts[1]} "
              f"{g or float('nan'):>9.3f} {1e3 / g if g else float('nan'):>7.1f} {r['hbm_roofline_ms']:>11.3f} "
              f"{r.get('hbm_fraction', float('nan')):>8.1%} {b or float('nan'):>7.3f} "
              f"{r['hbm_roofline_ms'] / b if b else float('nan'):>8.1%}")
    if failed:
        print(f"failed arms (left out of the rounds): {', '.join(failed)}")
    paired = None
    if a.pairs and len(_STEPS) == len(results) > 1:
        names = [r["decode_kernels"] for r in results]
        paired = interleaved(names, a.pairs)
        print(f"\n== interleaved graph steps: {a.pairs} rounds, 50 steps a timing (median ms; ratio to {names[0]}) ==")
        for name, v in paired.items():
            ratios = ", ".join(f"{x:.3f}" for x in v["ratio_to_first"])
            print(f"{name:<34} {v['ms']:8.3f} ms {1e3 / v['ms']:7.1f} tok/s   ratios {ratios}")
        print("back to back (no sync between steps: the GPU's step, as the chat loop sees it)")
        for name, v in paired.items():
            ratios = ", ".join(f"{x:.3f}" for x in v["b2b_ratio_to_first"])
            print(f"{name:<34} {v['b2b_ms']:8.3f} ms {1e3 / v['b2b_ms']:7.1f} tok/s   ratios {ratios}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"arms": results, "interleaved": paired} if paired else results, f, indent=1)


if __name__ == "__main__":
    main()
