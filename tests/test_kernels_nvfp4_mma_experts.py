"""kernels/nvfp4_mma_experts.py: the experts' gate/up on the integer tensor cores against its torch twin (fp32
order) and within x's int16 blocks of expert_gate_up's fp32 reference on awkward sizes, repeated ids, with and
without the shared expert, one warp and parts of K over two and four; routing itself gives the routed ids'
bytes and route_topk's outs; router_norm's high / low bytes are quantize_hilo's; the PTX path's bytes (GPU)."""
import pytest
import torch

pytest.importorskip("triton")

from qwenlocal.engine.kernels.decode_router import route_topk  # noqa: E402
from qwenlocal.engine.kernels.nvfp4_experts_decode import expert_gate_up_reference  # noqa: E402
from qwenlocal.engine.kernels.nvfp4_hilo import quantize_hilo  # noqa: E402
from qwenlocal.engine.kernels.nvfp4_mma_experts import (expert_gate_up_mma,  # noqa: E402
                                                         expert_gate_up_mma_reference)
from qwenlocal.engine.kernels.router_norm import router_norm  # noqa: E402
from qwenlocal.engine.quant.nvfp4_rows import padded_rows  # noqa: E402
from test_kernels_nvfp4_experts_decode import _dev, _problem  # noqa: E402


def _padded(hidden, inter, experts, ids, seed, dtype=torch.float32):
    """_problem's tensors on the device with the rows at the engine's 16-byte stride (the PTX path needs it)."""
    x, w, ids_t, rows, shared, a, b = _dev(*_problem(hidden, inter, experts, ids, seed, dtype))
    return x, w, ids_t, padded_rows(rows, hidden, inter), shared, a, b

SIZES = [(128, 48, 7, [2, 5, 2]), (256, 80, 6, [5, 0, 3, 3, 1]), (512, 16, 3, [1])]  # (H, I, E, ids)


@pytest.mark.parametrize("hidden,inter,experts,ids", SIZES)
@pytest.mark.parametrize("with_shared", [True, False])
@pytest.mark.parametrize("warps", [1, 2])
def test_gate_up_mma_matches_its_twin_and_the_fp32_reference(hidden, inter, experts, ids, with_shared, warps):
    x, _, ids_t, rows, shared, _, _ = _padded(hidden, inter, experts, ids, hidden + inter, torch.bfloat16)
    extra = shared[0] + shared[1] if with_shared else None
    out = torch.full((len(ids) + with_shared, inter), float("nan"), device=rows.device)
    expert_gate_up_mma(x, ids_t, rows, hidden, inter, extra, out=out, warps=warps)
    cpu_extra = tuple(t.cpu() for t in extra) if extra else None
    twin = expert_gate_up_mma_reference(x.cpu(), ids_t.cpu(), rows.cpu(), hidden, inter, cpu_extra)
    ref = expert_gate_up_reference(x.cpu(), ids_t.cpu(), rows.cpu(), hidden, inter, cpu_extra)
    big = ref.abs().max()
    assert torch.isfinite(out).all()
    assert ((out.cpu() - twin).abs().max() / big) < 1e-5  # the fp32 sums in another order
    assert ((out.cpu() - ref).abs().max() / big) < 5e-4  # x's int16 blocks


def test_four_warps_are_the_sum_of_their_parts_in_one_order():
    x, _, ids_t, rows, shared, _, _ = _padded(256, 32, 5, [4, 1], 3, torch.bfloat16)
    one = expert_gate_up_mma(x, ids_t, rows, 256, 32, shared[0] + shared[1], warps=1)
    four = expert_gate_up_mma(x, ids_t, rows, 256, 32, shared[0] + shared[1], warps=4)
    assert ((four - one).abs().max() / one.abs().max()) < 1e-6  # the same groups, other partial sums
    with pytest.raises(ValueError, match="multiple of 64"):
        expert_gate_up_mma(x, ids_t, rows, 256, 32, warps=8)  # 32 codes a lane's quarter: not whole groups pairs


def test_routing_itself_gives_the_routed_ids_bytes_and_route_topks_outs():
    hidden, inter, experts, k = 128, 32, 9, 3
    x, _, _, rows, shared, _, _ = _padded(hidden, inter, experts, [0, 1, 2], 11, torch.bfloat16)
    logits = torch.randn(experts + 1, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16).to(x.device)
    weights, ids, shared_scale = route_topk(logits, experts, k, torch.bfloat16)
    extra = shared[0] + shared[1]
    plain = expert_gate_up_mma(x, ids, rows, hidden, inter, extra, warps=2)
    outs = (torch.empty_like(weights), torch.full_like(ids, -1), torch.empty_like(shared_scale))
    routed = expert_gate_up_mma(x, None, rows, hidden, inter, extra, warps=2, route=(logits, experts, *outs))
    assert torch.equal(routed, plain)
    assert torch.equal(outs[0], weights) and torch.equal(outs[1], ids) and torch.equal(outs[2], shared_scale)


def test_the_routers_high_and_low_bytes_are_quantize_hilos():
    h = 256
    gen = torch.Generator().manual_seed(5)
    x, delta = (torch.randn(1, h, generator=gen).to(torch.bfloat16) for _ in range(2))
    norm_w = torch.rand(h, generator=gen).to(torch.bfloat16)
    router_w = torch.randn(12, h, generator=gen).to(torch.bfloat16)
    gate_w = torch.randn(1, h, generator=gen).to(torch.bfloat16)
    x, delta, norm_w, router_w, gate_w = _dev(x, delta, norm_w, router_w, gate_w)
    _, normed, _, (hl, xs) = router_norm(x, delta, norm_w, 1e-6, router_w, gate_w, quantize="hilo")
    ref_hl, ref_xs = quantize_hilo(normed.reshape(-1))
    assert torch.equal(xs, ref_xs)
    assert int((hl.long() * 1 - ref_hl.long()).abs().max()) <= (1 if x.is_cuda else 0)  # a fused FFMA on a GPU


def test_bad_calls_are_refused():
    x, _, ids_t, rows, _, _, _ = _padded(128, 16, 4, [1, 3], 9)
    with pytest.raises(ValueError, match="xq must be"):
        expert_gate_up_mma(x, ids_t, rows, 128, 16, warps=1, xq=quantize_hilo(x.reshape(-1)[:64]))
    with pytest.raises(ValueError, match="rows must"):
        expert_gate_up_mma(x, ids_t, rows.float(), 128, 16, warps=1)
    with pytest.raises(ValueError, match="multiple of 64"):
        expert_gate_up_mma(x[..., :96], ids_t, rows, 96, 16, warps=1)
    if x.is_cuda:  # the PTX path's 16-byte rows
        unpadded = _dev(*_problem(128, 16, 4, [1, 3], 9))[3]
        with pytest.raises(ValueError, match="16-byte stride"):
            expert_gate_up_mma(x, ids_t, unpadded, 128, 16, warps=1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the PTX path needs a CUDA GPU (the GPU tier)")
@pytest.mark.parametrize("warps,pairs", [(1, False), (4, False), (4, True)])
def test_the_ptx_tiles_give_the_plain_paths_bytes_at_the_real_geometry(warps, pairs):
    x, _, ids_t, rows, shared, _, _ = _padded(2048, 512, 12, [3, 7, 1, 0, 11, 5, 2, 9], 4, torch.bfloat16)
    extra = shared[0] + shared[1]
    a = expert_gate_up_mma(x, ids_t, rows, 2048, 512, extra, warps=warps, decode="asm", pairs=pairs)
    assert torch.equal(a, expert_gate_up_mma(x, ids_t, rows, 2048, 512, extra, warps=warps, decode="plain",
                                             pairs=pairs))
    ref = expert_gate_up_reference(x.cpu(), ids_t.cpu(), rows.cpu(), 2048, 512, tuple(t.cpu() for t in extra))
    assert ((a.cpu() - ref).abs().max() / ref.abs().max()) < 5e-4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the PTX path needs a CUDA GPU (the GPU tier)")
@pytest.mark.parametrize("warps", [1, 4])
def test_every_warp_finds_its_rank_alone_as_route_topk_does(warps):
    """WARP_ROUTE (256 experts, top-8): each warp's REDUX rounds (route_keys.RANK_KEY_PTX) give route_topk's ids,
    so the plain path's bytes, and route_topk's outs from the shared expert's program; ties and negative logits
    included."""
    experts, k = 256, 8
    x, _, _, rows, shared, _, _ = _padded(2048, 512, 12, [0] * k, 6, torch.bfloat16)
    gen = torch.Generator().manual_seed(9)
    logits = torch.randn(experts + 1, generator=gen).to(torch.bfloat16)
    logits[[3, 77, 200]] = logits.max()  # a tie at the top: the lowest id first
    logits[5] = -0.0
    logits = logits.cuda()
    ids_rows = torch.randint(0, 12, (experts,), generator=gen)  # experts mapped onto the 12 rows made here
    wide = rows[ids_rows.cuda()]  # [256, row]: expert e's row
    weights, ids, shared_scale = route_topk(logits, experts, k, torch.bfloat16)
    extra = shared[0] + shared[1]
    outs = [(torch.empty_like(weights), torch.full_like(ids, -1), torch.empty_like(shared_scale)) for _ in range(2)]
    asm = expert_gate_up_mma(x, None, wide, 2048, 512, extra, warps=warps, decode="asm",
                             route=(logits, experts, *outs[0]))
    plain = expert_gate_up_mma(x, ids, wide, 2048, 512, extra, warps=warps, decode="plain")
    assert torch.equal(outs[0][1], ids) and torch.equal(outs[0][0], weights)
    assert torch.equal(asm, plain)
