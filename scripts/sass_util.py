"""What the sm_90 SASS scripts share (scripts/sass_*.py): a compiled Triton kernel's cubin through the bundled
cuobjdump, its instructions and registers, and the optional dump of its stages. No GPU needed."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import triton

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
# The lent H200 runs this Triton (../shared/device/README.md), and its sm_90 code is not another release's: the
# FP8 in_proj tile compiles to 80 registers and 5.8 instructions a code under 3.6.0, to 165 and 11.0 under
# 3.9.0 (docs/RESULTS.md session 17). Compile with it: pip install --target /tmp/tri36 triton==3.6.0, then
# PYTHONPATH=/tmp/tri36 python scripts/sass_....py
DEVICE_TRITON = "3.6.0"
_WARNED = []


def warn_if_not_the_device_triton() -> None:
    if triton.__version__ != DEVICE_TRITON and not _WARNED:
        _WARNED.append(1)
        print(f"warning: compiling with Triton {triton.__version__}; the H200 runs {DEVICE_TRITON}, whose sm_90 code "
              f"differs (registers, instructions): PYTHONPATH=/tmp/tri36 after pip install --target /tmp/tri36 "
              f"triton=={DEVICE_TRITON}", file=sys.stderr)


def sass_of(kernel, path: str, dump: bool = False) -> tuple[list[str], dict[str, str], str]:
    """kernel (triton.compile's) -> (its SASS instructions, {"REG", "STACK"} from -res-usage, the SASS text),
    the cubin written at path + ".cubin"; dump: also its ttgir, ptx and sass beside it."""
    warn_if_not_the_device_triton()
    with open(path + ".cubin", "wb") as f:
        f.write(kernel.asm["cubin"])
    run = lambda flag: subprocess.run([os.path.join(BIN, "cuobjdump"), flag, path + ".cubin"],  # noqa: E731
                                      capture_output=True, text=True).stdout
    sass, res = run("-sass"), run("-res-usage")
    if dump:
        for ext in ("ttgir", "ptx"):
            with open(f"{path}.{ext}", "w") as f:
                f.write(kernel.asm[ext])
        with open(path + ".sass", "w") as f:
            f.write(sass)
    usage = {key: (m.group(1) if (m := re.search(rf"{key}:(\d+)", res)) else "-") for key in ("REG", "STACK")}
    # addresses grow to five hex digits past 64 KiB of code
    return re.findall(r"^\s+/\*[0-9a-f]{4,5}\*/\s+([^;]*);", sass, flags=re.M), usage, sass


def loop_instructions(sass: str, steps: int) -> int:
    """Instructions a thread runs in a kernel with one K loop of `steps` iterations (the span of its one backward
    branch): the code outside the loop once, the loop body once an iteration it runs. Triton's pipeliner keeps
    every step's arithmetic in the loop (its prologue issues only loads); where it peels steps, their FMAs
    show outside the body, and the body runs that many times fewer (counted by the FMAs' ratio). No loop, or
    one step: the straight-line count."""
    ins = [(int(a, 16), t) for a, t in re.findall(r"^\s+/\*([0-9a-f]{4,5})\*/\s+([^;]*);", sass, flags=re.M)]
    branch = r"BRA\s+(?:`\(\.L_x_\d+\)\s*)?0x([0-9a-f]+)"
    loops = [(int(m.group(1), 16), a) for a, t in ins if (m := re.search(branch, t)) and int(m.group(1), 16) < a]
    if not loops or steps <= 1:
        return len(ins)
    start, end = loops[0]
    inside = [t for a, t in ins if start <= a <= end]
    fma = lambda ts: sum(1 for t in ts if re.search(r"\b[HF]FMA", t))  # noqa: E731
    outside = fma(t for a, t in ins if not start <= a <= end)
    peeled = round(outside / fma(inside)) if fma(inside) else 0
    return len(ins) + len(inside) * max(0, steps - peeled - 1)
