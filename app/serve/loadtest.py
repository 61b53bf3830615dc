"""A bounded load test of an OpenAI-compatible server on loopback, with a serial replay check.

C clients send N requests each at once (a fixed count: the run ends by itself). Every request has its own
prompt and seed; half stream, half do not; after the concurrent phase the same requests are replayed one at a
time, and each concurrent reply must equal its replay (same seed -> same tokens), so a lost, mixed-up or
truncated reply shows up as a mismatch. Latency percentiles are printed and can be written to a file.

    python -m qwenlocal.app.serve.loadtest [--url http://127.0.0.1:8000/v1] [--clients 4] [--per-client 25]
                                           [--max-tokens 8] [--out docs/serve_load.txt]
Without --url it starts `qwenlocal serve`'s app in this process on a free loopback port with a tiny model.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlparse


@dataclass
class Outcome:
    index: int
    text: str = ""
    finish: str = ""
    completion_tokens: int = 0
    latency_s: float = 0.0
    ttft_s: float | None = None
    error: str = ""


def _request(i: int, max_tokens: int) -> dict:
    return {"messages": [{"role": "user", "content": f"request {i}: say something about the number {i * 7919}"}],
            "max_tokens": max_tokens, "seed": 1000 + i, "temperature": 0.8,
            "extra_body": {"chat_template_kwargs": {"enable_thinking": False}}}


def _call(client, model: str, i: int, max_tokens: int, stream: bool) -> Outcome:
    out = Outcome(i)
    t0 = time.perf_counter()
    try:
        if stream:
            parts = []
            for chunk in client.chat.completions.create(model=model, stream=True, **_request(i, max_tokens)):
                for choice in chunk.choices:
                    if choice.delta.content:
                        if out.ttft_s is None:
                            out.ttft_s = time.perf_counter() - t0
                        parts.append(choice.delta.content)
                    if choice.finish_reason:
                        out.finish = choice.finish_reason
            out.text = "".join(parts)
        else:
            resp = client.chat.completions.create(model=model, **_request(i, max_tokens))
            out.text, out.finish = resp.choices[0].message.content, resp.choices[0].finish_reason
            out.completion_tokens = resp.usage.completion_tokens
    except Exception as exc:  # counted and reported: a load test must not stop at the first failure
        out.error = f"{type(exc).__name__}: {exc}"
    out.latency_s = time.perf_counter() - t0
    return out


def _loadavg() -> float | None:
    try:
        return os.getloadavg()[0]  # other work on the machine shares its CPUs: say how busy it was
    except (AttributeError, OSError):
        return None


def _fmt(x: float | None) -> str:
    return "unknown" if x is None else f"{x:.2f}"


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def run_load(base_url: str, clients: int = 4, per_client: int = 25, max_tokens: int = 8,
             api_key: str = "none") -> dict:
    import openai

    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    _call(client, model, -1, max_tokens, False)  # warm-up, not counted
    total = clients * per_client

    def one_client(c: int) -> list[Outcome]:
        return [_call(client, model, i, max_tokens, stream=i % 2 == 0) for i in range(c, total, clients)]

    load_before = _loadavg()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        outcomes = sorted((o for batch in pool.map(one_client, range(clients)) for o in batch),
                          key=lambda o: o.index)
    wall = time.perf_counter() - t0
    load_after = _loadavg()
    replay = [_call(client, model, i, max_tokens, False) for i in range(total)]
    errors = [o for o in outcomes if o.error]
    mismatched = [o.index for o, r in zip(outcomes, replay) if not o.error and (o.text, o.finish) != (r.text, r.finish)]
    lat = [o.latency_s for o in outcomes if not o.error]
    ttft = [o.ttft_s for o in outcomes if o.ttft_s is not None]
    serial = [r.latency_s for r in replay if not r.error]
    return {"clients": clients, "per_client": per_client, "requests": total, "max_tokens": max_tokens,
            "ok": total - len(errors), "errors": [o.error for o in errors], "mismatched": mismatched,
            "replay_errors": [r.error for r in replay if r.error], "wall_s": wall, "req_per_s": total / wall,
            "latency_s": {f"p{q}": _pct(lat, q) for q in (50, 90, 95, 99)} | {
                "max": max(lat, default=float("nan")), "mean": statistics.fmean(lat) if lat else float("nan")},
            "stream_ttft_s": {f"p{q}": _pct(ttft, q) for q in (50, 90, 99)},
            "serial_latency_s": {"p50": _pct(serial, 50), "p90": _pct(serial, 90)},
            "cpus": os.cpu_count(), "loadavg_1m": (load_before, load_after)}


def report(fig: dict, where: str) -> str:
    lat, ttft, ser = fig["latency_s"], fig["stream_ttft_s"], fig["serial_latency_s"]
    return "\n".join([
        f"qwenlocal serve load test ({time.strftime('%Y-%m-%d %H:%M')}, {platform.machine()}, "
        f"{platform.system()}, python {platform.python_version()})",
        f"server: {where}",
        f"machine: {fig['cpus']} CPUs; 1-min load average {_fmt(fig['loadavg_1m'][0])} before, "
        f"{_fmt(fig['loadavg_1m'][1])} after the concurrent phase (other processes included)",
        f"load: {fig['clients']} concurrent clients x {fig['per_client']} requests = {fig['requests']} chat "
        f"requests (half streamed), max_tokens {fig['max_tokens']}, distinct prompt and seed each",
        f"result: {fig['ok']}/{fig['requests']} ok, {len(fig['errors'])} errors, "
        f"{len(fig['mismatched'])} replies differing from a serial replay with the same seed "
        f"({len(fig['replay_errors'])} replay errors)",
        f"wall {fig['wall_s']:.2f} s, {fig['req_per_s']:.1f} req/s",
        "latency under load (s): " + ", ".join(f"{k} {v:.3f}" for k, v in lat.items()),
        "streamed TTFT under load (s): " + ", ".join(f"{k} {v:.3f}" for k, v in ttft.items()),
        "serial latency, one at a time (s): " + ", ".join(f"{k} {v:.3f}" for k, v in ser.items()),
        "(one generation at a time by design: latency under load is mostly queueing behind the others)",
    ] + [f"error: {e}" for e in fig["errors"][:5]]) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m qwenlocal.app.serve.loadtest", description=__doc__.split("\n")[0])
    p.add_argument("--url", help="an OpenAI-compatible base URL on loopback (default: start one here)")
    p.add_argument("--api-key", default="none")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--per-client", type=int, default=25)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--out", help="also write the figures to this file")
    args = p.parse_args(argv)
    handle = worker = None
    if args.url:
        if urlparse(args.url).hostname not in ("127.0.0.1", "localhost", "::1"):
            p.error("--url must be a loopback address: this load test only targets this machine")
        url, where = args.url, args.url
    else:
        from qwenlocal.engine.tiny import make_tiny_checkpoint

        from .launch import engine_worker, start_in_thread
        from .server import create_app

        ckpt = make_tiny_checkpoint(tempfile.mkdtemp(prefix="qwenlocal-load-"), "tiny")
        worker = engine_worker(ckpt, device="cpu", max_waiting=args.clients)
        worker.wait_ready()
        handle = start_in_thread(create_app(worker, "tiny"))
        url, where = handle.url + "/v1", f"in-process qwenlocal serve app, tiny checkpoint, CPU, {handle.url}"
    try:
        fig = run_load(url, args.clients, args.per_client, args.max_tokens, args.api_key)
    finally:
        if handle is not None:
            handle.stop()
            worker.close()
    text = report(fig, where)
    sys.stdout.write(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
    return 0 if fig["ok"] == fig["requests"] and not fig["mismatched"] and not fig["replay_errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
