"""gemv_multi asks L2 for its weight rows before the programmatic-launch wait: the line offsets cover every byte
of the program's rows (Triton's interpreter), and in the sm_90 code compiled here (Triton's bundled ptxas, no
GPU) the L2 prefetches come before the wait (ACQBULK) while every load stays after it; the same for the
tensor-core tiles (gemv_multi.FP8_MMA) in gemv_multi and gemv_mixed."""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from qwenlocal.engine.kernels import gemv_codes  # noqa: E402


@triton.jit
def _offsets_kernel(out_ptr, n, ROW_UNITS: tl.constexpr, LINE_UNITS: tl.constexpr, LINES: tl.constexpr,
                    BLOCK_N: tl.constexpr, LP: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs = gemv_codes.line_offsets(rows.to(tl.int64), rows < n, ROW_UNITS, LINE_UNITS, LINES)
    tile = tl.program_id(0) * BLOCK_N * LP + tl.arange(0, BLOCK_N)[:, None] * LP + tl.arange(0, LP)[None, :]
    tl.store(out_ptr + tile, offs)


# (what, unit bytes, K): FP8 int32 words; NVFP4 int64 words and scale bytes; bf16 rows; a row not of whole lines.
@pytest.mark.parametrize("unit, row_bytes", [(4, 2048), (8, 1024), (1, 128), (2, 4096), (4, 520), (1, 48)])
def test_line_offsets_cover_every_byte_of_the_rows(unit, row_bytes):
    n, block_n = 7, 4
    lines = (row_bytes + 127) // 128
    lp = triton.next_power_of_2(lines)
    # On a GPU the kernel runs natively (CUDA memory); elsewhere in the interpreter (conftest)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = torch.full((2 * block_n * lp,), -1, dtype=torch.int64, device=device)
    _offsets_kernel[(2,)](out, n, row_bytes // unit, 128 // unit, lines, BLOCK_N=block_n, LP=lp)
    starts = set((out * unit).cpu().tolist())
    for r in range(n):  # every 128 B line of every valid row is asked for
        assert all(r * row_bytes + b // 128 * 128 in starts for b in range(row_bytes)), r
    assert max(starts) < n * row_bytes  # nothing past the last valid row (masked rows ask for line 0)


_COMPILE = r"""
import json, os, re, subprocess, sys, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from qwenlocal.engine.kernels import gemv_multi as gm
fmt, k, n_total, tool = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
cfg = gm.choose_config(fmt, n_total, k)
types = {"w": {"dense": "*bf16", "fp8": "*i32", "nvfp4": "*i64"}[fmt],
         "s": {"dense": "*bf16", "fp8": "*fp32", "nvfp4": "*u8"}[fmt],
         "g": {"dense": "*bf16", "fp8": "*fp32", "nvfp4": "*fp32"}[fmt], "n": "i32", "p": "i32", "tiles": "i32"}
fn = gm.gemv_multi_kernel
sig = {}
for name in fn.arg_names:
    kind = name.rstrip("0123456789")
    sig[name] = {"x_ptr": "*bf16", "out_ptr": "*i16"}.get(name, types.get(kind, "constexpr"))
consts = dict(K=k, FMT=gm._FMT_ID[fmt], PARTS=1, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
              CHUNK=gm.chunk_words(fmt, cfg), OUT_BF16=True, USE_GDC=True, PREFETCH=True)
attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names) if sig[name].startswith("*")}
kernel = triton.compile(ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                        options=dict(num_warps=cfg.num_warps))
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "k.cubin")
    open(path, "wb").write(kernel.asm["cubin"])
    sass = subprocess.run([tool, "-sass", path], capture_output=True, text=True, check=True).stdout
print(json.dumps([line.split(";")[0] for line in sass.splitlines() if re.match(r"^\s+/\*[0-9a-f]{4}\*/", line)]))
"""


def _sass(fmt: str, k: int, n_total: int) -> list[str]:
    """The kernel's sm_90 SASS, compiled in a fresh process (this one runs Triton's interpreter)."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    tool = tool if os.path.exists(tool) else shutil.which("cuobjdump")
    if tool is None:
        pytest.skip("no cuobjdump in this Triton build: the sm_90 code cannot be inspected here")
    env = {key: v for key, v in os.environ.items() if key != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", _COMPILE, fmt, str(k), str(n_total), tool], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.splitlines()[-1])


@pytest.mark.parametrize("fmt, k, n_total", [("fp8", 2048, 12288), ("nvfp4", 2048, 1024), ("dense", 2048, 288)])
def test_sm90_code_prefetches_before_the_wait_and_loads_after(fmt, k, n_total):
    ins = _sass(fmt, k, n_total)
    wait = [i for i, t in enumerate(ins) if "ACQBULK" in t]
    prefetch = [i for i, t in enumerate(ins) if "CCTL.E.PF2" in t]
    loads = [i for i, t in enumerate(ins) if "LDG" in t]
    assert len(wait) == 1 and prefetch and loads
    assert max(prefetch) < wait[0] < min(loads)


_COMPILE_MMA = r"""
import json, os, re, sys
import sass_gemv_multi as s
from sass_util import sass_of
from qwenlocal.engine.kernels import gemv_multi as gm
qkv = s.compile_sm90("fp8", 3, 2048, gm.choose_config("fp8", 9216, 2048, fp8_mma=True), pdl=True, fp8_cvt=True,
                     prefetch=True)
in_proj = s.compile_mixed_sm90(gm.choose_config("fp8", 12288, 2048, fp8_mma=True),
                               gm.choose_config("dense", 64, 2048), prefetch=True)
print(json.dumps({name: sass_of(k, os.path.join(sys.argv[1], name), False)[0]
                  for name, k in (("qkv", qkv), ("in_proj", in_proj))}))
"""


def test_sm90_tensor_core_tiles_prefetch_before_the_wait_and_load_after():
    """gemv_multi.FP8_MMA's tiles with the weight prefetch (q+k+v in gemv_multi, the GDN in_proj in gemv_mixed,
    x normed as loaded): in each program's path, the L2 prefetches come before the wait (ACQBULK) and every load,
    cp.async (LDGSTS) included, after it: nothing the previous kernel writes is read early."""
    import tempfile

    from sass_support import sm90_json

    with tempfile.TemporaryDirectory() as tmp:
        out = sm90_json(_COMPILE_MMA, tmp)
    for name, ins in out.items():
        exits = [i for i, t in enumerate(ins) if re.search(r"\bEXIT\b", t)]
        paths = 0
        for start, end in zip([0] + [e + 1 for e in exits], exits):  # each path up to its EXIT
            span = range(start, end)
            wait = [i for i in span if "ACQBULK" in ins[i]]
            if not wait:
                continue
            paths += 1
            prefetch = [i for i in span if "CCTL.E.PF2" in ins[i]]
            loads = [i for i in span if re.search(r"\bLDG", ins[i])]
            assert len(wait) == 1 and prefetch and loads, name
            assert max(prefetch) < wait[0] < min(loads), name
        assert paths == (2 if name == "in_proj" else 1), name
        assert any("GMMA" in t for t in ins), name  # on the tensor cores
