"""FlashInfer's plan() is never re-entered before its previous copy to the GPU ran (GPU only).

plan() stages its metadata in a pinned host buffer and copies it with cudaMemcpyAsync. Layer-major prefill
plans once per (layer, chunk) and, with no host sync left in the MoE, the CPU runs ahead: a 64K prompt crashed
with an illegal memory access. Here a busy kernel holds the first plan's copy back while the CPU plans the
second chunk; with the guard both chunks match SDPA; without it (the negative control, in a child process
because it may crash the CUDA context) the first chunk reads the second plan's metadata."""
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.gpu

CHECK = """
import sys, torch
from qwenlocal.engine.model.attention_backends import FlashInferAttention, SdpaAttention
guard = sys.argv[1] == "on"
hq, hkv, d, dtype, dev = 16, 2, 256, torch.bfloat16, torch.device("cuda")
fi = FlashInferAttention(hq, hkv, d, dtype, dev, max_len=4096, prefill_kv=sys.argv[2])
sd = SdpaAttention(hq, hkv, d)
fi.plan_guard = guard
fkv, skv = fi.new_kv(dtype, dev, 4096), sd.new_kv(dtype, dev, 4096)
gen = torch.Generator(device="cuda").manual_seed(0)
chunks = [(0, 1000), (1000, 37)]
data = [[torch.randn(n, h, d, device="cuda", generator=gen).to(dtype) for h in (hq, hkv, hkv)] for _, n in chunks]
for (start, n), (q, k, v) in zip(chunks, data):  # warm-up: JIT and workspaces, all synchronous
    fi.prepare(start, n, False); fi.attend(fkv, q, k, v, torch.arange(start, start + n, device="cuda"), start, False)
torch.cuda.synchronize()
outs = []
torch.cuda._sleep(400_000_000)  # the GPU is busy for ~0.2 s: the first plan's copy waits behind this
for (start, n), (q, k, v) in zip(chunks, data):
    fi.prepare(start, n, False)
    outs.append(fi.attend(fkv, q, k, v, torch.arange(start, start + n, device="cuda"), start, False))
refs = [sd.attend(skv, q, k, v, torch.arange(s, s + n, device="cuda"), s, False) for (s, n), (q, k, v) in zip(chunks, data)]
torch.cuda.synchronize()
err = max(((o.float() - r.float()).norm() / r.float().norm()).item() for o, r in zip(outs, refs))
print("ERR", err)
"""


def run(guard: str, kv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CHECK, guard, kv], capture_output=True, text=True, timeout=600)


def error_of(proc: subprocess.CompletedProcess) -> float | None:
    lines = [line for line in proc.stdout.splitlines() if line.startswith("ERR ")]
    return float(lines[-1].split()[1]) if lines and proc.returncode == 0 else None


@pytest.mark.parametrize("kv", ["ragged", "paged"])
def test_planning_waits_for_the_previous_plans_copy(kv):
    on = run("on", kv)
    assert error_of(on) is not None, on.stderr[-2000:]
    assert error_of(on) <= 2e-2


@pytest.mark.parametrize("kv", ["ragged", "paged"])
def test_without_the_guard_the_first_chunk_reads_the_second_plan(kv):
    """Negative control: the same run with the wait removed is wrong or crashes."""
    off = run("off", kv)
    err = error_of(off)
    assert err is None or err > 0.1, (err, off.stderr[-2000:])
