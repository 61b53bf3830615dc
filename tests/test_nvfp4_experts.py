"""NVFP4 experts in their native bytes (issue: the real NVFP4 checkpoint): one packed row per expert in the
host bank, the slots and the resident weights; the engine on those rows equals the dequantized engine; offloaded
equals resident byte for byte over >= 180 decode steps; layer-major equals chunked over 4-bit rows."""
import pytest
import torch

from qwenlocal.engine import Engine
from qwenlocal.engine.errors import OptionError
from qwenlocal.engine.quant.convert import quantize_checkpoint
from qwenlocal.engine.quant.formats import quantize_nvfp4
from qwenlocal.engine.quant.nvfp4_rows import (dequant_expert_rows, nvfp4_expert_row_bytes, nvfp4_expert_row_stride,
                                                pack_nvfp4_expert,
                                               quantize_expert_rows, unpack_nvfp4_expert)

CHUNK = 16


@pytest.fixture(scope="module")
def nvfp4_ckpt(tiny_ckpt, tmp_path_factory):
    return quantize_checkpoint(tiny_ckpt, tmp_path_factory.mktemp("nvfp4-experts"))


def test_row_pack_unpack_round_trips_the_bytes():
    gen = torch.Generator().manual_seed(0)
    h, i = 96, 48
    gate, up, down = (quantize_nvfp4(torch.randn(*s, generator=gen)) for s in ((i, h), (i, h), (h, i)))
    row = pack_nvfp4_expert(gate, up, down)
    assert row.dtype == torch.uint8 and row.numel() == nvfp4_expert_row_bytes(h, i)
    for a, b in zip((gate, up, down), unpack_nvfp4_expert(row, h, i)):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1].view(torch.uint8), b[1].view(torch.uint8))
        assert torch.equal(a[2].float().reshape(()), b[2])
    assert nvfp4_expert_row_bytes(2048, 512) == 1_769_484  # the real model's expert, as the checkpoint stores it


def test_quantized_rows_dequantize_to_the_formats_reference():
    gen = torch.Generator().manual_seed(1)
    gate_up, down = torch.randn(3, 2 * 32, 64, generator=gen), torch.randn(3, 64, 32, generator=gen)
    rows = quantize_expert_rows(gate_up, down)
    gu, dn = dequant_expert_rows(rows, 64, 32, torch.float32)
    assert gu.shape == gate_up.shape and dn.shape == down.shape
    # 4-bit weights: close to the originals at NVFP4's level, not equal.
    assert (gu - gate_up).norm() / gate_up.norm() < 0.15 and (dn - down).norm() / down.norm() < 0.15


def _engine(ref, **opts):
    return Engine.from_pretrained(ref, device="cpu", options={"prefill_chunk": CHUNK, **opts})


def test_native_rows_equal_the_dequantized_engine_on_a_real_nvfp4_checkpoint(nvfp4_ckpt):
    dense = _engine(nvfp4_ckpt, expert_format="dense")
    native = _engine(nvfp4_ckpt, expert_format="nvfp4")
    assert native.plan["experts"]["value"].startswith("nvfp4") and dense.plan["experts"]["value"] == "dense"
    rows = native.model.layers[0].moe.experts.weights[0]
    h, i = native.config.hidden_size, native.config.moe.intermediate_size
    # the checkpoint's bytes at the engine's 16-byte row stride (the padding never read)
    assert rows.dtype == torch.uint8 and rows.shape[1] == nvfp4_expert_row_stride(h, i)
    assert rows.shape[1] - nvfp4_expert_row_bytes(h, i) in range(16) and rows.data_ptr() % 16 == 0
    ids = torch.randint(0, 600, (40 + 30,), generator=torch.Generator().manual_seed(2))
    assert torch.equal(native.score(ids, prefill=40), dense.score(ids, prefill=40))


def test_offloaded_nvfp4_rows_are_byte_equal_to_resident(nvfp4_ckpt):
    resident = _engine(nvfp4_ckpt, expert_format="nvfp4")
    offloaded = _engine(nvfp4_ckpt, expert_format="nvfp4", expert_slots=6)
    bank = offloaded.model.cache.bank
    assert bank.fmt == "nvfp4" and bank.rows.dtype == torch.uint8
    # The bank holds the checkpoint's bytes: layer 1's rows equal the resident engine's.
    e = offloaded.config.moe.num_experts
    assert torch.equal(bank.rows[e:2 * e], resident.model.layers[1].moe.experts.weights[0])
    ids = torch.randint(0, 600, (37 + 185,), generator=torch.Generator().manual_seed(3))
    assert torch.equal(offloaded.score(ids, prefill=37), resident.score(ids, prefill=37))
    stats = offloaded.stats()
    assert stats["expert_misses"] > 180 and stats["miss_bytes"] == stats["expert_misses"] * bank.row_bytes


def test_layer_major_over_nvfp4_rows_is_bitwise_chunked(nvfp4_ckpt):
    base = {"expert_format": "nvfp4", "expert_slots": 8}
    chunked = _engine(nvfp4_ckpt, prefill_mode="chunked", **base)
    layer_major = _engine(nvfp4_ckpt, prefill_mode="layer-major", **base)
    ids = torch.randint(0, 600, (CHUNK * 5 + 3 + 20,), generator=torch.Generator().manual_seed(4))
    for engine in (chunked, layer_major):
        engine.score(ids[:30], prefill=20)  # fill the slots, so parking in them must give them back
    a = chunked.score(ids, prefill=CHUNK * 5 + 3)
    b = layer_major.score(ids, prefill=CHUNK * 5 + 3)
    assert torch.equal(a, b)
    assert layer_major.stats()["parking_refill_bytes"] > 0
    assert torch.equal(chunked.model.cache.rows[:-1], layer_major.model.cache.rows[:-1])


def test_synthetic_nvfp4_model_native_and_dequantized_agree():
    native = _engine("synthetic:tiny-nvfp4", expert_format="nvfp4", expert_slots=10)
    dense = _engine("synthetic:tiny-nvfp4", expert_format="dense")
    assert native.model.cache.bank.fmt == "nvfp4"
    ids = torch.randint(0, 600, (24 + 20,), generator=torch.Generator().manual_seed(5))
    assert torch.equal(native.score(ids, prefill=24), dense.score(ids, prefill=24))


def test_nvfp4_format_on_bf16_experts_is_a_clear_error(tiny_ckpt):
    with pytest.raises(OptionError, match="NVFP4"):
        _engine(tiny_ckpt, expert_format="nvfp4")
    with pytest.raises(OptionError, match="expert_format"):
        _engine(tiny_ckpt, expert_format="int4")
    # auto on the CPU dequantizes at load (the reference path).
    assert _engine(tiny_ckpt).plan["experts"]["value"] == "dense"


def test_native_fp8_and_nvfp4_linears_equal_the_dequantized_weights_on_the_cpu(nvfp4_ckpt):
    """Dense FP8/NVFP4 weights kept in their bytes (QuantLinear): without the GPU kernels every call
    dequantizes exactly as loading would, so the logits are byte-equal; the device holds fewer bytes."""
    from qwenlocal.engine.quant.linear import QuantLinear

    native = _engine(nvfp4_ckpt, linear_format="native")
    dense = _engine(nvfp4_ckpt, linear_format="dequantized")
    assert isinstance(native.model.lm_head_w, QuantLinear) and native.model.lm_head_w.fmt == "nvfp4"
    attn = next(layer.mixer for layer in native.model.layers if layer.is_attention)
    assert isinstance(attn.q_proj, QuantLinear) and attn.q_proj.fmt == "fp8"
    assert native.plan["linears"]["value"].startswith("native") and dense.plan["linears"]["value"] == "dense"
    assert native.placement()["dense_weights"] < dense.placement()["dense_weights"]
    ids = torch.randint(0, 600, (33 + 25,), generator=torch.Generator().manual_seed(6))
    assert torch.equal(native.score(ids, prefill=33), dense.score(ids, prefill=33))


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_quant_linear_gemv_and_blocked_prefill_match_the_dequantized_matmul(fmt, monkeypatch):
    """The decode GEMV kernels (Triton's interpreter here) and the row-blocked prefill path vs one matmul."""
    from qwenlocal.engine.quant import linear as ql
    from qwenlocal.engine.quant.formats import quantize_fp8

    dev = "cuda" if torch.cuda.is_available() else "cpu"  # the kernels need CUDA tensors, or the interpreter
    gen = torch.Generator().manual_seed(7)
    w = torch.randn(100, 96, generator=gen).to(dev)
    if fmt == "fp8":
        q, s = quantize_fp8(w)
        tensors = {"weight": q, "weight_scale": s}
    else:
        p, s, s2 = quantize_nvfp4(w)
        tensors = {"weight": p, "weight_scale": s, "weight_scale_2": s2}
    lin = ql.QuantLinear(fmt, tensors, torch.float32, use_kernels=True)
    ref_w = lin.dequantize()
    x1 = torch.randn(1, 96, generator=gen).to(dev)
    y1 = lin(x1)
    assert (y1 - x1 @ ref_w.T).abs().max() <= 1e-4 * (x1 @ ref_w.T).abs().max()
    monkeypatch.setattr(ql, "BLOCK_BYTES", 96 * 4 * 7)  # 7 rows per block: 15 blocks, the last one short
    blocked = ql.QuantLinear(fmt, tensors, torch.float32, use_kernels=True)
    x = torch.randn(5, 3, 96, generator=gen).to(dev)
    assert blocked.block_rows == 7
    assert torch.allclose(blocked(x), x @ ref_w.T, rtol=1e-5, atol=1e-5)
