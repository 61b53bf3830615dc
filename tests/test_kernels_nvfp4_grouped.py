"""Grouped prefill MoE over native NVFP4 rows against its torch reference (dequantize each used expert's row),
on awkward sizes, outputs NaN-poisoned before the run. Interpreter on the CPU, natively on a GPU."""
import pytest
import torch

pytest.importorskip("triton")

from qwenlocal.engine.kernels.nvfp4_grouped import (  # noqa: E402
    nvfp4_moe_grouped, nvfp4_moe_grouped_reference, unpack_nvfp4_expert,
)
from qwenlocal.engine.kernels.nvfp4_triton import (  # noqa: E402
    nvfp4_expert_row_bytes, nvfp4_moe_decode, pack_nvfp4_expert,
)
from qwenlocal.engine.model.moe import route  # noqa: E402
from qwenlocal.engine.quant.formats import quantize_nvfp4  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# (tokens, experts, top_k, hidden, inter): nothing a power of two in the first, one token, many pairs per expert.
SHAPES = [(37, 5, 3, 96, 48), (1, 4, 2, 64, 32), (70, 9, 4, 128, 64)]


@pytest.fixture
def nan_empty(monkeypatch):
    """Every floating torch.empty starts as NaN: a kernel that leaves an element unwritten fails."""
    real = torch.empty

    def poisoned(*args, **kwargs):
        t = real(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", poisoned)


def make_rows(experts, hidden, inter, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for e in range(experts):
        g, u = ((torch.randn(inter, hidden, generator=gen) / hidden ** 0.5).to(dtype) for _ in range(2))
        d = (torch.randn(hidden, inter, generator=gen) / inter ** 0.5).to(dtype)
        if e == 0:
            g[0, :16] *= 1e-5  # a subnormal E4M3 block scale
        rows.append(pack_nvfp4_expert(*(quantize_nvfp4(w) for w in (g, u, d))))
    return torch.stack(rows)


def make(shape, dtype, seed=0):
    t, e, k, h, i = shape
    gen = torch.Generator().manual_seed(seed + 1)
    rows = make_rows(e, h, i, seed, dtype=torch.bfloat16 if dtype == torch.bfloat16 else torch.float32)
    x = torch.randn(t, h, generator=gen)
    weights, ids = route(x, torch.randn(e, h, generator=gen) * 2, k)
    return x.to(DEVICE, dtype), weights.to(DEVICE, dtype), ids.to(DEVICE), rows.to(DEVICE)


def rel(out, ref):
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def test_unpack_inverts_pack():
    rows = make_rows(2, 96, 48, seed=5)
    assert rows.shape[1] == nvfp4_expert_row_bytes(96, 48)
    for row in rows:
        parts = unpack_nvfp4_expert(row, 96, 48)
        assert [p[0].shape for p in parts] == [(48, 48), (48, 48), (96, 24)]
        assert all(p[1].dtype == torch.float8_e4m3fn and p[2].dtype == torch.float32 for p in parts)
        assert torch.equal(pack_nvfp4_expert(*parts), row)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_matches_reference(shape, dtype, nan_empty):
    x, w, ids, rows = make(shape, dtype)
    t, _, _, h, i = shape
    ref = nvfp4_moe_grouped_reference(x, w, ids, rows, h, i)
    out = nvfp4_moe_grouped(x, w, ids, rows, h, i, block_m=16)
    assert out.dtype == dtype and out.shape == (t, h)
    assert torch.isfinite(out).all()
    assert rel(out, ref) <= (1e-5 if dtype == torch.float32 else 2e-2), rel(out, ref)


def test_deterministic_and_idle_expert(nan_empty):
    t, e, k, h, i = SHAPES[0]
    x, w, ids, _ = make(SHAPES[0], torch.float32, seed=3)
    ids = ids + (ids >= 2).long()  # shift: row 2 of e + 1 rows gets no tokens at all
    rows = make_rows(e + 1, h, i, seed=3).to(DEVICE)
    assert not (ids == 2).any()
    a = nvfp4_moe_grouped(x, w, ids, rows, h, i, block_m=16)
    b = nvfp4_moe_grouped(x, w, ids, rows, h, i, block_m=16)
    assert torch.isfinite(a).all()
    assert torch.equal(a, b)
    assert rel(a, nvfp4_moe_grouped_reference(x, w, ids, rows, h, i)) <= 1e-5


def test_decode_consistency(nan_empty):
    x, w, ids, rows = make((1, 7, 3, 96, 48), torch.float32, seed=7)
    grouped = nvfp4_moe_grouped(x, w, ids, rows, 96, 48)
    decode = nvfp4_moe_decode(x, w, ids, rows, 96, 48)
    assert torch.allclose(grouped, decode, rtol=1e-4, atol=1e-4 * decode.abs().max().item())


@pytest.mark.parametrize("hidden, inter", [(72, 48), (96, 40)])
def test_sizes_not_multiple_of_16_raise(hidden, inter):
    x = torch.zeros(2, hidden, device=DEVICE)
    rows = torch.zeros(3, 4096, dtype=torch.uint8, device=DEVICE)
    ids = torch.zeros(2, 1, dtype=torch.long, device=DEVICE)
    with pytest.raises(ValueError):
        nvfp4_moe_grouped(x, torch.ones(2, 1, device=DEVICE), ids, rows, hidden, inter)
