"""`qwenlocal bench`: the paired A/B protocol of DESIGN.md as a command.

Arms (engine-option variants, or later a peer engine) run interleaved in rotating order, pair after pair, over
each context: the same seeded prompt for every arm of a pair, a warm-up first, >= 3 pairs for a real result.
The table shows median (mean) [min-max] and per-pair ratios vs the first arm; one JSON per run (commit,
machine, plan, routing spec, every raw figure) goes under --out; --compare A.json B.json reads two back.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict
from pathlib import Path

from qwenlocal.app.commands import add_threads_argument
from qwenlocal.engine.errors import OptionError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="checkpoint folder, known name, hub id or synthetic:NAME "
                                        "(default: the built-in demo model; on the GPU: synthetic:qwen3.6-35b-a3b)")
    parser.add_argument("--arms", default="baseline",
                        help="registered arms, comma-separated; the first is the reference (see --list-arms). "
                             "Default: baseline alone (the engine's own choices); name more, or add --arm, to "
                             "compare")
    parser.add_argument("--arm", action="append", default=[], metavar="NAME:key=value,...",
                        help="an ad-hoc arm of engine options, e.g. small:prefill_chunk=256 (repeatable)")
    parser.add_argument("--list-arms", action="store_true", help="show the registered arms and exit")
    parser.add_argument("--contexts", default="1k,16k", help="decode at these contexts, e.g. 16k,120k")
    parser.add_argument("--prompt-lengths", default="", help="TTFT-only cases (prefill + first token), e.g. 64k")
    parser.add_argument("--output-tokens", type=int, default=128, help="tokens generated per decode trial")
    parser.add_argument("--sampling", choices=("model", "argmax"), default="model",
                        help="decode loop: 'model' = chat's loop with the checkpoint's sampling (the rate a chat "
                             "user sees; default), 'argmax' = greedy with the token kept on the GPU (the step alone)")
    parser.add_argument("--pairs", type=int, default=3, help="pairs per case (the protocol wants at least 3)")
    parser.add_argument("--warmup", type=float, default=10.0, metavar="SECONDS",
                        help="warm-up: one trial per arm, then round-robin until this long has passed")
    parser.add_argument("--vram-budget", metavar="SIZE", help="VRAM the engine may use, e.g. 16GiB (a 16 GB card)")
    parser.add_argument("--max-context", type=int, metavar="TOKENS", help="size the KV cache for this many tokens")
    parser.add_argument("--routing", metavar="SPEC", help="synthetic routing trace for every arm: JSON or "
                                                          "key=value,... (passed to the engine as options.routing)")
    parser.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda when available")
    add_threads_argument(parser)
    parser.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), help="default: the engine's (bf16 on cuda)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the prompts")
    parser.add_argument("--reload", action="store_true",
                        help="load each arm's engine per trial (one model in memory at a time; slow)")
    parser.add_argument("--force", action="store_true", help="run even if the fit check says it will not fit")
    parser.add_argument("--out", type=Path, help="folder for the JSON result (default: bench/ in the data folder)")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("A.json", "B.json"),
                        help="compare two saved runs instead of running")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console()
    if args.list_arms:
        return _list_arms(console)
    if args.compare:
        return _compare(console, *args.compare)
    return _bench(args, console)


def _list_arms(console) -> int:
    from qwenlocal.engine.bench.arms import ARMS

    for arm in ARMS.values():
        opts = ", ".join(f"{k}={v}" for k, v in arm.options.items()) or "defaults"
        console.print(f"[bold]{arm.name}[/] ({opts}): {arm.description}")
    console.print("[dim]Ad-hoc: --arm NAME:key=value,... with EngineOptions fields (prefill_chunk, prefill_mode, "
                  "overlap, cuda_graphs, max_context).[/]")
    return 0


def _compare(console, a_path: Path, b_path: Path) -> int:
    from qwenlocal.app.bench_view import render_compare
    from qwenlocal.engine.bench.record import compare, load_record

    a, b = load_record(a_path), load_record(b_path)
    render_compare(a, b, compare(a, b), (a_path.name, b_path.name), console)
    return 0


def _bench(args: argparse.Namespace, console) -> int:
    from qwenlocal.app.bench_view import render_run
    from qwenlocal.app.models import fit_check, resolve_model
    from qwenlocal.engine.bench.arms import parse_arms, parse_spec
    from qwenlocal.engine.bench.protocol import build_cases, parse_tokens, run_protocol
    from qwenlocal.engine.bench.record import write_record

    started = time.time()
    arms = parse_arms(args.arms, args.arm)
    contexts = [parse_tokens(t) for t in args.contexts.split(",") if t.strip()]
    lengths = [parse_tokens(t) for t in args.prompt_lengths.split(",") if t.strip()]
    cases = build_cases(contexts, lengths, args.output_tokens)
    if args.pairs < 1:
        raise OptionError("--pairs must be at least 1")
    base = {"routing": parse_spec(args.routing), "max_context": args.max_context, "threads": args.threads}
    for arm in arms:
        arm.engine_options(base)  # every arm's options validate before anything loads
    notes = []
    if args.pairs < 3:
        notes.append(f"{args.pairs} pair(s): below the protocol's 3; a smoke run, not a result")
    fit_opts = arms[0].engine_options({**base, "vram_budget": args.vram_budget})
    resolved = resolve_model(args.model, check_fit=False)
    profile = _profile()
    fit = fit_check(resolved, device=args.device, options=fit_opts, dtype=args.dtype, profile=profile,
                    force=args.force, force_hint="--force runs it anyway")
    # The roofline's link speed: the probe's expert-sized gather, else its plain pinned copy.
    bandwidth = (profile.value("h2d_expert_gather_gbps") or profile.value("h2d_pinned_gbps")) if profile else None
    console.print(f"model: {resolved.label}", highlight=False)

    def opener(arm):
        from qwenlocal.engine.bench.measure import EngineRunner

        t0 = time.perf_counter()
        runner = arm.runner or EngineRunner(args.sampling)
        session = runner.open(resolved.target, device=args.device, dtype=args.dtype, vram_budget=args.vram_budget,
                              options=arm.engine_options(base))
        console.print(f"arm {arm.name}: loaded in {time.perf_counter() - t0:.1f} s", highlight=False)
        return session

    trials: list = []
    outcome: dict = {"arms": {}, "skipped": []}
    complete = False
    try:
        with _progress(console) as update:
            outcome = run_protocol(arms, cases, opener, pairs=args.pairs, warmup_s=args.warmup, seed=args.seed,
                                   trials=trials, reload=args.reload, bandwidth_gbps=bandwidth, progress=update)
        complete = True
    finally:
        if trials or complete:  # an interrupted run keeps what it measured, marked incomplete
            record = _record(args, resolved, arms, cases, contexts, lengths, base, trials, outcome, profile, fit,
                             notes, started, complete)
            path = write_record(record, results_dir(args.out))
            if complete:
                render_run(record, console)
            console.print(f"{'result' if complete else '[yellow]partial result (interrupted)[/]'}: {path}",
                          highlight=False)
    return 0


def results_dir(out: Path | None) -> Path:
    """--out, else bench/ under the platformdirs data folder (never the folder the user happens to be in)."""
    if out is not None:
        return out
    from qwenlocal.app.paths import data_dir

    return data_dir() / "bench"


def _record(args, resolved, arms, cases, contexts, lengths, base, trials, outcome, profile, fit, notes, started,
            complete) -> dict:
    from qwenlocal.app.fit import describe
    from qwenlocal.engine.bench.record import build_record

    facts = resolved.facts()
    settings = {"contexts": contexts, "prompt_lengths": lengths, "output_tokens": args.output_tokens,
                "pairs": args.pairs, "sampling": args.sampling, "warmup_s": args.warmup, "seed": args.seed,
                "reload": args.reload,
                "device": _device(outcome, args.device), "dtype": args.dtype, "vram_budget": args.vram_budget,
                "max_context": args.max_context, "routing": base["routing"], "arms": [a.name for a in arms],
                "arguments": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                              if k != "compare"}}
    model = {"name": _model_name(resolved), "ref": resolved.ref, "kind": resolved.kind, "repo_id": resolved.repo_id,
             "facts": asdict(facts) if facts else None}
    return build_record(command=list(sys.argv), settings=settings, model=model, arms=arms,
                        arm_info=outcome.get("arms", {}), cases=cases, trials=trials,
                        skipped=outcome.get("skipped", []), profile=profile, started=started, complete=complete,
                        notes=notes, fit=describe(fit) if fit is not None else None)


def _progress(console):
    from contextlib import contextmanager

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    @contextmanager
    def cm():
        if not console.is_terminal:  # a log (CI, a remote GPU): one timestamped line per step, kept
            t0 = time.perf_counter()

            def line(done: int, total: int, what: str) -> None:
                console.print(f"[{time.perf_counter() - t0:7.1f} s] {done}/{total} {what}", highlight=False)

            yield line
            return
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console, transient=True) as progress:
            task = progress.add_task("loading", total=None)

            def update(done: int, total: int, what: str) -> None:
                progress.update(task, completed=done, total=total, description=what)

            yield update

    return cm()


def _profile():
    from qwenlocal.app.models import machine_profile

    return machine_profile()


def _device(outcome: dict, asked: str | None) -> str | None:
    for info in outcome.get("arms", {}).values():
        dev = str(info.get("device") or "")
        if dev:
            return dev.split(":")[0]
    return asked


def _model_name(resolved) -> str:
    if resolved.kind == "demo":
        return "demo-tiny"
    if resolved.kind == "synthetic":
        return resolved.ref
    return resolved.repo_id or (resolved.path.name if resolved.path else resolved.ref)
