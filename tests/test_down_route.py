"""nvfp4_experts_parts.ROUTE: the MoE down launch's routed programs find their experts from the router's logits
before the PDL wait (expert_down_parts(route=)). In Triton's interpreter on awkward sizes: the parts are the bytes
of the launch that reads route_topk's ids, on both row paths, and the ids are not read (a wrong ids tensor gives
the same bytes); under a benchmark trace the rows are the trace's; the refusals. In the sm_90 code compiled here
(no GPU): the logits are read from L2 (ld.global.cg), before griddepcontrol.wait, and every other load after it.
That the engine's step keeps its bytes through the graph with programmatic launch is the GPU tier's
(tests/test_gpu_decode_fused.py, the switches that move no byte)."""
import re

import pytest
import torch

pytest.importorskip("triton")

from qwenlocal.engine.kernels import nvfp4_experts_parts  # noqa: E402
from qwenlocal.engine.kernels.decode_router import route_topk  # noqa: E402
from qwenlocal.engine.kernels.nvfp4_experts_parts import expert_down_parts  # noqa: E402
from qwenlocal.engine.quant.nvfp4_rows import padded_rows  # noqa: E402
from sass_support import sm90_json  # noqa: E402
from test_kernels_nvfp4_experts_decode import DEVICE, _dev, _problem  # noqa: E402


def _logits(experts: int, seed: int) -> torch.Tensor:
    return torch.randn(experts + 1, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16).to(DEVICE)


@pytest.mark.parametrize("hidden, inter, experts, k, groups", [(96, 48, 33, 5, False), (160, 32, 12, 8, True)])
def test_the_programs_routing_themselves_give_the_bytes_of_route_topks_ids(hidden, inter, experts, k, groups,
                                                                         monkeypatch):
    _, _, _, rows, shared, scale, _ = _problem(hidden, inter, experts, [0] * k, 17)
    rows = padded_rows(rows, hidden, inter)  # the group path's PTX (GPU) needs 16-byte rows
    logits = _logits(experts, 4)
    weights, ids, _ = route_topk(logits, experts, k, torch.bfloat16)
    act = torch.randn(k + 1, inter, generator=torch.Generator().manual_seed(8)).to(DEVICE)
    kw = dict(extra=_dev(shared[2])[0], extra_scale=_dev(scale)[0], groups=groups)
    (rows,) = _dev(rows)
    want = expert_down_parts(act, weights, ids, rows, hidden, inter, **kw)
    monkeypatch.setattr(nvfp4_experts_parts, "ROUTE", True)
    got = expert_down_parts(act, weights, ids, rows, hidden, inter, route=(logits, experts, False), **kw)
    assert torch.isfinite(got).all() and torch.equal(got, want)
    # the ids are not read: another expert's ids give the same bytes; without the switch they move them
    wrong = (ids + 1) % experts
    assert torch.equal(expert_down_parts(act, weights, wrong, rows, hidden, inter, route=(logits, experts, False),
                                         **kw), want)
    monkeypatch.setattr(nvfp4_experts_parts, "ROUTE", False)
    assert not torch.equal(expert_down_parts(act, weights, wrong, rows, hidden, inter,
                                             route=(logits, experts, False), **kw), want)


def test_under_a_trace_the_rows_are_the_traces(monkeypatch):
    hidden, inter, experts, k = 96, 48, 20, 4
    _, weights, _, rows, shared, scale, _ = _problem(hidden, inter, experts, [0] * k, 23)
    trace = torch.tensor([[7, 3, 19, 3]], device=DEVICE)
    act = torch.randn(k + 1, inter, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    args = (act, *_dev(weights), trace, *_dev(rows), hidden, inter)
    kw = dict(extra=_dev(shared[2])[0], extra_scale=_dev(scale)[0])
    want = expert_down_parts(*args, **kw)
    monkeypatch.setattr(nvfp4_experts_parts, "ROUTE", True)
    assert torch.equal(expert_down_parts(*args, route=(_logits(experts, 6), experts, True), **kw), want)


def test_route_is_checked_before_the_launch(monkeypatch):
    hidden, inter, experts, k = 96, 48, 6, 3
    _, weights, ids, rows, _, _, _ = _problem(hidden, inter, experts, [1, 2, 3], 3)
    act = torch.randn(k + 1, inter).to(DEVICE)
    args = (act, *_dev(weights, ids, rows), hidden, inter)
    monkeypatch.setattr(nvfp4_experts_parts, "ROUTE", True)
    with pytest.raises(ValueError, match="contiguous bf16/fp16"):
        expert_down_parts(*args, route=(_logits(experts, 1).float(), experts, False))
    with pytest.raises(ValueError, match="contiguous bf16/fp16"):
        expert_down_parts(*args, route=(_logits(experts + 2, 1), experts, False))
    with pytest.raises(ValueError, match="one program a tile"):
        expert_down_parts(*args, route=(_logits(experts, 1), experts, False), programs=4)


_COMPILE = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from qwenlocal.engine.kernels import nvfp4_experts_parts as p
fn, out = p.expert_down_parts_kernel, {}
for early in (0, 1, 2):
    sig = {n: "constexpr" for n in fn.arg_names}
    for n in ("act_ptr", "parts_ptr", "extra_scale_ptr", "addend_ptr", "xd_g", "x_ptr", "norm_w_ptr",
              "new_x_out_ptr", "new_x_ptr", "norm_ptr"):
        sig[n] = "*fp32"
    sig.update(wts_ptr="*bf16", ids_ptr="*i64", words_ptr="*i32", bytes_ptr="*u8", xd_w="*i32", xd_s="*u8",
               counters_ptr="*i32", logits_ptr="*bf16", H="i32", I="i32", row_words="i32", dn_at="i32",
               dn_scale_at="i32", glob_at="i32", E="i32", eps="fp32")
    consts = dict(K_ROUTED=8, HAS_EXTRA=True, HAS_EXTRA_SCALE=True, HAS_ADDEND=False, BLOCK_M=16, BLOCK_G=32,
                  MASKED=False, DECODE="asm", X_SPLIT=True, GROUP_SCALES=True, USE_GDC=True, PERSISTENT=False,
                  NORM_TAIL=False, ROUND=0, BLOCK_H=16, FENCE=True, TILE_SUMS=False, GROUPS=False,
                  EARLY_ROUTE=early, BLOCK_E=256)
    if not early:
        sig["logits_ptr"], sig["E"] = "constexpr", "constexpr"
        consts.update(logits_ptr=None, E=0)
    k = triton.compile(ASTSource(fn, sig, consts), target=GPUTarget("cuda", 90, 32), options=dict(num_warps=2))
    out[early] = k.asm["ptx"]
print(json.dumps(out))
"""


def _loads(ptx: str) -> tuple[list, int]:
    """The PTX's global loads in order (their opcode) and the index of griddepcontrol.wait among the lines."""
    lines = [t.strip() for t in ptx.splitlines()]
    wait = next(i for i, t in enumerate(lines) if t.startswith("griddepcontrol.wait"))
    loads = [(i, re.match(r"(?:@%p\d+ )?(ld\.global[.\w]*)", t).group(1)) for i, t in enumerate(lines)
             if re.match(r"(?:@%p\d+ )?ld\.global", t)]
    return loads, wait


def test_sm90_code_reads_the_logits_from_l2_before_the_wait_and_all_else_after(tmp_path):
    out = sm90_json(_COMPILE, tmp_path)
    loads, wait = _loads(out["0"])
    assert loads and all(i > wait for i, _ in loads)  # without the switch nothing is read before the wait
    for early in ("1", "2"):
        loads, wait = _loads(out[early])
        before = [op for i, op in loads if i < wait]
        assert before and all(".cg" in op for op in before), before  # the logits (and a trace's ids), from L2
        assert all(".cg" not in op for i, op in loads if i > wait)  # the rest as before, after the wait
    assert len([1 for i, _ in _loads(out["2"])[0] if i < _loads(out["2"])[1]]) > \
        len([1 for i, _ in _loads(out["1"])[0] if i < _loads(out["1"])[1]])  # the trace's id too
