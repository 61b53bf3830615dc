"""The decode GEMVs with their weights streamed through shared memory in K steps (kernels/gemv_stream.py) against
gemv_multi's reference (dequantize, F.linear in fp32): dense and hardware-converted FP8 weights, awkward row
counts (masked rows), one to four parts, bf16 / fp32 x, NaN-poisoned outputs; every E4M3 code byte-exactly;
which GEMVs stream and with which steps (a pure function of format, rows and K); x normed as it is loaded; the
two-format in_proj launch; the refusals. The fused step with the switch on: tests/test_decode_fused.py.
Interpreter on the CPU, natively on a GPU."""
import pytest
import torch

pytest.importorskip("triton")

from qwenlocal.engine.kernels import gemv_multi as gm  # noqa: E402
from qwenlocal.engine.kernels import gemv_stream as gs  # noqa: E402
from qwenlocal.engine.kernels.gemv_multi import gemv_multi, gemv_multi_reference  # noqa: E402
from test_kernels_gemv_multi import abs_bound, every_fp8_code, make_part  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def small_rows(monkeypatch):
    """Streaming from a handful of rows on (the engine streams only GEMVs of >= MIN_ROWS rows)."""
    monkeypatch.setattr(gs, "MIN_ROWS", 1)


def _stream_of(fmt: str, n_total: int, k: int, elem: int):
    return gm.resolve_config(fmt, n_total, k, elem, torch.device(DEVICE), True, stream=True)


@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("fmt, ns, k", [("fp8", (37, 5), 256), ("fp8", (64, 64, 3, 3), 2048), ("fp8", (1,), 64),
                                        ("dense", (19, 2), 512), ("dense", (33,), 96)])
def test_streamed_gemv_matches_the_reference(fmt, ns, k, x_dtype, small_rows, nan_empty):
    gen = torch.Generator().manual_seed(k + sum(ns))
    parts = [make_part(fmt, n, k, gen, dense_dtype=x_dtype) for n in ns]
    x = torch.randn(1, k, generator=gen).to(x_dtype).to(DEVICE)
    elem = x.element_size() if fmt == "dense" else 2
    cfg, stream = _stream_of(fmt, sum(ns), k, elem)
    assert stream == (k % gs.step_elements(fmt, k, elem) == 0), cfg  # K = 96 (no power of two of steps) does not
    got = gemv_multi(x, parts, out_dtype=torch.float32, stream=True, fp8_cvt=True)
    ref = gemv_multi_reference(x, parts, torch.float32)
    assert got.shape == (1, sum(ns)) and torch.isfinite(got).all()
    assert ((got.cpu() - ref.cpu()).abs() <= 1e-5 * abs_bound(x, parts) + 1e-7).all()
    assert torch.equal(gemv_multi(x, parts, out_dtype=torch.float32, stream=True, fp8_cvt=True), got)  # again
    low = gemv_multi(x, parts, stream=True, fp8_cvt=True)  # stored once in x's dtype
    assert low.dtype == x_dtype and torch.equal(low, got.to(x_dtype))
    if stream and k >= 2048:  # the steps' order of sums, not the one-shot tile's: the streamed path is what ran
        assert not torch.equal(gemv_multi(x, parts, out_dtype=torch.float32, stream=False, fp8_cvt=True), got)


@pytest.mark.parametrize("config", [dict(block_k=32, num_stages=2, block_n=4, num_warps=2),
                                    dict(block_k=64, num_stages=4, block_n=32, num_warps=4),
                                    dict(block_k=128, num_stages=3, block_n=1, num_warps=1)])
def test_every_step_config_matches_the_reference(config, small_rows, nan_empty):
    gen = torch.Generator().manual_seed(7)
    parts = [make_part("fp8", n, 256, gen) for n in (45, 12)]
    x = torch.randn(1, 256, generator=gen).to(torch.bfloat16).to(DEVICE)
    got = gemv_multi(x, parts, out_dtype=torch.float32, stream=True, fp8_cvt=True, **config)
    ref = gemv_multi_reference(x, parts, torch.float32)
    assert ((got.cpu() - ref.cpu()).abs() <= 1e-5 * abs_bound(x, parts) + 1e-7).all()


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_every_fp8_code_is_exact_through_the_steps(out_dtype, small_rows, nan_empty):
    """Each row holds one E4M3 code (all 254 non-NaN codes, subnormals too) in a zero row, spread over K's
    steps: the output is the dequantized code times an x power of two, byte-equal to the reference."""
    part, xd = every_fp8_code(128)
    y = gemv_multi(xd, [part, part], out_dtype=out_dtype, stream=True, fp8_cvt=True, block_k=32, num_stages=3)
    assert torch.equal(y.cpu(), gemv_multi_reference(xd, [part, part], out_dtype).cpu())


def test_which_gemvs_stream_is_a_pure_function_of_the_shape():
    """At the real geometry: the FP8 in_proj, q+k+v and out_proj stream in 512-byte steps, one warp over 8 rows
    a program (out_proj, 2,048 rows: 4, so 512 programs), 3 stages (out_proj: 7, so that its 4 programs an SM
    keep ~48 KB copying); the router (257 dense rows), in_proj_b+a (64) and every NVFP4 GEMV do not; FP8
    without the hardware conversion (the bit path) does not; the switch off, none does."""
    cpu = torch.device("cpu")
    for n, k, rows, stages in ((12288, 2048, 8, 3), (9216, 2048, 8, 3), (2048, 4096, 4, 7)):
        cfg, stream = gm.resolve_config("fp8", n, k, 2, cpu, True, stream=True)
        assert stream and cfg.block_k == 512 and cfg.num_stages == stages and cfg.num_warps == 1
        assert cfg.block_n == rows and -(-n // rows) >= gs.TARGET_PROGRAMS
        per_sm = -(-(-(-n // rows)) // 132)
        assert per_sm * (stages - 1) * rows * 512 >= gs.IN_FLIGHT or stages == gs.STAGES
        assert gm.resolve_config("fp8", n, k, 2, cpu, True, stream=True) == (cfg, True)
        assert not gm.resolve_config("fp8", n, k, 2, cpu, False, stream=True)[1]  # the bit path
        assert not gm.resolve_config("fp8", n, k, 2, cpu, True, stream=False)[1]
    assert gs.STREAM is False and not gm.resolve_config("fp8", 12288, 2048, 2, cpu, True)[1]
    for fmt, n, k in (("dense", 257, 2048), ("dense", 64, 2048), ("nvfp4", 248320, 2048), ("nvfp4", 1024, 2048)):
        assert not gm.resolve_config(fmt, n, k, 2, cpu, True, stream=True)[1], (fmt, n, k)
    assert gm.resolve_config("dense", 4096, 2048, 2, cpu, True, stream=True)[0].block_k == 256  # 512 bytes of bf16


def test_a_streamed_gemv_that_norms_its_input_is_the_gemv_of_the_normed_input(small_rows, nan_empty):
    """norm = (tile sums, weight, eps) as in gemv_multi: x normed as each step loads it, the same values as
    add_rms_norm's stored norm, so the product equals the streamed GEMV of the normed input (the interpreter:
    byte for byte)."""
    from qwenlocal.engine.kernels.decode_norm import add_rms_norm

    k, block = 256, 16
    gen = torch.Generator().manual_seed(42)
    parts = [make_part("fp8", n, k, gen) for n in (37, 5)]
    x = (torch.randn(1, k, generator=gen) * 3).to(torch.bfloat16).to(DEVICE)
    norm_w = (0.3 * torch.randn(k, generator=gen)).to(torch.bfloat16).to(DEVICE)
    sums = x.float().reshape(-1, block).pow(2).sum(1)
    _, normed = add_rms_norm(x, None, norm_w, 1e-6)
    got = gemv_multi(x, parts, out_dtype=torch.float32, norm=(sums, norm_w, 1e-6), stream=True, fp8_cvt=True)
    ref = gemv_multi(normed, parts, out_dtype=torch.float32, stream=True, fp8_cvt=True)
    if DEVICE == "cpu":
        assert torch.equal(got, ref)
    else:
        assert ((got.cpu() - ref.cpu()).abs() <= 2.0 ** -7 * abs_bound(normed, parts) + 1e-6).all()


def test_the_in_proj_launch_streams_its_fp8_side(small_rows, nan_empty, monkeypatch):
    """gemv_two_formats with the switch on: the FP8 side (in_proj_qkv + z) the streamed gemv_multi's bytes, the
    dense side (in_proj_b + a) its one-shot bytes (the interpreter: one order of sums)."""
    from qwenlocal.engine.kernels.gemv_mixed import gemv_two_formats

    gen = torch.Generator().manual_seed(44)
    k = 256
    a, b = [make_part("fp8", 40, k, gen), make_part("fp8", 24, k, gen)], [make_part("dense", 6, k, gen)]
    x = torch.randn(1, k, generator=gen).to(torch.bfloat16).to(DEVICE)
    monkeypatch.setattr(gs, "STREAM", True)
    monkeypatch.setattr(gm, "FP8_CVT", True)
    got = gemv_two_formats(x, a, b, out_dtype=torch.float32)
    ref_a = gemv_multi(x, a, out_dtype=torch.float32)
    ref_b = gemv_multi(x, b, out_dtype=torch.float32, stream=False)
    assert torch.equal(got[:, :64], ref_a)
    if DEVICE == "cpu":
        assert torch.equal(got[:, 64:], ref_b)
    ref = gemv_multi_reference(x, a, torch.float32)
    assert ((ref_a.cpu() - ref.cpu()).abs() <= 1e-5 * abs_bound(x, a) + 1e-7).all()


def test_bad_stream_configs_are_refused(small_rows):
    gen = torch.Generator().manual_seed(2)
    part = make_part("fp8", 20, 256, gen)
    x = torch.randn(1, 256, generator=gen).to(torch.bfloat16).to(DEVICE)
    with pytest.raises(ValueError, match=">= 2 steps"):
        gemv_multi(x, [part], stream=True, fp8_cvt=True, block_k=256)  # one step: nothing to stream
    with pytest.raises(ValueError, match=">= 2 steps"):
        gemv_multi(x, [part], stream=True, fp8_cvt=True, block_k=96 * 2)  # K not in whole steps
    with pytest.raises(ValueError, match="one program a tile"):
        gemv_multi(x, [part], stream=True, fp8_cvt=True, programs=2)
