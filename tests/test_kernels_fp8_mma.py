"""kernels/fp8_mma.py and gemv_multi.FP8_MMA: FP8 GEMV tiles on the tensor cores, x split into three E4M3 terms.
In Triton's interpreter (natively on a GPU): the split against its torch reference (exact terms, a bf16 x held
exactly), the tile against fp8_mma_reference and the dequantized fp32 GEMV on awkward sizes (masked rows, a K
that is no multiple of the K step, parts across tiles, x normed as it is loaded), gemv_mixed's FP8 side
byte for byte gemv_multi's, choose_config's choice; the sm_90 code compiled here (no GPU)."""
import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from qwenlocal.engine.kernels import fp8_mma, gemv_mixed  # noqa: E402
from qwenlocal.engine.kernels import gemv_multi as gm  # noqa: E402
from test_decode_fused import quantized_ckpt  # noqa: E402,F401 (the fixture, by name)
from sass_support import sm90_json  # noqa: E402
from test_kernels_gemv_multi import DEVICE, abs_bound, make_part  # noqa: E402


@triton.jit
def _split_kernel(x_ptr, out_ptr, K: tl.constexpr):
    x = tl.load(x_ptr + tl.arange(0, K))
    s, inv = fp8_mma.pow2_scale(tl.max(tl.abs(x), axis=0))
    hi, mid, lo = fp8_mma.split_e4m3(x * inv)
    k = tl.arange(0, K)
    tl.store(out_ptr + k, hi.to(tl.float32) * s)
    tl.store(out_ptr + K + k, mid.to(tl.float32) * s)
    tl.store(out_ptr + 2 * K + k, lo.to(tl.float32) * s)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_split_is_its_references_and_holds_x(dtype):
    """Values spread over 2^-40..2^12, zeros, both signs; each term exactly E4M3 (times s), the three terms the
    torch reference's; a bf16 x exact in hi + mid / 16 down to 2^-13 of its largest value, any x within 2^-12 of
    its largest value."""
    gen = torch.Generator().manual_seed(5)
    k = 256
    x = torch.randn(k, generator=gen) * torch.exp2(torch.randint(-40, 12, (k,), generator=gen).float())
    x[:4] = torch.tensor([0.0, -0.0, 255.99, -7.93])  # a round-up across a binade: Triton's interpreter's pitfall
    x = x.to(dtype)
    out = torch.empty(3 * k, device=DEVICE)
    _split_kernel[(1,)](x.to(DEVICE), out, K=k)
    terms = out.cpu().double().reshape(3, k)
    s, ref = fp8_mma.split_reference(x)
    assert torch.equal(terms, ref * s)  # the kernel stores each term times s
    for t in ref:
        assert torch.equal(t.float().to(torch.float8_e4m3fn).double(), t)  # each term on E4M3's grid
    rebuilt = terms[0] + terms[1] / 16 + terms[2] / 256
    if dtype == torch.bfloat16:  # exact down to E4M3's 2^-6 after the scale (2^-13 of the largest |x| or less)
        big = x.double().abs() >= 2.0 ** -6 * s
        assert big.sum() > k // 5 and torch.equal((terms[0] + terms[1] / 16)[big], x.double()[big])
    assert (rebuilt - x.double()).abs().max() <= 2.0 ** -12 * x.double().abs().max()


@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("ns, k", [((100, 30), 96), ((64,), 2048), ((37, 5, 70), 160)])
def test_the_tensor_core_tiles_match_the_references(ns, k, x_dtype, monkeypatch, nan_empty):
    monkeypatch.setattr(gm, "FP8_MMA", True)
    monkeypatch.setattr(gm, "MMA_MIN_TILES", 1)
    gen = torch.Generator().manual_seed(k + sum(ns))
    parts = [make_part("fp8", n, k, gen) for n in ns]
    x = (torch.randn(1, k, generator=gen) * 2).to(x_dtype).to(DEVICE)
    cfg = gm.launch_config("fp8", sum(ns), k, 2, x.device)
    assert cfg.mma and cfg.block_n == gm.MMA_BLOCK_N
    got = gm.gemv_multi(x, parts, out_dtype=torch.float32)
    assert torch.isfinite(got).all()
    mma = torch.cat([fp8_mma.fp8_mma_reference(p["weight"].cpu().view(torch.uint8), x.cpu())
                     * p["weight_scale"].double().cpu() for p in parts])
    bound = abs_bound(x, parts).double().reshape(-1)
    # the sums' rounding: fp32 in the interpreter; on a GPU the tensor cores' ~14-bit FP8 accumulation too
    tol = 2e-5 if DEVICE == "cpu" else 4 * 2.0 ** -14
    assert ((got.cpu().double().reshape(-1) - mma).abs() <= tol * bound + 1e-7).all()
    ref = gm.gemv_multi_reference(x, parts, out_dtype=torch.float32)  # dequantized, fp32 F.linear
    assert ((got.cpu() - ref.cpu()).abs().reshape(-1).double() <= (tol + 1e-4) * bound + 1e-6).all()
    monkeypatch.setattr(gm, "FP8_MMA", False)
    cores = gm.gemv_multi(x, parts, out_dtype=torch.float32)  # the CUDA-core tile, for the step's other arm
    assert ((got.cpu() - cores.cpu()).abs().reshape(-1).double() <= (tol + 1e-4) * bound + 1e-6).all()


@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32])
def test_the_split_scaled_a_k_step_matches_its_reference(x_dtype, monkeypatch, nan_empty):
    """gemv_multi.MMA_STEP_SCALE (fp8_mma_rows' STEP_SCALE): each K step's x split with its own scale, here K 160
    in steps of 64 (the last one masked), x's magnitude different in each step: the tile against
    fp8_mma_reference(block_k=64) and the dequantized fp32 GEMV, norm= included."""
    monkeypatch.setattr(gm, "FP8_MMA", True)
    monkeypatch.setattr(gm, "MMA_MIN_TILES", 1)
    monkeypatch.setattr(gm, "MMA_BLOCK_K", 64)
    monkeypatch.setattr(gm, "MMA_STEP_SCALE", True)
    k = 160
    gen = torch.Generator().manual_seed(7)
    parts = [make_part("fp8", n, k, gen) for n in (37, 5, 70)]
    parts[0]["weight"].view(torch.uint8)[:, 64:] = 0  # its rows see the first step only: x's smallest values
    x = torch.randn(1, k, generator=gen) * torch.tensor([1e-5] * 64 + [3.0] * 64 + [2000.0] * 32)
    x = x.to(x_dtype).to(DEVICE)
    assert gm.launch_config("fp8", 112, k, 2, x.device).mma == 2
    got = gm.gemv_multi(x, parts, out_dtype=torch.float32)
    assert torch.isfinite(got).all()
    want = torch.cat([fp8_mma.fp8_mma_reference(p["weight"].cpu().view(torch.uint8), x.cpu(), block_k=64)
                      * p["weight_scale"].double().cpu() for p in parts])
    bound = abs_bound(x, parts).double().reshape(-1)
    tol = 2e-5 if DEVICE == "cpu" else 4 * 2.0 ** -14
    assert ((got.cpu().double().reshape(-1) - want).abs() <= tol * bound + 1e-7).all()
    ref = gm.gemv_multi_reference(x, parts, out_dtype=torch.float32)
    assert ((got.cpu() - ref.cpu()).abs().reshape(-1).double() <= (tol + 1e-4) * bound + 1e-6).all()
    # one scale for all of x (2^4 here) would put the first step's values under E4M3's least term: part 0's rows
    # would be lost; its own step's scale keeps them (the negative control: the one-scale reference is far off)
    whole = torch.cat([fp8_mma.fp8_mma_reference(p["weight"].cpu().view(torch.uint8), x.cpu())
                       * p["weight_scale"].double().cpu() for p in parts])
    first = slice(0, 37)
    assert ((got.cpu().double().reshape(-1) - whole).abs()[first] > 0.5 * bound[first]).any()
    norm_w = (0.3 * torch.randn(k, generator=gen)).to(x_dtype).to(DEVICE)
    sums = x.float().reshape(-1, 16).pow(2).sum(1)
    from qwenlocal.engine.kernels.decode_norm import add_rms_norm
    _, normed = add_rms_norm(x, None, norm_w, 1e-6)
    normed_in = gm.gemv_multi(x, parts, out_dtype=torch.float32, norm=(sums, norm_w, 1e-6))
    plain = gm.gemv_multi(normed, parts, out_dtype=torch.float32)
    nbound = abs_bound(normed, parts).reshape(-1)
    assert ((normed_in.cpu() - plain.cpu()).abs().reshape(-1) <= 2.0 ** -7 * nbound + 1e-6).all()


def test_normed_input_and_the_two_format_launch(monkeypatch, nan_empty):
    """x a residual normed as it is loaded (norm=): the tile of the normed input; gemv_mixed's FP8 side on the
    tensor cores is gemv_multi's byte for byte, its dense side unchanged."""
    from qwenlocal.engine.kernels.decode_norm import add_rms_norm

    monkeypatch.setattr(gm, "FP8_MMA", True)
    monkeypatch.setattr(gm, "MMA_MIN_TILES", 1)
    k, block = 160, 16
    gen = torch.Generator().manual_seed(44)
    a, b = [make_part("fp8", n, k, gen) for n in (70, 6)], [make_part("dense", 6, k, gen)]
    x = (torch.randn(1, k, generator=gen) * 3).to(torch.bfloat16).to(DEVICE)
    norm_w = (0.3 * torch.randn(k, generator=gen)).to(torch.bfloat16).to(DEVICE)
    sums = x.float().reshape(-1, block).pow(2).sum(1)
    _, normed = add_rms_norm(x, None, norm_w, 1e-6)
    got = gm.gemv_multi(x, a, out_dtype=torch.float32, norm=(sums, norm_w, 1e-6))
    plain = gm.gemv_multi(normed, a, out_dtype=torch.float32)
    bound = abs_bound(normed, a).reshape(-1)
    assert ((got.cpu() - plain.cpu()).abs().reshape(-1) <= 2.0 ** -7 * bound + 1e-6).all()  # an ulp of the input,
    # or on a GPU the tensor cores' adds (each launch its own order: far under that)
    if DEVICE == "cpu":
        assert torch.equal(got, plain)  # the interpreter: rstd in one order, the same normed values
    mixed = gemv_mixed.gemv_two_formats(x, a, b, out_dtype=torch.float32, norm=(sums, norm_w, 1e-6))
    assert torch.equal(mixed[:, :76], got)
    monkeypatch.setattr(gm, "FP8_MMA", False)
    dense = gm.gemv_multi(x, b, out_dtype=torch.float32, norm=(sums, norm_w, 1e-6))
    if DEVICE == "cpu":
        assert torch.equal(mixed[:, 76:], dense)


def test_choose_config_takes_the_tensor_cores_only_where_there_are_tiles_enough():
    """The real geometry: GDN in_proj (12,288 FP8 rows) and q+k+v (9,216) on the tensor cores, out_proj /
    o_proj (2,048 rows of K 4,096: 32 tiles) and every other format on the CUDA cores; off without fp8_mma."""
    assert gm.choose_config("fp8", 12288, 2048, fp8_mma=True) == gm.GemvConfig(64, 256, 4, num_stages=4, mma=True)
    assert gm.choose_config("fp8", 9216, 2048, fp8_mma=True).mma
    assert not gm.choose_config("fp8", 2048, 4096, fp8_mma=True).mma
    assert not gm.choose_config("nvfp4", 248320, 2048, fp8_mma=True).mma
    assert gm.choose_config("fp8", 12288, 2048) == gm.choose_config("fp8", 12288, 2048, fp8_mma=False)
    assert gm.choose_config("fp8", 12288, 16, fp8_mma=True).block_k == 32  # the FP8 MMA's K
    assert gm.choose_config("fp8", 12288, 2048, fp8_mma=True, step_scale=True).mma == 2  # x's split a K step
    assert not gm.choose_config("fp8", 2048, 4096, fp8_mma=True, step_scale=True).mma


_COMPILE = r"""
import json, os, re, sys
import sass_gemv_multi as s
from sass_util import loop_instructions, sass_of
from qwenlocal.engine.kernels import gemv_multi as gm
out = {}
for mma in (False, True):
    cfg = gm.choose_config("fp8", 12288, 2048, fp8_mma=mma)
    kernel = s.compile_sm90("fp8", 2, 2048, cfg, pdl=True, fp8_cvt=True, norm=True)
    body, usage, sass = sass_of(kernel, os.path.join(sys.argv[1], f"m{int(mma)}"), False)
    codes = cfg.block_n * 2048 / (32 * cfg.num_warps)
    out[str(mma)] = dict(per_code=loop_instructions(sass, 2048 // cfg.block_k) / codes,
                         gmma=sum("GMMA" in t for t in body), hmma=sum("HMMA" in t for t in body),
                         cvt=sum("F2FP" in t for t in body), reg=int(usage["REG"]))
print(json.dumps(out))
"""


def test_sm90_code_runs_the_codes_through_fp8_wgmma(tmp_path):
    """The real GDN in_proj tile (FP8, K 2,048, x normed as loaded, PDL) compiled here for sm_90 (no GPU):
    on the tensor cores the codes reach E4M3 wgmma (QGMMA) undecoded, with less than half the CUDA-core tile's
    instructions a code (scripts/sass_gemv_multi.py --fp8-mma)."""
    out = sm90_json(_COMPILE, tmp_path)
    cores, mma = out["False"], out["True"]
    assert mma["gmma"] >= 4 and mma["hmma"] == 0 and cores["gmma"] == 0
    assert mma["cvt"] < 8 < cores["cvt"]  # the split's few conversions, not one a pair of codes
    assert mma["per_code"] < 0.5 * cores["per_code"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU tier's: Triton's interpreter runs the CPU engine's "
                    "fused kernels (the GPU tier's model gate is test_gpu_decode_fused's [fp8mma])")
def test_the_fused_step_takes_the_tensor_cores_for_its_fp8_projections(quantized_ckpt, monkeypatch):  # noqa: F811
    """gemv_multi.FP8_MMA in the fused decode step (the tiny checkpoint's FP8 projections, the tile threshold
    lowered to its sizes): the GDN in_proj (gemv_mixed, x normed as loaded) and attention q+k+v launches run on
    the tensor-core tile, and the logits stay within 1e-4 of the unfused step's (test_decode_fused's gate of
    the CUDA-core step), the same argmax."""
    from test_decode_fused import _engine

    ids = torch.randint(0, 600, (24 + 2,), generator=torch.Generator().manual_seed(19))
    unfused = _engine(quantized_ckpt, False).score(ids, prefill=24)
    monkeypatch.setattr(gm, "FP8_MMA", True)
    monkeypatch.setattr(gm, "MMA_MIN_TILES", 1)
    launches = []
    for module, name, key in ((gm, "gemv_multi_kernel", "MMA"), (gemv_mixed, "gemv_mixed_kernel", "MMA_A")):
        real = getattr(module, name)

        class Spy:  # the launch's MMA, then the real launch
            def __getitem__(self, grid, real=real, key=key):
                return lambda *a, **k: launches.append(k.get(key, False)) or real[grid](*a, **k)
        monkeypatch.setattr(module, name, Spy())
    eng = _engine(quantized_ckpt, True)
    tensor_cores = eng.score(ids, prefill=24)
    assert sum(launches) >= 2 * len(eng.model.layers)  # every layer's in_proj or q+k+v, both decode steps
    assert torch.isfinite(tensor_cores).all() and torch.equal(tensor_cores[:24], unfused[:24])
    assert ((tensor_cores[24:] - unfused[24:]).abs().max() / unfused[24:].abs().max()) < 1e-4
    assert (tensor_cores[24:].argmax(-1) == unfused[24:].argmax(-1)).all()
