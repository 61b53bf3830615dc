"""Does a model fit this machine? Disk (for a download), host RAM (the expert bank), VRAM (the minimum plan).

The sizes come from engine/memory.py's ModelFacts and the machine from the probe's HardwareProfile; every
byte of arithmetic (budget, context, slots, stream buffers, the VRAM minimum, the CPU path's RAM) is
engine/memory.py's, the module the plan and `probe` use, so this check and the plan cannot disagree (tests
hold them to it). Unlike resolve, which stops at the first problem, the report lists every one, with what to
do. No torch.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from qwenlocal.engine import memory
from qwenlocal.engine.errors import ResourceError
from qwenlocal.engine.memory import MIN_AUTO_CONTEXT, ModelFacts, pow2_floor as _pow2_floor
from qwenlocal.engine.options import EngineOptions

if TYPE_CHECKING:
    from qwenlocal.engine.probe.profile import HardwareProfile
    from qwenlocal.engine.registry import KnownModel

GIB = 2**30
DISK_MARGIN = 2 * GIB  # the hub's metadata, a partial file being written, and room for the OS to breathe
_DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I64": 8, "I32": 4, "I16": 2, "U8": 1, "I8": 1, "BOOL": 1,
                "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1}


def gib(n: float | None) -> str:
    return "?" if n is None else f"{n / GIB:.1f} GiB"


@dataclass(frozen=True)
class FitItem:
    what: str  # "disk" | "host RAM" | "pinned RAM" | "VRAM"
    status: str  # "ok" | "warn" (runs, slower or after closing apps) | "fail" | "unknown"
    need: int | None
    have: int | None
    detail: str
    advice: tuple[str, ...] = ()


@dataclass(frozen=True)
class FitReport:
    model: str
    device: str
    items: tuple[FitItem, ...]

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def failures(self) -> list[FitItem]:
        return [i for i in self.items if i.status == "fail"]

    @property
    def warnings(self) -> list[FitItem]:
        return [i for i in self.items if i.status == "warn"]

    def message(self) -> str:
        bad = self.failures or self.warnings
        if not bad:
            return f"{self.model} fits this machine ({self.device})"
        head = (f"{self.model} does not fit this machine ({self.device})" if self.failures
                else f"{self.model} fits, with caveats ({self.device})")
        lines = [head + ":"]
        advice: list[str] = []
        for item in bad:
            lines.append(f"  - {item.what}: {item.detail}")
            advice += [a for a in item.advice if a not in advice]
        if advice:
            lines.append("To run it: " + "; or ".join(advice) + ".")
        return "\n".join(lines)

    def raise_if_unfit(self, force: bool = False, force_hint: str = "--force goes ahead anyway.") -> None:
        if self.failures and not force:
            raise ResourceError(self.message() + (f"\n({force_hint})" if force_hint else ""))


def check_fit(facts: ModelFacts, profile: "HardwareProfile", *, device: str | None = None,
              options: EngineOptions | dict | None = None, download_bytes: int | None = None,
              disk_path: Path | None = None, alternatives: Iterable["KnownModel"] = (),
              free_disk: int | None = None, params: int | None = None, cpu_dtype_bytes: int = 4,
              name: str | None = None) -> FitReport:
    """Every check that applies. download_bytes + disk_path (or free_disk): a download is planned.
    params: the text tower's parameter count; the CPU path holds them all at cpu_dtype_bytes (float32: 4)."""
    opts = EngineOptions.coerce(options)
    dev = device or ("cuda" if profile.has_cuda else "cpu")
    alts = [a for a in alternatives if a.facts.experts_total_bytes < facts.experts_total_bytes]
    items: list[FitItem] = []
    if download_bytes is not None:
        items.append(_disk(download_bytes, disk_path, free_disk))
    if dev == "cpu":
        items.append(_cpu_ram(facts, profile, alts, params, cpu_dtype_bytes))
        return FitReport(name or facts.name, dev, tuple(items))
    vram, all_resident = _vram(facts, profile, opts, alts)
    items.append(vram)
    items += _bank(facts, profile, alts, all_resident)
    return FitReport(name or facts.name, dev, tuple(items))


def disk_report(name: str, download_bytes: int, disk_path: Path | None, free_disk: int | None = None) -> FitReport:
    """Only the disk check: for a checkpoint whose sizes are not known before its files arrive."""
    return FitReport(name, "disk", (_disk(download_bytes, disk_path, free_disk),))


def _disk(need_bytes: int, path: Path | None, free: int | None) -> FitItem:
    if free is None and path is not None:
        from .hub import free_disk_bytes

        free = free_disk_bytes(path)
    need = need_bytes + DISK_MARGIN
    where = f" on {path}" if path else ""
    if free is None:
        return FitItem("disk", "unknown", need, None, f"needs {gib(need)}{where}; free space could not be read")
    if free >= need:
        return FitItem("disk", "ok", need, free, f"{gib(need_bytes)} to download, {gib(free)} free{where}")
    return FitItem("disk", "fail", need, free,
                   f"needs {gib(need_bytes)} + {gib(DISK_MARGIN)} margin, only {gib(free)} free{where}",
                   (f"free {gib(need - free)}{where}", "download to a bigger disk with --dir /path"))


def _alt_advice(alts: list["KnownModel"], fits) -> list[str]:
    return [f"use {a.repo_id} ({a.expert_format} experts, bank {gib(a.facts.experts_total_bytes)}; "
            f"`qwenlocal download {a.aliases[0]}`)" for a in alts if fits(a.facts)]


def _cpu_ram(facts: ModelFacts, profile, alts, params: int | None, dtype_bytes: int) -> FitItem:
    # The CPU path computes in float32 (or --dtype): every weight is held at that width, not as stored.
    need = params * dtype_bytes if params else memory.cpu_ram_bytes(facts)
    total, avail = profile.value("host_ram_total"), profile.value("host_ram_available")
    if total is None:
        return FitItem("host RAM", "unknown", need, None, f"needs {gib(need)}; this machine's RAM is unknown")
    if need > total:
        advice = [] if params else _alt_advice(alts, lambda f: memory.cpu_ram_bytes(f) <= total)
        width = f" at {dtype_bytes * 8}-bit" if params else ""
        return FitItem("host RAM", "fail", need, total,
                       f"the CPU path keeps every weight in RAM{width}: {gib(need)}, this machine has {gib(total)}",
                       tuple(advice + ["run it on a machine with an NVIDIA GPU (experts offloaded to RAM)"]))
    if avail is not None and need > avail:
        return FitItem("host RAM", "warn", need, avail, f"needs {gib(need)}, only {gib(avail)} free now",
                       (f"close programs to free {gib(need - avail)} of RAM",))
    return FitItem("host RAM", "ok", need, total, f"{gib(need)} of weights in RAM ({gib(total)} total)")


def vram_budget(profile, opts: EngineOptions) -> tuple[int | None, str]:
    """The budget the plan would use: the user's (capped by free VRAM), else free less a margin."""
    free, total = profile.value("vram_free"), profile.value("vram_total")
    if opts.vram_budget is not None:
        budget, note = memory.capped_budget(opts.vram_budget, free)
        return budget, f"--vram-budget {gib(opts.vram_budget)}" + (f", capped by {gib(free)} free" if note else "")
    budget, _ = memory.auto_vram_budget(free, total)
    if free:
        return budget, f"{gib(free)} free"
    return budget, f"90% of {gib(total)}" if total else "VRAM size unknown"


def gpu_chunk(facts: ModelFacts, opts: EngineOptions, budget: int | None) -> int:
    """The prefill chunk the plan takes on a GPU under `budget` (engine/memory.prefill_chunk_for's rule)."""
    def slots_at(chunk: int) -> tuple[int, bool, int] | None:
        ctx = opts.max_context or memory.auto_context(facts, budget, chunk)
        if sum(memory.vram_minimum(facts, chunk, ctx).values()) > budget:
            return None
        fit = memory.slot_fit(facts, budget, ctx, chunk)
        return fit.slots, fit.all_resident, ctx
    return memory.prefill_chunk_for("cuda", opts.prefill_chunk, slots_at if budget is not None else None)


def planned_context(facts: ModelFacts, opts: EngineOptions, budget: int | None) -> int:
    """The context the plan sizes the KV cache for: the user's, else memory.auto_context. The plan does not
    shrink it to make one layer of slots fit, so neither does this check."""
    if opts.max_context:
        return opts.max_context
    if budget is None:
        return MIN_AUTO_CONTEXT
    return memory.auto_context(facts, budget, gpu_chunk(facts, opts, budget))


def vram_minimum(facts: ModelFacts, opts: EngineOptions, context: int | None = None,
                 budget: int | None = None) -> dict[str, int]:
    """The plan's minimum: the parts that must be on the GPU for `context` tokens (default: the smallest
    context the plan picks) with one layer of expert slots, at the chunk the plan takes under `budget`."""
    return memory.vram_minimum(facts, gpu_chunk(facts, opts, budget),
                               context or opts.max_context or MIN_AUTO_CONTEXT)


def _vram(facts: ModelFacts, profile, opts: EngineOptions, alts) -> tuple[FitItem, bool]:
    budget, source = vram_budget(profile, opts)
    ctx = planned_context(facts, opts, budget)
    parts = vram_minimum(facts, opts, ctx, budget)
    need = sum(parts.values())
    breakdown = " + ".join(f"{k} {gib(v)}" for k, v in parts.items())
    if budget is None:
        return FitItem("VRAM", "unknown", need, None, f"needs {gib(need)} ({breakdown}); {source}: pass "
                       "--vram-budget", ("pass --vram-budget SIZE",)), False
    fixed = need - parts["kv"] - parts["one layer of slots"]
    if need > budget:
        advice = []
        ctx_fit = (budget - fixed - parts["one layer of slots"]) // facts.kv_bytes_per_token
        if ctx_fit >= MIN_AUTO_CONTEXT and ctx > ctx_fit:
            advice.append(f"a shorter context (--max-context {_pow2_floor(ctx_fit):,})")
        advice += _alt_advice(alts, lambda f: sum(vram_minimum(f, opts, planned_context(f, opts, budget),
                                                               budget).values()) <= budget)
        free, total = profile.value("vram_free"), profile.value("vram_total")
        if free and total and free < 0.9 * total:
            advice.append(f"close other programs using the GPU ({gib(total - free)} of {gib(total)} is in use)")
        if opts.vram_budget is not None and (not free or opts.vram_budget < free):
            advice.append("raise --vram-budget")
        advice.append("a GPU with more memory")
        return FitItem("VRAM", "fail", need, budget,
                       f"needs {gib(need)} at {ctx:,} tokens of context ({breakdown}); the budget is {gib(budget)} "
                       f"({source})", tuple(advice)), False
    fit = memory.slot_fit(facts, budget, ctx, gpu_chunk(facts, opts, budget))
    all_resident, slots = fit.all_resident, fit.slots
    share = "all experts resident" if all_resident else f"{slots:,} expert slots ({slots / facts.total_experts:.0%})"
    return FitItem("VRAM", "ok", need, budget, f"{gib(need)} at {ctx:,} tokens of context; budget {gib(budget)} "
                   f"({source}) leaves {share}"), all_resident


def _bank(facts: ModelFacts, profile, alts, all_resident: bool) -> list[FitItem]:
    bank = facts.experts_total_bytes
    if all_resident:
        return [FitItem("host RAM", "ok", 0, profile.value("host_ram_total"),
                        "every expert fits on the GPU: no host bank")]
    total, avail = profile.value("host_ram_total"), profile.value("host_ram_available")
    pinnable = profile.value("pinnable_bytes")
    if total is None:
        return [FitItem("host RAM", "unknown", bank, None, f"the expert bank needs {gib(bank)}; RAM size unknown")]
    if bank > total:
        advice = _alt_advice(alts, lambda f: f.experts_total_bytes <= total)
        advice.append("add RAM (under WSL2, raise memory= in .wslconfig)")
        return [FitItem("host RAM", "fail", bank, total, f"the expert bank needs {gib(bank)} of RAM, this machine "
                        f"has {gib(total)}", tuple(advice))]
    items = [FitItem("host RAM", "ok", bank, total, f"expert bank {gib(bank)} of {gib(total)}")]
    if avail is not None and bank > avail:
        items[0] = FitItem("host RAM", "warn", bank, avail, f"the expert bank needs {gib(bank)}, {gib(avail)} is free "
                           "now (the system would swap)", (f"close programs to free {gib(bank - avail)} of RAM",))
    if pinnable is not None and bank > pinnable:
        capped = profile.wddm or profile.value("os_name") == "Windows"
        why = "WSL2/Windows pin at most about half of RAM" if capped else "not enough free RAM to pin it all"
        items.append(FitItem("pinned RAM", "warn", bank, pinnable,
                             f"{why}: {gib(pinnable)} of the {gib(bank)} bank can be pinned; misses from the rest "
                             "copy several times slower", tuple(_alt_advice(alts, lambda f: f.experts_total_bytes
                                                                            <= pinnable))))
    return items


_NOT_PARAMS = ("weight_scale", "weight_scale_2", "weight_scale_inv", "input_scale", "k_scale", "v_scale")


def params_from_checkpoint(folder: Path) -> int:
    """Text-tower parameter count from the headers; packed FP4 (U8 beside a weight_scale) counts two per byte."""
    from qwenlocal.engine.checkpoint import Checkpoint

    entries = Checkpoint(folder).entries
    total = 0
    for canon, entry in entries.items():
        if canon.endswith(_NOT_PARAMS):
            continue
        n = 1
        for dim in entry.shape:
            n *= dim
        packed = entry.dtype == "U8" and canon.endswith(".weight") and canon[:-len("weight")] + "weight_scale" in entries
        total += 2 * n if packed else n
    return total


def facts_from_checkpoint(folder: Path, name: str | None = None) -> ModelFacts:
    """Sizes of a local checkpoint as stored: expert and dense bytes from the safetensors headers (exact for
    mixed-precision checkpoints), KV and state from config.json. Reads headers only."""
    from qwenlocal.engine.checkpoint import Checkpoint
    from qwenlocal.engine.config import load_model_config

    cfg = load_model_config(folder)
    expert = dense = 0
    for canon, entry in Checkpoint(folder).entries.items():
        n = _DTYPE_BYTES.get(entry.dtype, 2)
        for dim in entry.shape:
            n *= dim
        if ".mlp.experts." in f".{canon}":
            expert += n
        else:
            dense += n
    base = ModelFacts.from_config(cfg, name=name or Path(folder).name)
    per_expert = expert // max(1, base.num_layers * base.num_experts)
    return replace(base, expert_bytes=per_expert, dense_bytes=dense)


def report_rows(report: FitReport) -> list[tuple[str, str, str, str, str]]:
    """(what, status, need, have, detail) for tables."""
    return [(i.what, i.status, gib(i.need) if i.need else "-", gib(i.have), i.detail) for i in report.items]


def describe(report: FitReport) -> dict[str, Any]:
    """JSON form (bench records, download --json)."""
    return {"model": report.model, "device": report.device, "ok": report.ok,
            "items": [i.__dict__ | {"advice": list(i.advice)} for i in report.items]}
