"""Grouped prefill MoE over native NVFP4 rows against its torch reference (dequantize each used expert's row),
on awkward sizes, outputs NaN-poisoned before the run. Interpreter on the CPU, natively on a GPU."""
import pytest
import torch

pytest.importorskip("triton")

from qwenlocal.engine.kernels.nvfp4_grouped import (  # noqa: E402
    GroupedConfig, choose_config, dequant_nvfp4_rows, resolve_config, nvfp4_moe_grouped, nvfp4_moe_grouped_reference,
    random_nvfp4_rows, resolve_config, unpack_nvfp4_expert,
)
from qwenlocal.engine.kernels.nvfp4_triton import (  # noqa: E402
    nvfp4_expert_row_bytes, nvfp4_moe_decode, pack_nvfp4_expert,
)
from qwenlocal.engine.model.moe import route  # noqa: E402
from qwenlocal.engine.quant.formats import dequant_nvfp4, quantize_nvfp4  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# (tokens, experts, top_k, hidden, inter): nothing a power of two in the first, one token, many pairs per expert.
SHAPES = [(37, 5, 3, 96, 48), (1, 4, 2, 64, 32), (70, 9, 4, 128, 64)]


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


# The launch configurations: every block_m the chooser picks, on the awkward shape (runs shorter than the block,
# K tails), with the default code paths and with the strided-activation / per-byte-scale ones.
LEGACY = {"split_a": False, "group_scales": False}


@pytest.mark.parametrize("block_m", [32, 64, 128])
@pytest.mark.parametrize("variant", [{}, LEGACY], ids=["default", "legacy"])
def test_block_m_and_paths_match_reference(block_m, variant, nan_empty):
    x, w, ids, rows = make(SHAPES[0], torch.float32, seed=11)
    t, _, _, h, i = SHAPES[0]
    ref = nvfp4_moe_grouped_reference(x, w, ids, rows, h, i)
    out = nvfp4_moe_grouped(x, w, ids, rows, h, i, config=dict(block_m=block_m, **variant))
    assert out.shape == (t, h) and torch.isfinite(out).all()
    assert rel(out, ref) <= 1e-5, rel(out, ref)


def test_256_row_blocks_match_reference(nan_empty):
    """The 256-row blocks scripts/bench_nvfp4_grouped.py tries for 8,192-token chunks (256 pairs an expert), with
    the narrow tiles that compile without spills for sm_90 (gate_up 210 registers, down 143; Triton 3.6)."""
    x, w, ids, rows = make(SHAPES[0], torch.float32, seed=14)
    t, _, _, h, i = SHAPES[0]
    cfg = GroupedConfig(block_m=256, gu_block_n=32, gu_block_k=64, dn_block_n=64, dn_block_k=64)
    out = nvfp4_moe_grouped(x, w, ids, rows, h, i, config=cfg)
    assert out.shape == (t, h) and rel(out, nvfp4_moe_grouped_reference(x, w, ids, rows, h, i)) <= 1e-5


@pytest.mark.parametrize("block_m", [32, 128])
def test_block_m_bf16(block_m, nan_empty):
    x, w, ids, rows = make(SHAPES[2], torch.bfloat16, seed=12)
    _, _, _, h, i = SHAPES[2]
    out = nvfp4_moe_grouped(x, w, ids, rows, h, i, config={"block_m": block_m})
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    assert rel(out, nvfp4_moe_grouped_reference(x, w, ids, rows, h, i)) <= 2e-2


@pytest.mark.parametrize("variant", [{}, LEGACY], ids=["default", "legacy"])
def test_small_tiles_many_k_steps(variant, nan_empty):
    """Tiles smaller than the problem: several K steps (the down kernel's last one a tail) and several N blocks
    in each kernel (hidden 96, inter 48)."""
    x, w, ids, rows = make(SHAPES[0], torch.float32, seed=13)
    _, _, _, h, i = SHAPES[0]
    cfg = GroupedConfig(block_m=32, gu_block_n=16, gu_block_k=32, dn_block_n=32, dn_block_k=32, **variant)
    out = nvfp4_moe_grouped(x, w, ids, rows, h, i, config=cfg)
    assert rel(out, nvfp4_moe_grouped_reference(x, w, ids, rows, h, i)) <= 1e-5


@pytest.mark.parametrize("variant", [{}, LEGACY], ids=["default", "legacy"])
def test_every_code_and_scale_byte(variant, nan_empty):
    """Random bytes: every E2M1 code pair, E4M3 scales over the whole range (subnormals, negatives, 448)."""
    gen = torch.Generator().manual_seed(21)
    t, e, k, h, i = 9, 3, 2, 64, 32
    rows = random_nvfp4_rows(e, h, i, DEVICE, gen, scale_bits=(0, 256))
    x = (torch.randn(t, h, generator=gen) * 1e-3).to(DEVICE)  # scales up to 448: keep the SiLU unsaturated
    weights, ids = route(x.cpu(), torch.randn(e, h, generator=gen), k)
    weights, ids = weights.to(DEVICE), ids.to(DEVICE)
    out = nvfp4_moe_grouped(x, weights, ids, rows, h, i, config=dict(block_m=16, **variant))
    assert rel(out, nvfp4_moe_grouped_reference(x, weights, ids, rows, h, i)) <= 1e-5


def test_choose_config_rule():
    # Qwen3.6's geometry: 256 experts, top-8. T = 512 / 1024 / 2048 (the engine's chunk) / 16384 tokens.
    small, mid, chunk, big = (choose_config(t * 8, 256, gpu=True) for t in (512, 1024, 2048, 16384))
    assert (small.block_m, mid.block_m, chunk.block_m, big.block_m) == (32, 64, 128, 128)
    assert big.num_warps == 8 and choose_config(10 ** 7, 256, gpu=True) == big
    assert choose_config(16384 * 8, 256, gpu=False).block_m == 128
    for cfg in (small, mid, chunk, big, choose_config(10, 3, gpu=False), choose_config(0, 1, gpu=True)):
        assert cfg.validate() is cfg
    # dict overrides replace fields of the chosen config; block_m (the older keyword) wins last
    over = resolve_config(16384 * 8, 256, True, {"num_stages": 4, "dn_block_n": 64})
    assert (over.block_m, over.num_stages, over.dn_block_n, over.num_warps) == (128, 4, 64, 8)
    assert resolve_config(16384 * 8, 256, True, over, block_m=32).block_m == 32


@pytest.mark.parametrize("bad", [{"block_m": 48}, {"gu_block_k": 16}, {"dn_block_n": 8}, {"num_stages": 0}])
def test_bad_config_raises(bad):
    x, w, ids, rows = make(SHAPES[1], torch.float32)
    with pytest.raises(ValueError):
        nvfp4_moe_grouped(x, w, ids, rows, 64, 32, config=bad)


def test_dequant_rows_matches_per_expert():
    rows = make_rows(3, 96, 48, seed=4)
    gate_up, down = dequant_nvfp4_rows(rows, 96, 48, dtype=torch.float32, chunk=2)
    assert gate_up.shape == (3, 96, 96) and down.shape == (3, 96, 48)
    for e in range(3):
        gate, up, dn = (dequant_nvfp4(*q) for q in unpack_nvfp4_expert(rows[e], 96, 48))
        assert torch.equal(gate_up[e], torch.cat([gate, up])) and torch.equal(down[e], dn)


@pytest.mark.parametrize("hidden, inter", [(72, 48), (96, 40)])
def test_sizes_not_multiple_of_16_raise(hidden, inter):
    x = torch.zeros(2, hidden, device=DEVICE)
    rows = torch.zeros(3, 4096, dtype=torch.uint8, device=DEVICE)
    ids = torch.zeros(2, 1, dtype=torch.long, device=DEVICE)
    with pytest.raises(ValueError):
        nvfp4_moe_grouped(x, torch.ones(2, 1, device=DEVICE), ids, rows, hidden, inter)


def test_the_large_block_rule():
    """moe_prefill_blocks=large: 256-row blocks with the narrow spill-free tiles and one scale byte a load, from
    192 pairs an expert on a GPU (an 8,192-token chunk of top-8 over 256 experts has 256); below, and in the
    interpreter, the standard rule."""
    big = choose_config(8192 * 8, 256, gpu=True, large=True)
    assert (big.block_m, big.gu_block_n, big.gu_block_k, big.dn_block_n, big.dn_block_k) == (256, 32, 64, 64, 64)
    assert not big.group_scales and big.num_warps == 8
    assert choose_config(8192 * 8, 256, gpu=True) == choose_config(16384 * 8, 256, gpu=True)  # standard: 128 rows
    assert choose_config(191 * 256, 256, gpu=True, large=True) == choose_config(191 * 256, 256, gpu=True)
    assert choose_config(8192 * 8, 256, gpu=False, large=True) == choose_config(8192 * 8, 256, gpu=False)
    assert resolve_config(8192 * 8, 256, True, large=True) == big
