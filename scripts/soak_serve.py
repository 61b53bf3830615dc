"""Soak part B: `qwenlocal serve` (a subprocess, loopback, the built-in demo model, CPU) under a bounded load.

C clients send requests back to back for the given time (each waits for its reply before the next: the load
is bounded by C). Request i uses the key i mod K (its own prompt and seed, app/serve/loadtest.py's _request);
half stream. Before the load, each key is run once, serially and not streamed: that is its reference, and every
reply under load must equal it (same seed -> same tokens), so a lost, mixed-up or truncated reply shows. The
server's RSS is sampled throughout the load.
"""
from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

import httpx

from qwenlocal.app.serve.loadtest import _call
from soak_rss import RssSampler, latency, now


def _free_port() -> int:
    from qwenlocal.app.serve.launch import bind

    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    sock.close()
    return port


def start_server(home: str, port: int, queue: int) -> subprocess.Popen:
    env = dict(os.environ, QWENLOCAL_HOME=home)
    cmd = [sys.executable, "-m", "qwenlocal.app.cli", "serve", "--port", str(port), "--device", "cpu",
           "--queue", str(queue), "--log-level", "warning"]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def wait_healthy(proc: subprocess.Popen, url: str, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"qwenlocal serve exited with {proc.returncode}: {proc.stderr.read()[-2000:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"qwenlocal serve was not healthy within {timeout_s:.0f} s")


def stop_server(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGINT)  # what Ctrl-C does: uvicorn shuts down gracefully
    try:
        return proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def run_serve(minutes: float, clients: int = 4, keys: int = 256, max_tokens: int = 8, every_s: float = 2.0,
              log=print) -> dict:
    import openai

    home = tempfile.mkdtemp(prefix="qwenlocal-soak-serve-")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_server(home, port, queue=clients)
    try:
        wait_healthy(proc, url)
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
        model = client.models.list().data[0].id
        t_ref = now()
        reference = [_call(client, model, k, max_tokens, False) for k in range(keys)]
        ref_s = now() - t_ref
        ref_errors = [r.error for r in reference if r.error]
        counter, lock = itertools.count(), threading.Lock()
        outcomes: list = []
        deadline = now() + minutes * 60

        def one_client() -> None:
            while now() < deadline:
                with lock:
                    i = next(counter)
                out = _call(client, model, i % keys, max_tokens, stream=i % 2 == 0)
                with lock:
                    outcomes.append((i, out))

        load_before = _loadavg()
        sampler = RssSampler(proc.pid, every_s).start()
        t0 = now()
        threads = [threading.Thread(target=one_client, daemon=True) for _ in range(clients)]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            time.sleep(min(30.0, max(0.5, deadline - now() + 0.5)))
            if any(t.is_alive() for t in threads):
                log(f"  serve: {len(outcomes)} requests, {now() - t0:.0f} s")
        wall = now() - t0
        rss = sampler.stop()
        load_after = _loadavg()
        counters = httpx.get(url + "/health", timeout=10).json().get("counters", {})
    finally:
        rc = stop_server(proc)
    errors = [o.error for _, o in outcomes if o.error]
    mismatched = [i for i, o in outcomes if not o.error and (o.text, o.finish) != (reference[i % keys].text,
                                                                                   reference[i % keys].finish)]
    lat = [o.latency_s for _, o in outcomes if not o.error]
    ttft = [o.ttft_s for _, o in outcomes if o.ttft_s is not None]
    return {"minutes": minutes, "clients": clients, "keys": keys, "max_tokens": max_tokens, "requests": len(outcomes),
            "ok": len(outcomes) - len(errors), "errors": errors[:10], "failed": len(errors),
            "mismatched": mismatched[:20], "mismatched_n": len(mismatched), "reference_errors": ref_errors[:5],
            "distinct_reference_replies": len({r.text for r in reference}),
            "reference_s": ref_s, "wall_s": wall, "req_per_s": len(outcomes) / wall if wall else 0.0,
            "latency_s": latency(lat), "stream_ttft_s": latency(ttft), "rss": rss, "server_counters": counters,
            "server_exit": rc, "loadavg_1m": (load_before, load_after)}


def _loadavg() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None
