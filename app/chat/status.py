"""The live status line: tok/s, TTFT, context, expert hit rate, PCIe GB/s, VRAM; the plan as its tooltip.

Stats come from different backends with different counters, so every field is optional and read tolerantly.
At narrow widths the least important fields are dropped (the details panel, F2, shows everything).
"""
from __future__ import annotations

from typing import Any

from textual.widgets import Static

SEP = " │ "


def _num(values: dict, *keys: str) -> float | None:
    for key in keys:
        v = values.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    return None


def hit_rate(values: dict) -> float | None:
    rate = _num(values, "expert_hit_rate", "hit_rate")
    if rate is not None:
        return rate
    hits, misses = _num(values, "hits", "expert_hits"), _num(values, "misses", "expert_misses")
    if hits is not None and misses is not None and hits + misses > 0:
        return hits / (hits + misses)
    return None


def status_fields(values: dict) -> list[str]:
    """The formatted fields, most important first."""
    out = []
    tok_s = _num(values, "decode_tok_s", "tok_s")
    if tok_s is not None:
        out.append(f"{tok_s:.1f} tok/s")
    ttft = _num(values, "ttft_s")
    if ttft is not None:
        out.append(f"TTFT {ttft * 1000:.0f} ms" if ttft < 1 else f"TTFT {ttft:.2f} s")
    used = (_num(values, "prompt_tokens") or 0) + (_num(values, "completion_tokens") or 0)
    limit = _num(values, "context_limit")
    if limit:
        out.append(f"ctx {used:.0f}/{limit:.0f}")
    rate = hit_rate(values)
    if rate is not None:
        out.append(f"hit {rate * 100:.0f}%")
    gbps = _num(values, "h2d_gbps", "pcie_gbps")
    if gbps is not None:
        out.append(f"PCIe {gbps:.1f} GB/s")
    vram = _num(values, "vram_used", "vram_allocated")
    if vram is not None:
        total = _num(values, "vram_total")
        out.append(f"VRAM {vram / 2**30:.1f}" + (f"/{total / 2**30:.0f} GiB" if total else " GiB"))
    return out


def format_status(values: dict, state: str, thinking: bool, width: int) -> str:
    head = [state, f"think {'on' if thinking else 'off'}"]
    parts = head + status_fields(values)
    while len(parts) > len(head) and len(SEP.join(parts)) > width - 2:
        parts.pop()
    return SEP.join(parts)


def plan_lines(plan: dict) -> list[str]:
    lines = []
    for name, entry in plan.items():
        if isinstance(entry, dict):
            lines.append(f"{name}: {entry.get('value')}  ({entry.get('reason', '')})")
        else:
            lines.append(f"{name}: {entry}")
    return lines


def plan_summary(plan: dict) -> str:
    """"Plan: device=cuda · overlap=copy-side · … (F2: why)" plus a newline, or "" without a plan."""
    values = [f"{k}={v.get('value') if isinstance(v, dict) else v}" for k, v in plan.items()]
    return f"Plan: {' · '.join(values)} (F2: why)\n" if values else ""


class StatusBar(Static):
    """One line; the app feeds it values and state, it formats them for its current width."""

    def __init__(self, **kwargs: Any):
        super().__init__("", markup=False, **kwargs)
        self.values: dict = {}
        self.state = "loading"
        self.thinking = True

    def set_plan(self, plan: dict) -> None:
        self.tooltip = "Plan (F2 for details)\n" + "\n".join(plan_lines(plan)) if plan else None

    def show(self, values: dict | None = None, state: str | None = None, thinking: bool | None = None) -> None:
        if values is not None:
            self.values = {**self.values, **values}
        if state is not None:
            self.state = state
        if thinking is not None:
            self.thinking = thinking
        self._render_line()

    def reset_turn(self) -> None:
        """Keep the machine-level figures; drop the previous turn's speed and TTFT."""
        for key in ("decode_tok_s", "tok_s", "ttft_s"):
            self.values.pop(key, None)

    def on_resize(self) -> None:
        self._render_line()

    def _render_line(self) -> None:
        # layout=False: the bar is one line of fixed height whose width comes from the screen, never from its
        # text, so a new text needs a repaint of this line only. Static.update's default (layout=True) made each
        # of the ~25 stats updates a second at 200 tok/s a full-screen layout of the streaming conversation.
        self.update(format_status(self.values, self.state, self.thinking, self.size.width or 80), layout=False)
