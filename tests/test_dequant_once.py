"""Layer-major prefill dequantizes each FP8/NVFP4 linear once per layer, not once per chunk: the memo of
quant/linear.dequantized_once() gives the same rows back inside, nothing outside, and stops at MEMO_BYTES;
on a mixed NVFP4/FP8 checkpoint with the quantized linears kept native, layer-major prefill stays bitwise equal
to chunked prefill while dequantizing len(chunks) times less."""
import pytest
import torch

from qwenlocal.engine import Engine
from qwenlocal.engine.quant import linear as ql
from qwenlocal.engine.quant.convert import quantize_checkpoint
from qwenlocal.engine.quant.formats import quantize_fp8, quantize_nvfp4
from qwenlocal.engine.quant.linear import QuantLinear, dequantized_once

CHUNK = 16


def fp8_linear(n=24, k=40, seed=0):
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed))
    codes, scale = quantize_fp8(w)
    return QuantLinear("fp8", {"weight": codes, "weight_scale": scale}, torch.float32, use_kernels=False)


def test_memo_reuses_inside_and_forgets_outside():
    lin = fp8_linear()
    outside = lin.dequantize()
    assert lin.dequantize() is not outside  # no memo: every call dequantizes
    with dequantized_once():
        first = lin.dequantize()
        assert lin.dequantize() is first
        assert lin.dequantize(0, 8) is not first and torch.equal(lin.dequantize(0, 8), first[:8])
        assert torch.equal(first, outside)
    assert lin.dequantize() is not first


def test_memo_stops_at_its_byte_cap(monkeypatch):
    a, b = fp8_linear(seed=1), fp8_linear(seed=2)
    monkeypatch.setattr(ql, "MEMO_BYTES", 24 * 40 * 4)  # room for exactly one fp32 weight
    with dequantized_once():
        wa = a.dequantize()
        wb = b.dequantize()
        assert a.dequantize() is wa
        assert b.dequantize() is not wb and torch.equal(b.dequantize(), wb)


def test_nvfp4_rows_are_memoized_per_row_range():
    w = torch.randn(32, 64, generator=torch.Generator().manual_seed(4))
    packed, scale, scale2 = quantize_nvfp4(w)
    lin = QuantLinear("nvfp4", {"weight": packed, "weight_scale": scale, "weight_scale_2": scale2},
                      torch.float32, use_kernels=False)
    with dequantized_once():
        top = lin.dequantize(0, 16)
        assert lin.dequantize(0, 16) is top and torch.equal(lin.dequantize(16, 32), lin.dequantize()[16:])


@pytest.fixture(scope="module")
def mixed_ckpt(tiny_ckpt, tmp_path_factory):
    return quantize_checkpoint(tiny_ckpt, tmp_path_factory.mktemp("dequant-once"))


def counted(monkeypatch):
    calls = {"n": 0}
    real = QuantLinear._dequantize

    def counting(self, rows):
        calls["n"] += 1
        return real(self, rows)

    monkeypatch.setattr(QuantLinear, "_dequantize", counting)
    return calls


def test_layer_major_dequantizes_once_per_layer_and_stays_bitwise_chunked(mixed_ckpt, monkeypatch):
    base = {"prefill_chunk": CHUNK, "linear_format": "native"}
    engines = {mode: Engine.from_pretrained(mixed_ckpt, device="cpu", dtype=torch.float32,
                                            options={**base, "prefill_mode": mode})
               for mode in ("chunked", "layer-major")}
    quant = [v for layer in engines["chunked"].model.layers for v in vars(layer.mixer).values()
             if isinstance(v, QuantLinear)]
    assert quant, "the mixed checkpoint must give native quantized linears"
    ids = torch.randint(0, 600, (4 * CHUNK + 5,), generator=torch.Generator().manual_seed(5))
    calls = counted(monkeypatch)
    logits, counts = {}, {}
    for mode, engine in engines.items():
        calls["n"] = 0
        state = engine.runner.new_state()
        logits[mode] = engine.runner.prefill(state, ids)
        counts[mode] = calls["n"]
    assert torch.equal(logits["chunked"], logits["layer-major"])
    chunks = 5
    # Chunked: every quantized linear once per chunk (the last token's logits too); layer-major: the layers'
    # linears once per window, only what runs after the layers (final logits) per call.
    assert counts["layer-major"] * 2 < counts["chunked"], counts  # measured: 26 vs 126
    assert counts["chunked"] >= chunks * len(quant), counts
