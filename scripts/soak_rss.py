"""RSS sampling of one process (psutil if present, else /proc/PID/status) and the soak's summary figures."""
from __future__ import annotations

import statistics
import threading
import time
import tracemalloc

MIB = 1024 * 1024


def rss_bytes(pid: int) -> int | None:
    try:
        import psutil

        return psutil.Process(pid).memory_info().rss
    except ImportError:
        pass
    except Exception:  # the process is gone
        return None
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        return None
    return None


class RssSampler:
    """A daemon thread that records the RSS of `pid` every `every_s` seconds between start() and stop()."""

    def __init__(self, pid: int, every_s: float):
        self.pid, self.every_s = pid, every_s
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="rss-sampler")

    def _run(self) -> None:
        while True:
            value = rss_bytes(self.pid)
            if value is not None:
                self.samples.append(value)
            if self._stop.wait(self.every_s):
                return

    def start(self) -> "RssSampler":
        self._thread.start()
        return self

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join()
        value = rss_bytes(self.pid)  # one last sample, at the end of the run
        if value is not None:
            self.samples.append(value)
        return rss_summary(self.samples, self.every_s)


class PythonHeap:
    """tracemalloc from start() to stop(): how much the Python heap grew and where (the top lines by growth)."""

    def start(self, frames: int = 4) -> "PythonHeap":
        tracemalloc.start(frames)
        self._first = tracemalloc.take_snapshot()
        return self

    def stop(self, top: int = 10) -> dict:
        last = tracemalloc.take_snapshot()
        current, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        keep = [tracemalloc.Filter(False, tracemalloc.__file__)]
        diff = last.filter_traces(keep).compare_to(self._first.filter_traces(keep), "traceback")
        grew = sum(d.size_diff for d in diff)
        return {"growth_mib": grew / MIB, "traced_now_mib": current / MIB, "traced_peak_mib": peak / MIB,
                "top": [{"mib": d.size_diff / MIB, "blocks": d.count_diff,
                         # the allocating line first, then its callers
                         "where": " <- ".join(f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno}"
                                              for f in reversed(d.traceback))} for d in diff[:top]]}


def rss_summary(samples: list[int], every_s: float) -> dict:
    """First/median/max RSS and the growth from the first 10% of samples to the last 10% (means), in MiB."""
    if not samples:
        return {"samples": 0}
    tenth = max(1, len(samples) // 10)
    head, tail = statistics.fmean(samples[:tenth]), statistics.fmean(samples[-tenth:])
    return {"samples": len(samples), "every_s": every_s, "first_mib": samples[0] / MIB,
            "median_mib": statistics.median(samples) / MIB, "max_mib": max(samples) / MIB,
            "growth_mib": (tail - head) / MIB,
            # the shape of the curve: RSS at 0%, 10%, ..., 100% of the samples, and every sample (MiB)
            "deciles_mib": [round(samples[min(len(samples) - 1, len(samples) * d // 10)] / MIB, 1) for d in range(11)],
            "samples_mib": [round(x / MIB, 1) for x in samples]}


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def latency(values: list[float]) -> dict:
    return {f"p{q}": pct(values, q) for q in (50, 90, 99)}


def fmt_rss(r: dict) -> str:
    if not r.get("samples"):
        return "RSS: no samples"
    line = (f"RSS: {r['samples']} samples every {r['every_s']:g} s; first {r['first_mib']:.1f} MiB, median "
            f"{r['median_mib']:.1f}, max {r['max_mib']:.1f}; growth first 10% -> last 10% {r['growth_mib']:+.1f} MiB; "
            f"at each tenth of the run {' '.join(f'{x:g}' for x in r['deciles_mib'])}")
    heap = r.get("python_heap")
    if heap:
        sites = "; ".join(f"{t['mib']:+.2f} MiB ({t['blocks']:+d} blocks) {t['where']}" for t in heap["top"][:5])
        line += f"\nPython heap over the sampled turns (tracemalloc): {heap['growth_mib']:+.2f} MiB; top: {sites}"
    return line


def fmt_latency(name: str, lat: dict) -> str:
    return f"{name} (s): " + ", ".join(f"{k} {v:.3f}" for k, v in lat.items())


def now() -> float:
    return time.perf_counter()
