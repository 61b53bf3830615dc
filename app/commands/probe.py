"""`qwenlocal probe`: measure this machine (or read the cached profile) and show what the engine will turn on.

The plan is for the default model, Qwen3.6-35B-A3B NVFP4, under the options given here: the engine's own
`resolve` (the EngineConfig a real engine would run with, the same keys as `Engine.plan`), with the kernel
packages that are installed here.
"""
from __future__ import annotations

import argparse
import json
import time

from qwenlocal.engine.errors import QwenlocalError
from qwenlocal.engine.options import OVERLAP_MODES, PREFILL_MODES

SECTIONS = (
    ("GPU", ("cuda_available", "gpu_name", "gpu_uuid", "compute_capability", "sm_count", "vram_total", "vram_free",
             "driver_version", "driver_model", "cuda_version", "torch_version")),
    ("host link", ("pcie_gen", "pcie_width", "pcie_gen_max", "pcie_width_max", "copy_engines", "h2d_pinned_gbps",
                   "d2h_pinned_gbps", "h2d_pageable_gbps", "d2h_pageable_gbps", "bidir_pinned_gbps",
                   "h2d_expert_gather_gbps", "h2d_overlaps_compute", "overlap_microbench")),
    ("host", ("os_name", "os_release", "wsl2", "host_ram_total", "host_ram_available", "pinnable_bytes", "cpu_cores")),
)
SOURCE_STYLE = {"measured": "green", "read": "cyan", "assumed": "yellow", "unavailable": "dim red"}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--refresh", action="store_true", help="measure again instead of using the cached profile")
    parser.add_argument("--json", action="store_true", help="print the profile and the plan as JSON")
    parser.add_argument("--full", action="store_true",
                        help="a deeper measurement: more copy sizes and repetitions (slower)")
    parser.add_argument("--overlap-bench", action="store_true",
                        help="also run the decode-overlap micro-bench (one MoE layer, each split; ~1 min) and keep "
                             "its result in the profile, where the plan uses it to choose the split")
    plan = parser.add_argument_group("plan options (what the plan would be with these engine options)")
    plan.add_argument("--vram-budget", metavar="SIZE", help="VRAM the engine may use, e.g. 16GiB (simulates a smaller card)")
    plan.add_argument("--max-context", type=int, metavar="TOKENS", help="size the KV cache for this many tokens")
    plan.add_argument("--overlap", choices=OVERLAP_MODES, help="decode overlap split (default: auto)")
    plan.add_argument("--prefill-mode", choices=PREFILL_MODES, help="prefill loop order (default: auto)")
    plan.add_argument("--prefill-chunk", type=int, metavar="TOKENS", help="tokens per prefill chunk")
    plan.add_argument("--no-cuda-graphs", action="store_true", help="plan without CUDA graphs")
    plan.add_argument("--device", choices=("cuda", "cpu"), help="plan for this device (default: cuda when present)")


def run(args: argparse.Namespace) -> int:
    from qwenlocal.engine.engine_config import Software
    from qwenlocal.engine.options import EngineOptions
    from qwenlocal.engine.probe import get_profile
    from qwenlocal.engine.registry import QWEN36_35B_A3B_NVFP4_INFO
    from qwenlocal.engine.resolve import resolve

    t0 = time.perf_counter()
    options = EngineOptions.coerce(None, vram_budget=args.vram_budget, max_context=args.max_context,
                                   overlap=args.overlap, prefill_mode=args.prefill_mode,
                                   prefill_chunk=args.prefill_chunk, cuda_graphs=False if args.no_cuda_graphs else None)
    result = get_profile(refresh=args.refresh, depth="full" if args.full else "quick")
    if args.overlap_bench:
        result = _overlap_bench(result)
    model = QWEN36_35B_A3B_NVFP4_INFO
    plan, plan_error = None, None
    try:
        plan = resolve(options, model, result.profile, args.device, Software.installed())
    except QwenlocalError as exc:
        plan_error = exc
    elapsed = time.perf_counter() - t0
    if args.json:
        print(json.dumps(_as_json(result, model, options, plan, plan_error, elapsed), indent=2))
    else:
        _show(result, model, plan, plan_error, elapsed)
    return 0


def _as_json(result, model, options, plan, plan_error, elapsed: float) -> dict:
    from dataclasses import asdict

    profile = result.profile
    opts = {k: v for k, v in asdict(options).items() if k != "routing"}
    return {
        "cuda_available": profile.has_cuda,
        "cuda_note": profile.cuda_available.note,
        "profile": profile.to_dict(),
        "model": {**asdict(model), "params": model.params,
                  "sizes": asdict(model.facts(plan.dtype, plan.experts == "nvfp4", plan.linears == "native"))
                  if plan else None},
        "options": opts,
        "plan": plan.to_dict() if plan else None,
        "plan_error": {"kind": type(plan_error).__name__, "message": str(plan_error)} if plan_error else None,
        "cache": {"path": str(result.path) if result.path else None, "from_cache": result.from_cache,
                  "note": result.note},
        "runtime_s": round(elapsed, 3),
    }


def _overlap_bench(result):
    """Measure the splits on this GPU and store {"off", "copy-side", "shared-side": us per layer} in the profile."""
    from qwenlocal.engine.errors import ResourceError
    from qwenlocal.engine.probe.cache import update_profile
    from qwenlocal.engine.probe.overlap_bench import describe, run_overlap_microbench
    from qwenlocal.engine.probe.profile import measured
    from qwenlocal.engine.synthetic import synthetic_config

    if not result.profile.has_cuda:
        raise ResourceError("the overlap micro-bench needs a CUDA GPU; this machine has none")
    bench = run_overlap_microbench(synthetic_config("synthetic:qwen3.6-35b-a3b", 248320))
    times = {k: bench[k] for k in ("off", "copy-side", "shared-side")}
    return update_profile(lambda p: p.with_facts(overlap_microbench=measured(times, describe(bench))))


def _show(result, model, plan, plan_error, elapsed: float) -> None:
    from rich.console import Console
    from rich.table import Table

    from qwenlocal.engine.probe.profile import LABELS, format_fact

    console = Console()
    profile = result.profile
    gpu_names = set(SECTIONS[0][1] + SECTIONS[1][1]) - {"cuda_available", "torch_version", "overlap_microbench"}
    if not profile.has_cuda:
        why = profile.cuda_available.note
        why = why[len("no CUDA GPU found"):].lstrip(": ") if why.startswith("no CUDA GPU found") else why
        console.print(f"[bold yellow]No CUDA GPU found[/]{': ' + why if why else ''}. "
                      "The engine will run on the CPU (slowly); nothing on the GPU side was measured.")
    table = Table(title="Hardware profile", title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value")
    table.add_column("source")
    table.add_column("note", style="dim", overflow="fold")
    for i, (section, names) in enumerate(SECTIONS):
        if i:
            table.add_section()
        table.add_row(f"[underline]{section}[/]")
        for name in names:
            fact = getattr(profile, name)
            if not profile.has_cuda and name in gpu_names and not fact.known:
                continue  # said once above; a column of "no CUDA GPU" rows tells nothing more
            table.add_row(LABELS[name][0], format_fact(name, fact), f"[{SOURCE_STYLE[fact.source]}]{fact.source}[/]",
                          fact.note)
    console.print(table)

    if plan_error is not None:
        console.print(f"[bold red]Plan for {model.name}: cannot run[/] ({type(plan_error).__name__}): {plan_error}")
    else:
        ptable = Table(title=f"Plan for {model.name}", title_justify="left")
        ptable.add_column("choice", style="bold")
        ptable.add_column("value")
        ptable.add_column("by")
        ptable.add_column("reason", overflow="fold")
        for name, value, reason, overridden in plan.rows():
            ptable.add_row(name, str(value), "[magenta]user[/]" if overridden else "auto", reason)
        console.print(ptable)
    where = str(result.path) if result.path else "not cached"
    how = (f"cached profile ({result.note}); --refresh measures again" if result.from_cache
           else f"measured now in {profile.probe_seconds:.1f} s ({profile.depth}; {result.note})")
    console.print(f"[dim]{how}. Profile file: {where}. Total {elapsed:.1f} s.[/]")
