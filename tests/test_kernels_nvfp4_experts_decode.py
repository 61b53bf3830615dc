"""Batch-1 NVFP4 expert kernels (expert_gate_up, expert_down, nvfp4_moe_decode_fused) against their torch
references on awkward sizes, repeated ids, bf16/fp32 x, subnormal and every-byte E4M3 scales, NaN-poisoned
outputs; byte-equality of resident vs slot rows; and the model's unfused torch path."""
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from qwenlocal.engine.kernels.nvfp4_experts_decode import (  # noqa: E402
    expert_down, expert_down_reference, expert_gate_up, expert_gate_up_reference, nvfp4_moe_decode_fused,
    nvfp4_moe_decode_fused_reference,
)
from qwenlocal.engine.kernels.nvfp4_grouped import random_nvfp4_rows  # noqa: E402
from qwenlocal.engine.quant.formats import dequant_nvfp4, quantize_nvfp4  # noqa: E402
from qwenlocal.engine.quant.nvfp4_rows import pack_nvfp4_expert  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _quantized(out_f, in_f, gen, tiny_block=True):
    w = torch.randn(out_f, in_f, generator=gen) / in_f ** 0.5
    if tiny_block:
        w[0, :16] *= 1e-5  # an E4M3 subnormal block scale
    return quantize_nvfp4(w)


def _problem(hidden, inter, experts, ids, seed, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    rows = torch.stack([pack_nvfp4_expert(*(_quantized(*s, gen) for s in ((inter, hidden), (inter, hidden),
                                                                         (hidden, inter))))
                        for _ in range(experts)])
    shared = tuple(_quantized(*s, gen) for s in ((inter, hidden), (inter, hidden), (hidden, inter)))
    x = torch.randn(1, hidden, generator=gen).to(dtype)
    weights = torch.softmax(torch.randn(1, len(ids), generator=gen), dim=-1).to(dtype)
    scale = torch.sigmoid(torch.randn(1, generator=gen))
    addend = torch.randn(1, hidden, generator=gen).to(dtype)
    return x, weights, torch.tensor([ids]), rows, shared, scale, addend


def _to_dev(t):
    return t.to(DEVICE) if isinstance(t, torch.Tensor) else tuple(_to_dev(u) for u in t)


def _dev(*ts):
    return [_to_dev(t) for t in ts]


def _close(out, ref, rel=1e-5):
    out, ref = out.cpu().float(), ref.cpu().float()  # the GPU test passes a reference made on the GPU
    assert torch.isfinite(out).all()
    assert torch.allclose(out, ref, rtol=rel, atol=rel * ref.abs().max().item()), (out - ref).abs().max()


SIZES = [(96, 48, 7, [2, 5, 2]), (160, 80, 6, [5, 0, 3, 3, 1])]  # (H, I, E, ids with repeats)
# Masked row tiles, K in several steps, both scale paths, both activation loads, the exact decode (the
# interpreter is slow: few, wide programs; the defaults run in the fused and byte-equality tests).
CONFIGS = [dict(block_n=16), dict(block_n=32, block_g=4, x_split=False, group_scales=True),
           dict(decode="exact", block_n=64, block_g=4)]


@pytest.mark.parametrize("hidden, inter, experts, ids", SIZES)
@pytest.mark.parametrize("with_extra, dtype", [(False, torch.bfloat16), (True, torch.float32)])
def test_gate_up_matches_reference(hidden, inter, experts, ids, with_extra, dtype, nan_empty):
    x, _, ids_t, rows, shared, _, _ = _problem(hidden, inter, experts, ids, hidden + with_extra, dtype)
    extra = shared[0] + shared[1] if with_extra else None
    ref = expert_gate_up_reference(x, ids_t, rows, hidden, inter, extra)
    assert ref.shape == (len(ids) + with_extra, inter)
    for cfg in CONFIGS:
        out = expert_gate_up(*_dev(x, ids_t, rows), hidden, inter, _to_dev(extra) if extra else None, **cfg)
        assert out.dtype == torch.float32 and out.shape == ref.shape
        _close(out, ref)


@pytest.mark.parametrize("programs", [1, 4])
@pytest.mark.parametrize("with_extra, k_routed", [(True, 3), (False, 3), (True, 0)])
def test_gate_up_persistent_programs_give_the_bytes_of_one_program_a_tile(programs, with_extra, k_routed,
                                                                         nan_empty):
    """Fewer programs than (expert, row block) tiles, each taking tiles in turn with x loaded once (4: a grid
    that does not divide the tiles; 1: one program takes every expert's blocks), the shared expert included and
    alone (no routed ids, the overlap split's launch): every byte as one program a tile. NaN-poisoned output:
    a tile no turn visits fails."""
    hidden, inter = 96, 48
    x, _, ids_t, rows, shared, _, _ = _problem(hidden, inter, 7, [2, 5, 2][:k_routed], 17, torch.bfloat16)
    ids_t = ids_t.reshape(1, k_routed)
    extra = _to_dev(shared[0] + shared[1]) if with_extra else None
    args = (*_dev(x, ids_t, rows), hidden, inter, extra)
    for cfg in (dict(block_n=16), dict(block_n=16, x_split=False, group_scales=True)):  # 3 blocks an expert
        one_each = expert_gate_up(*args, **cfg)
        turns = expert_gate_up(*args, programs=programs, **cfg)
        assert torch.isfinite(turns).all() and torch.equal(turns, one_each)
    with pytest.raises(ValueError, match="one K step"):
        expert_gate_up(*args, block_n=16, block_g=2, programs=2)


@pytest.mark.parametrize("hidden, inter, experts, ids", SIZES)
@pytest.mark.parametrize("with_extra, with_scale, with_addend", [(False, False, False), (True, True, False),
                                                                 (True, False, True), (False, False, True)])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_down_matches_reference(hidden, inter, experts, ids, with_extra, with_scale, with_addend, out_dtype,
                                nan_empty):
    _, weights, ids_t, rows, shared, scale, addend = _problem(hidden, inter, experts, ids, inter + with_addend)
    n = len(ids) + with_extra
    act = torch.randn(n, inter, generator=torch.Generator().manual_seed(9))
    kw = dict(extra=shared[2] if with_extra else None, extra_scale=scale if with_scale else None,
              addend=addend if with_addend else None, out_dtype=out_dtype)
    ref = expert_down_reference(act, weights, ids_t, rows, hidden, inter, **kw)
    dev_kw = {k: (_dev(v)[0] if v is not None and not isinstance(v, torch.dtype) else v) for k, v in kw.items()}
    for cfg in [dict(block_m=32, block_g=2, x_split=True), dict(block_m=64, decode="exact", group_scales=False)]:
        out = expert_down(*_dev(act, weights, ids_t, rows), hidden, inter, **dev_kw, **cfg,
                          out=torch.empty(1, hidden, dtype=out_dtype, device=DEVICE))
        assert out.dtype == out_dtype and out.shape == (1, hidden)
        if out_dtype == torch.float32:
            _close(out, ref)
        else:  # one bf16 rounding of a (slightly differently summed) fp32 value: within 1 ulp
            exact = expert_down_reference(act, weights, ids_t, rows, hidden, inter,
                                          **{**kw, "out_dtype": torch.float32})
            diff = (out.cpu().float() - exact[0]).abs()
            assert torch.isfinite(out.cpu().float()).all() and (diff <= exact[0].abs() * 2 ** -8 + 1e-30).all()


def test_every_code_and_scale_byte(nan_empty):
    """Rows of uniform random bytes (every E2M1 code; E4M3 scale bytes 0..255 less NaN, subnormals included):
    the fp16-pair decode, the exact decode and the reference agree."""
    hidden, inter = 64, 32
    gen = torch.Generator().manual_seed(4)
    rows = random_nvfp4_rows(5, hidden, inter, generator=gen, scale_bits=(0, 256))
    scale_bytes = rows[:, inter * hidden:inter * hidden * 9 // 8]
    assert ((scale_bytes & 0x78) == 0).any() and (scale_bytes & 0x80).any()  # subnormal and negative scales
    ids = torch.tensor([[4, 1, 1, 0]])
    x = torch.randn(1, hidden, generator=gen)
    ref = expert_gate_up_reference(x, ids, rows, hidden, inter)
    decodes = ("asm", "fp16", "exact") if DEVICE == "cuda" else ("fp16", "exact")  # no inline PTX on the CPU
    fast, *others = (expert_gate_up(*_dev(x, ids, rows), hidden, inter, decode=d) for d in decodes)
    _close(fast, ref)
    for other in others:  # every decode gives the checkpoint's exact values, so the same bytes
        assert torch.equal(fast, other)
    weights = torch.rand(1, 4, generator=gen)
    _close(expert_down(*_dev(ref, weights, ids, rows), hidden, inter),
           expert_down_reference(ref, weights, ids, rows, hidden, inter))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_matches_its_reference_and_the_model_path(dtype, nan_empty):
    hidden, inter = 96, 48
    x, weights, ids, rows, shared, scale, _ = _problem(hidden, inter, 7, [6, 2, 2, 0], 11, dtype)
    out = nvfp4_moe_decode_fused(*_dev(x, weights, ids, rows), hidden, inter, *_dev(shared, scale))
    assert out.dtype == dtype and out.shape == (1, hidden)
    ref = nvfp4_moe_decode_fused_reference(x, weights, ids, rows, hidden, inter, shared, scale)
    _close(out, ref, 1e-5 if dtype == torch.float32 else 2 ** -7)
    # The model's unfused torch path: routed decode reference + sigmoid-gated SwiGLU shared expert.
    from qwenlocal.engine.model.moe import nvfp4_experts_decode_reference

    xf = x.float()
    model = nvfp4_experts_decode_reference(xf, weights.float(), ids, rows, hidden, inter)
    g, u, d = (dequant_nvfp4(*t) for t in shared)
    model = model + scale * F.linear(F.silu(F.linear(xf, g)) * F.linear(xf, u), d)
    _close(out, model, 1e-5 if dtype == torch.float32 else 2 ** -7)
    from qwenlocal.engine.kernels.nvfp4_experts_decode import nvfp4_triples
    from qwenlocal.engine.quant.linear import QuantLinear
    from qwenlocal.engine.quant.scheme import NVFP4

    linears = [QuantLinear(NVFP4, dict(zip(("weight", "weight_scale", "weight_scale_2"), _dev(*t))), dtype, False)
               for t in shared]
    assert torch.equal(nvfp4_moe_decode_fused(*_dev(x, weights, ids, rows), hidden, inter, nvfp4_triples(*linears),
                                              _dev(scale)[0]), out)
    routed_only = nvfp4_moe_decode_fused(*_dev(x, weights, ids, rows), hidden, inter)
    _close(routed_only, nvfp4_moe_decode_fused_reference(x, weights, ids, rows, hidden, inter),
           1e-5 if dtype == torch.float32 else 2 ** -7)


def slot_copy(bank: torch.Tensor, ids: torch.Tensor, extra: int = 20) -> tuple[torch.Tensor, torch.Tensor]:
    """(slots, slot ids): ids' experts (3, 6, 1) copied to permuted slots of another tensor whose rows are
    `extra` bytes wider (another stride; the extra bytes 0xFF, which a kernel that read them would show)."""
    slot_of = {3: 4, 6: 0, 1: 2}
    slots = torch.zeros(5, bank.shape[1] + extra, dtype=torch.uint8)
    slots[:, bank.shape[1]:] = 0xFF
    for e, s in slot_of.items():
        slots[s, :bank.shape[1]] = bank[e]
    return slots, torch.tensor([[slot_of[e] for e in ids[0].tolist()]])


def test_resident_and_slot_rows_give_identical_bytes(nan_empty):
    """The same experts read from the bank by expert id, or from a slot cache (a different tensor, a padded
    row stride, permuted slots) by slot id: act and output byte-equal."""
    hidden, inter = 96, 48
    x, weights, ids, bank, shared, scale, addend = _problem(hidden, inter, 7, [3, 6, 3, 1], 5, torch.bfloat16)
    slots, slot_ids = slot_copy(bank, ids)
    results = []
    for rows, which in ((bank, ids), (slots, slot_ids)):
        rows_d, ids_d, x_d, w_d = _dev(rows, which, x, weights)
        act = expert_gate_up(x_d, ids_d, rows_d, hidden, inter, _dev(shared[0] + shared[1])[0])
        out = expert_down(act, w_d, ids_d, rows_d, hidden, inter, _dev(shared[2])[0], *_dev(scale, addend))
        results.append((act, out, nvfp4_moe_decode_fused(x_d, w_d, ids_d, rows_d, hidden, inter,
                                                         _dev(shared)[0], _dev(scale)[0])))
    for a, b in zip(*results):
        assert torch.isfinite(a.float()).all() and torch.equal(a, b)


def test_rows_that_are_not_word_aligned_are_refused():
    rows = torch.zeros(3, 4 * 96 * 48, dtype=torch.uint8)
    with pytest.raises(ValueError, match="uint8"):
        expert_gate_up(torch.zeros(1, 96), torch.zeros(1, 2, dtype=torch.long), rows[:, :100], 96, 48)
    with pytest.raises(ValueError, match="4-byte"):
        expert_gate_up(torch.zeros(1, 96), torch.zeros(1, 2, dtype=torch.long), rows[:, 1:], 96, 48)


@pytest.mark.gpu
def test_gpu_real_shape_graph_replay_slots_and_no_sync():
    """At the real shape on the GPU: no host sync, CUDA-graph replay byte-equal to eager, a slot cache with
    another row stride (16-byte padded rows, permuted slots) byte-equal to the bank, close to the reference."""
    h, i, e, k = 2048, 512, 16, 8
    gen = torch.Generator(device="cuda").manual_seed(0)
    bank = random_nvfp4_rows(e, h, i, "cuda", gen)
    shared = tuple(quantize_nvfp4(torch.randn(*s, device="cuda", generator=gen) / s[1] ** 0.5)
                   for s in ((i, h), (i, h), (h, i)))
    x = torch.randn(1, h, device="cuda", generator=gen).to(torch.bfloat16)
    ids = torch.randperm(e, device="cuda", generator=gen)[:k][None]
    w = torch.softmax(torch.randn(1, k, device="cuda", generator=gen), -1).to(torch.bfloat16)
    scale = torch.sigmoid(torch.randn(1, device="cuda", generator=gen))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        eager = nvfp4_moe_decode_fused(x, w, ids, bank, h, i, shared, scale)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    ref = nvfp4_moe_decode_fused_reference(x, w, ids, bank, h, i, shared, scale)
    _close(eager, ref, 2 ** -7)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = nvfp4_moe_decode_fused(x, w, ids, bank, h, i, shared, scale)
    graph.replay()
    assert torch.equal(replayed, eager)
    perm = torch.randperm(e, device="cuda", generator=gen)  # slot s holds expert perm[s]
    slots = torch.zeros(e, bank.shape[1] + 4, dtype=torch.uint8, device="cuda")
    slots[:, :bank.shape[1]] = bank[perm]
    slot_of = torch.argsort(perm)
    assert torch.equal(nvfp4_moe_decode_fused(x, w, slot_of[ids], slots, h, i, shared, scale), eager)
