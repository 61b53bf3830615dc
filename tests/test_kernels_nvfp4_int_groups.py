"""kernels/nvfp4_int_groups.py through expert_gate_up_int(groups=True): a thread's 16-code groups its own. In
Triton's interpreter: against the row path on awkward sizes (masked groups and rows, repeated ids, with and
without the shared expert; the twin and the fp32 reference are test_kernels_nvfp4_int_experts' groups cases),
the routing launch's outputs, the alignment refusal
of the PTX path, its sm_90 code compiled here (no GPU); natively (GPU tier): the PTX gives the plain path's
bytes at the real geometry."""
import pytest
import torch

pytest.importorskip("triton")

from qwenlocal.engine.kernels.decode_router import route_topk  # noqa: E402
from qwenlocal.engine.kernels.nvfp4_int_experts import expert_gate_up_int  # noqa: E402
from qwenlocal.engine.quant.nvfp4_rows import padded_rows  # noqa: E402
from sass_support import sm90_json  # noqa: E402
from test_kernels_nvfp4_experts_decode import _dev, _problem  # noqa: E402

# (H, I, E, ids, block_n): 96 -> 6 groups (2 masked of 8), 160 -> 10 (6 of 16); I 48 at 32 rows a program and
# 80 at 64: the second tile partly masked
SIZES = [(96, 48, 7, [2, 5, 2], 32), (160, 80, 6, [5, 0, 3, 3, 1], 64)]


@pytest.mark.parametrize("hidden,inter,experts,ids,block_n", SIZES)
@pytest.mark.parametrize("with_shared", [True, False])
def test_groups_match_the_row_path_and_the_shared_expert_alone(hidden, inter, experts, ids, block_n, with_shared):
    """Against the row path (rows_dot: the same integers and scales, the sums in another order on a GPU) and, for
    the shared expert, its launch alone; the twin and the fp32 reference: test_kernels_nvfp4_int_experts'
    groups cases."""
    x, _, ids_t, rows, shared, _, _ = _dev(*_problem(hidden, inter, experts, ids, 7 * hidden + inter,
                                                     torch.bfloat16))
    rows = padded_rows(rows, hidden, inter)  # the engine's containers: the PTX path (GPU) needs 16-byte rows
    extra = shared[0] + shared[1] if with_shared else None
    out = torch.full((len(ids) + with_shared, inter), float("nan"), device=rows.device)
    expert_gate_up_int(x, ids_t, rows, hidden, inter, extra, out=out, block_n=block_n, groups=True)
    rowwise = expert_gate_up_int(x, ids_t, rows, hidden, inter, extra, block_n=block_n, groups=False)
    assert torch.isfinite(out).all() and ((out - rowwise).abs().max() / rowwise.abs().max()) < 1e-6
    if with_shared:  # the shared expert's row is its own tensors' (extra), not a routed row's
        lone = expert_gate_up_int(x, ids_t[:, :0], rows, hidden, inter, extra, block_n=block_n, groups=True)
        assert torch.equal(lone[0], out[-1])


def test_groups_with_the_programs_routing_themselves_fill_route_topks_outputs():
    """route=: the routed programs find their experts from the logits (ROUTE) on the group path too: route_topk's
    weights, ids and shared gate byte for byte, and the act of those ids."""
    hidden, inter, experts, k = 96, 32, 12, 4
    x, _, _, rows, shared, _, _ = _dev(*_problem(hidden, inter, experts, [0] * k, 41, torch.bfloat16))
    rows = padded_rows(rows, hidden, inter)
    extra = shared[0] + shared[1]
    logits = torch.randn(experts + 1, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16).to(x.device)
    want = route_topk(logits, experts, k, torch.bfloat16)
    weights = torch.empty(1, k, dtype=torch.bfloat16, device=x.device)
    ids = torch.empty(1, k, dtype=torch.int64, device=x.device)
    scale = torch.empty(1, dtype=torch.float32, device=x.device)
    got = expert_gate_up_int(x, None, rows, hidden, inter, extra, block_n=32, groups=True,
                             route=(logits, experts, weights, ids, scale))
    assert torch.equal(weights, want[0]) and torch.equal(ids, want[1]) and torch.equal(scale, want[2])
    assert torch.equal(got, expert_gate_up_int(x, ids, rows, hidden, inter, extra, block_n=32, groups=True))


def test_the_ptx_path_refuses_rows_off_16_bytes_before_launching():
    hidden, inter = 96, 32
    x, _, ids_t, rows, _, _, _ = _dev(*_problem(hidden, inter, 3, [1, 2], 5))
    wide = torch.zeros(rows.shape[0], rows.shape[1] + 20, dtype=torch.uint8, device=rows.device)
    wide[:, 4:4 + rows.shape[1]] = rows
    with pytest.raises(ValueError, match="16-byte start and stride"):
        expert_gate_up_int(x, ids_t, wide[:, 4:], hidden, inter, groups=True, decode="asm")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the PTX path needs a CUDA GPU (the GPU tier)")
@pytest.mark.parametrize("route", [False, True])
def test_the_group_ptx_gives_the_plain_paths_bytes_at_the_real_geometry(route):
    hidden, inter, experts = 2048, 512, 12
    x, _, ids_t, rows, shared, _, _ = _dev(*_problem(hidden, inter, experts, [3, 7, 1, 0, 11, 5, 2, 9], 4,
                                                     torch.bfloat16))
    rows = padded_rows(rows, hidden, inter)  # the engine's containers: 16-byte rows
    extra = shared[0] + shared[1]

    def run(decode):
        if not route:
            return expert_gate_up_int(x, ids_t, rows, hidden, inter, extra, decode=decode, groups=True), ()
        logits = torch.randn(experts + 1, generator=torch.Generator().manual_seed(9)).to(x.device, torch.bfloat16)
        outs = (torch.empty(1, 8, dtype=torch.bfloat16, device=x.device),
                torch.empty(1, 8, dtype=torch.int64, device=x.device), torch.empty(1, device=x.device))
        act = expert_gate_up_int(x, None, rows, hidden, inter, extra, decode=decode, groups=True,
                                 route=(logits, experts, *outs))
        return act, outs

    (a, outs_a), (b, outs_b) = run("asm"), run("plain")
    assert torch.isfinite(a).all() and torch.equal(a, b)
    assert all(torch.equal(u, v) for u, v in zip(outs_a, outs_b))
    rowwise = expert_gate_up_int(x, outs_a[1] if route else ids_t, rows, hidden, inter, extra, groups=False)
    assert ((a - rowwise).abs().max() / rowwise.abs().max()) < 1e-6  # rows_dot's sums, in another order


_COMPILE = r"""
import json, os, re, sys
import sass_nvfp4_int_dot as s
from sass_util import sass_of
out = {}
for groups in (False, True):
    body, usage, _ = sass_of(s.compile_experts_sm90(1, 1, route=True, groups=groups),
                             os.path.join(sys.argv[1], f"g{int(groups)}"), False)
    count = lambda op: sum(1 for t in body if re.search(rf"\b{op}\b", t))
    out[str(groups)] = dict(n=len(body), reg=int(usage["REG"]), idp=count("IDP"), sts=count("STS"),
                            lds=count("LDS"), bar=count("BAR"), shfl=count("SHFL"))
print(json.dumps(out))
"""


def test_sm90_code_of_the_group_path_moves_nothing_through_shared_memory(tmp_path):
    """Compiled here for sm_90 (no GPU; scripts/sass_nvfp4_int_dot.py's launch, the programs routing themselves):
    the same integer dots (IDP count) as the row path, no shared-memory layout conversion or barrier, only the
    two rows' final sums between lanes, fewer instructions, at most 64 registers (one-warp programs, 32 an SM)."""
    out = sm90_json(_COMPILE, tmp_path)
    rows, groups = out["False"], out["True"]
    assert groups["idp"] == rows["idp"] == 64  # 2 rows x 8 words a thread x 4 dp2a
    assert groups["sts"] == groups["lds"] == groups["bar"] == 0 < rows["sts"]
    assert groups["shfl"] == 10  # 5 butterfly rounds for each of the two rows' sums
    assert groups["n"] < 0.85 * rows["n"] and groups["reg"] <= 64
