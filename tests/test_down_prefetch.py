"""nvfp4_int_experts.DOWN_PREFETCH: the integer gate/up's routed programs ask L2 for their expert's down rows. The
lines of an expert's programs cover its down run (codes and scales) and nothing outside it (Triton's interpreter,
awkward sizes), and in the sm_90 code compiled here (no GPU) the switch adds the L2 prefetch and no load. That
no output byte moves is the GPU tier's (tests/test_gpu_decode_fused.py, the switches that move no byte)."""
import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from qwenlocal.engine.kernels import nvfp4_int_experts as nie  # noqa: E402
from qwenlocal.engine.kernels.nvfp4_experts_decode import _row_offsets  # noqa: E402
from qwenlocal.engine.quant.nvfp4_rows import nvfp4_expert_row_bytes  # noqa: E402
from sass_support import sm90_json  # noqa: E402


@triton.jit
def _lines_kernel(out_ptr, down_bytes, DOWN_LINES: tl.constexpr):
    t = tl.program_id(0)
    tl.store(out_ptr + t * DOWN_LINES + tl.arange(0, DOWN_LINES),
             nie.down_lines(t, tl.num_programs(0), down_bytes, DOWN_LINES))


@pytest.mark.parametrize("hidden, inter, programs", [(2048, 512, 512), (64, 48, 3), (48, 32, 7), (256, 16, 1)])
def test_the_programs_lines_cover_the_down_run_and_stay_in_it(hidden, inter, programs):
    down_bytes = hidden * inter * 9 // 16  # codes (1/2 byte each) and E4M3 scales (one per 16 codes)
    assert nie.down_run(hidden, inter)[1] == down_bytes
    lines = nie.down_prefetch_lines(down_bytes, programs)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = torch.full((programs * lines,), -1, dtype=torch.int32, device=device)
    _lines_kernel[(programs,)](out, down_bytes, DOWN_LINES=lines)
    asked = set(out.cpu().tolist())
    assert asked == set(range((down_bytes + 127) // 128))  # every line of the run, none outside it
    # the run is the row's down codes then scales, up to its globals (quant/nvfp4_rows.py's layout)
    assert nie.down_run(hidden, inter)[0] == _row_offsets(hidden, inter)["dn_at"]
    assert _row_offsets(hidden, inter)["dn_at"] * 4 + down_bytes + 8 <= nvfp4_expert_row_bytes(hidden, inter)


_COMPILE = r"""
import json, os, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import sass_nvfp4_int_dot as s
from sass_util import sass_of
from qwenlocal.engine.kernels import nvfp4_int_experts as nie
fn, out = nie.expert_gate_up_int_kernel, {}
for lines in (0, 16):
    sig = {name: s.EXPERT_TYPES.get(name, "constexpr") for name in fn.arg_names}
    for name in ("I", "row_words", "gu_scale_at", "glob_at", "dn_at", "dn_bytes"):
        sig[name] = "i32"
    sig.update(s.ROUTE_TYPES)
    consts = dict(H=2048, K_ROUTED=8, HAS_EXTRA=True, BLOCK_N=1, BLOCK_G=128, DECODE="asm", USE_GDC=True, ROUTE=1,
                  BLOCK_E=256, KP=8, F16=False, W_BF16=True, DOWN_LINES=lines)
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
             if sig[n].startswith("*") or n in ("I", "gu_scale_at")}
    k = triton.compile(ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 32), options=dict(num_warps=1))
    body, usage, _ = sass_of(k, os.path.join(sys.argv[1], f"k{lines}.cubin"), False)
    out[lines] = [sum("CCTL.E.PF2" in t for t in body), sum("LDG" in t for t in body), usage["REG"]]
print(json.dumps(out))
"""


def test_sm90_code_with_the_switch_adds_the_prefetch_and_no_load(tmp_path):
    out = sm90_json(_COMPILE, tmp_path)
    off, on = out["0"], out["16"]
    assert off[0] == 0 and on[0] >= 1  # the prefetch is there only with the switch
    assert on[1] == off[1]  # no load added
