"""gemv_multi (several linears of one input in one launch) against its torch reference (dequantize with
quant.formats, F.linear in fp32, cat): awkward K and part sizes for dense / FP8 / NVFP4, bf16 and fp32 x, NaN-
poisoned outputs; every E4M3 / E2M1 code and E4M3 block scale (subnormals included) byte-exactly; splitting a
call into single-weight calls changes no byte; the launch config is a pure function of the shape."""
import dataclasses

import pytest
import torch

pytest.importorskip("triton")

from qwenlocal.engine.kernels import gemv_multi as gm  # noqa: E402
from qwenlocal.engine.kernels.gemv_multi import (  # noqa: E402
    choose_config, gemv, gemv_multi, gemv_multi_reference)
from qwenlocal.engine.quant.formats import quantize_fp8, quantize_nvfp4  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FORMATS = ("dense", "fp8", "nvfp4")


def make_part(fmt: str, n: int, k: int, gen: torch.Generator, dense_dtype=torch.bfloat16):
    w = torch.randn(n, k, generator=gen) / k ** 0.5
    w[0, :16] *= 1e-5  # tiny values: E4M3 subnormal codes (FP8) and subnormal block scales (NVFP4)
    if fmt == "dense":
        return w.to(dense_dtype).to(DEVICE)
    if fmt == "fp8":
        q, s = quantize_fp8(w)
        return {"weight": q.to(DEVICE), "weight_scale": s.to(DEVICE)}
    p, s, s2 = quantize_nvfp4(w)
    return {"weight": p.to(DEVICE), "weight_scale": s.to(DEVICE), "weight_scale_2": s2.to(DEVICE)}


def abs_bound(x: torch.Tensor, parts) -> torch.Tensor:
    """|W| @ |x| per output row: the scale of an fp32 summation-order difference."""
    xf = x.reshape(1, -1).float().abs().cpu()
    return torch.cat([xf @ gm.dequantize_part(p).abs().cpu().t() for p in parts], dim=-1)


@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("ns", [(37, 5, 5), (1,), (64, 64, 3, 3)])
@pytest.mark.parametrize("k", [48, 160, 2048 + 32])
@pytest.mark.parametrize("fmt", FORMATS)
def test_gemv_multi_matches_reference(fmt, k, ns, x_dtype, nan_empty):
    gen = torch.Generator().manual_seed(k * 100 + sum(ns))
    parts = [make_part(fmt, n, k, gen) for n in ns]
    x = (torch.randn(k, generator=gen) * 3).to(x_dtype).to(DEVICE)
    if fmt == "fp8":
        assert ((parts[0]["weight"].view(torch.uint8) & 0x78) == 0).any()  # E4M3 subnormal weight codes
    if fmt == "nvfp4":
        assert ((parts[0]["weight_scale"].view(torch.uint8) & 0x78) == 0).any()  # subnormal block scales
    # 16 rows a program: the interpreter's time goes by programs (the default for these small N is 1 row a
    # program, which the (1,) case and the other tests run)
    cfg = {} if ns == (1,) else dict(block_n=16, num_warps=4)
    y32 = gemv_multi(x, parts, out_dtype=torch.float32, **cfg)
    ref = gemv_multi_reference(x, parts, torch.float32)
    assert y32.shape == (1, sum(ns)) and y32.dtype == torch.float32
    assert torch.isfinite(y32).all()
    assert ((y32.cpu() - ref.cpu()).abs() <= 1e-5 * abs_bound(x, parts) + 1e-30).all()
    y = gemv_multi(x.reshape(1, k), parts, **cfg)  # default: stored once as x's dtype
    assert y.dtype == x_dtype and y.shape == (1, sum(ns))
    # one rounding of (nearly) the same fp32 value: at most one ulp of the output dtype from the reference's
    ulp = 2.0 ** -7 if x_dtype == torch.bfloat16 else 2.0 ** -22
    assert ((y.float().cpu() - ref.cpu()).abs() <= ulp * ref.cpu().abs() + 1e-5 * abs_bound(x, parts)).all()


@pytest.mark.parametrize("fmt", FORMATS + ("fp8-cvt",))
@pytest.mark.parametrize("config", [dict(block_k=64), dict(block_k=16, block_n=4), dict(warps_k=2, num_warps=2),
                                    dict(block_n=32, num_warps=4)])
def test_gemv_multi_any_config_matches_reference(fmt, config, nan_empty):
    """K split over blocks (160 = 2.5 blocks of 64: the masked tail), tiny blocks, 2 warps across a row."""
    gen = torch.Generator().manual_seed(7)
    if fmt == "fp8-cvt":  # the FP8 codes through the hardware conversion (float8 elements)
        fmt, config = "fp8", dict(config, fp8_cvt=True)
    parts = [make_part(fmt, n, 160, gen) for n in (37, 5)]
    x = torch.randn(160, generator=gen).to(torch.bfloat16).to(DEVICE)
    y = gemv_multi(x, parts, out_dtype=torch.float32, **config)
    ref = gemv_multi_reference(x, parts, torch.float32)
    assert torch.isfinite(y).all()
    assert ((y.cpu() - ref.cpu()).abs() <= 1e-5 * abs_bound(x, parts) + 1e-30).all()


def one_code_per_row(n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(row r's one nonzero column r * 7 % k, x: powers of two so every product is exact)."""
    cols = torch.arange(n) * 7 % k
    x = 2.0 ** (torch.arange(k) % 7 - 3.0)
    return cols, x


def every_fp8_code(k: int) -> tuple[dict, torch.Tensor]:
    """(an FP8 weight whose row r holds the r-th of the 254 non-NaN E4M3 codes in a zero row, x of powers of two)
    on DEVICE: every product exact, so a GEMV of them is byte-equal to its reference."""
    codes = torch.arange(256, dtype=torch.uint8)
    codes = codes[(codes & 127) != 127]
    cols, x = one_code_per_row(codes.numel(), k)
    w = torch.zeros(codes.numel(), k, dtype=torch.uint8)
    w[torch.arange(codes.numel()), cols] = codes
    part = {"weight": w.view(torch.float8_e4m3fn).to(DEVICE), "weight_scale": torch.tensor(0.0123).to(DEVICE)}
    return part, x.to(DEVICE)


@pytest.mark.parametrize("fp8_cvt", [False, True])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_fp8_every_code_is_exact(out_dtype, fp8_cvt, nan_empty):
    """Each row holds one E4M3 code (all 254 non-NaN codes: both signs, subnormals) in a zero row: the output is
    the dequantized weight times an x power of two, byte-equal to the reference."""
    part, xd = every_fp8_code(96)
    y = gemv_multi(xd, [part, part], out_dtype=out_dtype, block_n=32, num_warps=4, fp8_cvt=fp8_cvt)
    assert torch.equal(y.cpu(), gemv_multi_reference(xd, [part, part], out_dtype).cpu())


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_nvfp4_every_code_and_block_scale_is_exact(out_dtype, nan_empty):
    """Every E2M1 code at every nibble position of a 16-code group, under every non-NaN E4M3 block scale."""
    n, k = 16 * 16 * 2, 64
    r = torch.arange(n)
    codes = (r % 16).to(torch.uint8)
    pos = (r // 16) % 16  # position within the group: both nibbles of both int32 halves of the word
    cols = (r * 5 // 16) % 4 * 16 + pos  # groups 0..3
    bits = torch.arange(256, dtype=torch.uint8)
    bits = bits[(bits & 127) != 127]
    dense_codes = torch.zeros(n, k, dtype=torch.uint8)
    dense_codes[r, cols] = codes
    packed = dense_codes[:, 0::2] | (dense_codes[:, 1::2] << 4)
    scale = bits[(torch.arange(n * (k // 16)) * 37) % bits.numel()].reshape(n, k // 16)
    part = {"weight": packed.to(DEVICE), "weight_scale": scale.view(torch.float8_e4m3fn).to(DEVICE),
            "weight_scale_2": torch.tensor(0.37).to(DEVICE)}
    x = (2.0 ** (torch.arange(k) % 5 - 2.0)).to(DEVICE)
    used = set(scale[r, cols // 16].tolist())
    assert len(used) > 200 and any(b & 0x78 == 0 for b in used)  # nearly all scales, subnormals among them
    y = gemv_multi(x, [part], out_dtype=out_dtype, block_n=32, num_warps=4)
    assert torch.equal(y.cpu(), gemv_multi_reference(x, [part], out_dtype).cpu())


@pytest.mark.parametrize("fmt", FORMATS)
def test_splitting_a_call_changes_no_byte(fmt, nan_empty):
    """gemv_multi over [A, B] is torch.cat of gemv(A), gemv(B) under the same config, for both output dtypes."""
    gen = torch.Generator().manual_seed(11)
    a, b = make_part(fmt, 37, 160, gen), make_part(fmt, 21, 160, gen)
    x = torch.randn(1, 160, generator=gen).to(torch.bfloat16).to(DEVICE)
    for out_dtype in (torch.float32, torch.bfloat16):
        cfg = dict(block_n=8, num_warps=2)
        both = gemv_multi(x, [a, b], out_dtype=out_dtype, **cfg)
        assert torch.equal(both, torch.cat([gemv(x, a, out_dtype=out_dtype, **cfg),
                                            gemv(x, b, out_dtype=out_dtype, **cfg)], dim=-1))
        four = gemv_multi(x, [a, b, b, a], out_dtype=out_dtype, **cfg)
        assert torch.equal(four, torch.cat([both, both[:, 37:], both[:, :37]], dim=-1))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("programs", [1, 3, 7])
def test_persistent_programs_give_the_bytes_of_one_program_a_tile(fmt, programs, nan_empty):
    """Fewer programs than tiles, each taking tiles pid, pid + grid, ... (7: a grid that does not divide the 9
    tiles; 1: one program takes them all, across the parts' boundaries): every byte as one program a tile, for
    both output dtypes. The outputs start as NaN (nan_empty): a tile no turn visits fails."""
    gen = torch.Generator().manual_seed(13)
    parts = [make_part(fmt, n, 160, gen) for n in (37, 5, 21)]  # 5 + 1 + 3 tiles of 8 rows
    x = torch.randn(160, generator=gen).to(torch.bfloat16).to(DEVICE)
    cfg = dict(block_n=8, num_warps=2, block_k=64)
    for out_dtype in (torch.float32, torch.bfloat16):
        one_each = gemv_multi(x, parts, out_dtype=out_dtype, **cfg)
        turns = gemv_multi(x, parts, out_dtype=out_dtype, programs=programs, **cfg)
        assert torch.isfinite(turns).all() and torch.equal(turns, one_each)
    if DEVICE == "cuda":  # the L2 prefetch turns ahead: a hint, the same bytes
        assert torch.equal(gemv_multi(x, parts, programs=programs, l2_ahead=2, **cfg),
                           gemv_multi(x, parts, **cfg))


def test_persistent_config_is_one_wave_and_the_prefetch_is_cuda_only():
    from qwenlocal.engine.kernels.launch import resident_programs

    cfg = choose_config("fp8", 12288, 2048)
    dev = torch.device(DEVICE)
    wave = gm.persistent_config(cfg, dev)
    assert wave.programs == resident_programs(dev, 32 * cfg.num_warps, gm.REGS_PER_THREAD)
    if DEVICE == "cpu":  # the interpreter: 3 programs; no PTX, so the prefetch is refused
        assert wave.programs == 3 and wave.l2_ahead == 0
        with pytest.raises(ValueError, match="CUDA device"):
            gemv_multi(torch.randn(32), [make_part("dense", 4, 32, torch.Generator())], programs=2, l2_ahead=1)
    else:  # the device's own limits: 8 warps at 128 registers are 2 programs an SM of 64K registers
        props = torch.cuda.get_device_properties(dev)
        per_sm = min(props.max_threads_per_multi_processor // 256, props.regs_per_multiprocessor // (128 * 256))
        assert wave.programs == props.multi_processor_count * per_sm and wave.l2_ahead == gm.L2_AHEAD


def test_out_and_quantlinear_parts():
    from qwenlocal.engine.quant.linear import QuantLinear

    gen = torch.Generator().manual_seed(3)
    t = make_part("fp8", 9, 48, gen)
    ql = QuantLinear("fp8", t, torch.bfloat16, use_kernels=False)
    x = torch.randn(48, generator=gen).to(torch.bfloat16).to(DEVICE)
    out = torch.full((1, 18), float("nan"), device=DEVICE)
    y = gemv_multi(x, [ql, t], out=out)
    assert y is out and torch.equal(out[:, :9], out[:, 9:])
    assert torch.allclose(out[:, :9].cpu(), ql(x.reshape(1, 48)).float().cpu(), rtol=1e-2, atol=1e-2)


def test_bad_calls_raise_clear_errors():
    gen = torch.Generator().manual_seed(5)
    fp8, nv, dense = make_part("fp8", 4, 32, gen), make_part("nvfp4", 4, 32, gen), make_part("dense", 4, 32, gen)
    x = torch.randn(32).to(DEVICE)
    with pytest.raises(ValueError, match="one weight format"):
        gemv_multi(x, [fp8, nv])
    with pytest.raises(ValueError, match="same K"):
        gemv_multi(x, [dense, make_part("dense", 4, 48, gen)])
    with pytest.raises(ValueError, match="1 to 4"):
        gemv_multi(x, [dense] * 5)
    with pytest.raises(ValueError, match="1 to 4"):
        gemv_multi(x, [])
    with pytest.raises(ValueError, match="K = 32"):
        gemv_multi(torch.randn(16).to(DEVICE), [dense])
    with pytest.raises(ValueError, match="powers of 2"):
        gemv_multi(x, [dense], block_n=3)
    with pytest.raises(ValueError, match="one dtype"):
        gemv_multi(x, [dense, dense.float()])
    with pytest.raises(ValueError, match="out must be"):
        gemv_multi(x, [dense], out=torch.empty(1, 5, device=DEVICE))
    with pytest.raises(ValueError, match="no GEMV for format"):
        choose_config("int4", 16, 32)


# (format, rows of the parts, K): the decode step's calls at the real geometry (hidden 2048)
REAL = [("fp8", (8192, 4096), 2048), ("fp8", (8192, 512, 512), 2048), ("fp8", (2048,), 4096),
        ("dense", (256, 1), 2048), ("dense", (32, 32), 2048), ("nvfp4", (248320,), 2048),
        ("nvfp4", (512, 512), 2048), ("nvfp4", (2048,), 512)]


@pytest.mark.parametrize("fmt, ns, k", REAL)
def test_choose_config_is_a_pure_function_that_fills_the_gpu(fmt, ns, k):
    cfg = choose_config(fmt, sum(ns), k)
    assert cfg == choose_config(fmt, sum(ns), k)
    assert cfg.block_k == k  # the whole row per program (K <= 4096)
    programs = sum(-(-n // cfg.block_n) for n in ns)
    assert programs >= gm.TARGET_PROGRAMS or cfg.block_n <= 2
    assert cfg.block_n * gm.row_bytes(fmt, k) <= gm.MAX_TILE_BYTES
    assert cfg.warps_k <= cfg.num_warps <= 8
    x_limit = gm.X_PER_THREAD_FP8 if fmt == "fp8" else gm.X_PER_THREAD  # x values a thread holds
    assert k // (32 * cfg.warps_k) <= x_limit or cfg.warps_k == gm.MAX_WARPS_K
    words = k // gm.CODES_PER_WORD.get(fmt, 1)
    assert words % gm.chunk_words(fmt, cfg) == 0
    if sum(ns) * gm.row_bytes(fmt, k) >= 16 * 2**20:  # the big ones: >= ~4 programs an SM
        assert programs >= gm.TARGET_PROGRAMS


def test_choose_config_loops_over_k_only_beyond_4096():
    assert choose_config("fp8", 4096, 4096).block_k == 4096
    assert choose_config("fp8", 4096, 8192).block_k == 4096
    assert choose_config("nvfp4", 64, 48).block_k == 64


@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("fmt", FORMATS + ("fp8-cvt",))
def test_a_gemv_that_norms_its_input_is_the_gemv_of_the_normed_input(fmt, x_dtype, nan_empty):
    """norm = (tile sums, weight, eps): x a residual, normed as it is loaded with rstd from its tiles' sums of
    squares (parts_norm TILE_SUMS); against add_rms_norm then the GEMV: the same normed values where rstd's sum
    agrees (the interpreter: byte for byte here), an ulp of the normed input otherwise."""
    from qwenlocal.engine.kernels.decode_norm import add_rms_norm

    k, block = 160, 16
    gen = torch.Generator().manual_seed(41)
    parts = [make_part("fp8" if fmt == "fp8-cvt" else fmt, n, k, gen) for n in (37, 5)]
    x = (torch.randn(1, k, generator=gen) * 3).to(x_dtype).to(DEVICE)
    norm_w = (0.3 * torch.randn(k, generator=gen)).to(x_dtype).to(DEVICE)
    sums = x.float().reshape(-1, block).pow(2).sum(1)
    _, normed = add_rms_norm(x, None, norm_w, 1e-6)
    kw = dict(block_n=16, num_warps=4, fp8_cvt=fmt == "fp8-cvt")
    got = gemv_multi(x, parts, out_dtype=torch.float32, norm=(sums, norm_w, 1e-6), **kw)
    ref = gemv_multi(normed, parts, out_dtype=torch.float32, **kw)
    assert torch.isfinite(got).all()
    if DEVICE == "cpu":
        assert torch.equal(got, ref)
    else:
        ulp = 2.0 ** -7 if x_dtype == torch.bfloat16 else 2.0 ** -22
        assert ((got.cpu() - ref.cpu()).abs() <= ulp * abs_bound(normed, parts) + 1e-6).all()


def test_the_two_format_gemv_norms_both_sides_alike(nan_empty):
    from qwenlocal.engine.kernels.gemv_mixed import gemv_two_formats

    k, block = 128, 16
    gen = torch.Generator().manual_seed(43)
    a, b = [make_part("fp8", 40, k, gen)], [make_part("dense", 6, k, gen)]
    x = (torch.randn(1, k, generator=gen) * 2).to(torch.bfloat16).to(DEVICE)
    norm_w = (0.3 * torch.randn(k, generator=gen)).to(torch.bfloat16).to(DEVICE)
    sums = x.float().reshape(-1, block).pow(2).sum(1)
    norm = (sums, norm_w, 1e-6)
    got = gemv_two_formats(x, a, b, out_dtype=torch.float32, norm=norm)
    ref = torch.cat([gemv_multi(x, a, out_dtype=torch.float32, norm=norm),
                     gemv_multi(x, b, out_dtype=torch.float32, norm=norm)], dim=-1)
    if DEVICE == "cpu":
        assert torch.equal(got, ref)
    else:  # rstd's few sums laid out by each launch's warps: an ulp of the normed input at most
        torch.testing.assert_close(got, ref, rtol=2e-2, atol=1e-3)
    with pytest.raises(ValueError, match="tile sums"):
        gemv_multi(x, a, norm=(sums.double(), norm_w, 1e-6))
