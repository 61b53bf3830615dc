"""Prefill's small kernels in one Triton launch each (options.prefill_kernels=fused, opt-in on a GPU: the
residual add + RMSNorms, GatedDeltaNet's causal conv + SiLU and its gated output norm, the attention layers' q/k
norms + RoPE and output gate), in Triton's interpreter
on the CPU (natively on a GPU, the `small` model in bf16 there): each kernel against its torch reference on
awkward sizes, every one run at every (layer, chunk) step, the logits at the torch path's level, and layer-major
prefill byte-equal to chunked prefill with them."""
import dataclasses

import pytest
import torch

pytest.importorskip("triton")

from qwenlocal.engine import Engine  # noqa: E402
from qwenlocal.engine.kernels import attention_prologue as prologue  # noqa: E402
from qwenlocal.engine.kernels import decode_norm, gdn_conv, gdn_norm  # noqa: E402
from qwenlocal.engine.kernels.gdn_torch import causal_conv1d  # noqa: E402
from qwenlocal.engine.model.ops import rms_norm_gated  # noqa: E402

CHUNK = 16
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def ckpt(request):
    """The GPU runs FlashInfer and fla, which need the `small` model's head sizes; the CPU takes `tiny`."""
    return request.getfixturevalue("small_ckpt" if DEVICE == "cuda" else "tiny_ckpt")


def _engine(ckpt, fused: bool, **opts):
    if DEVICE == "cuda":  # the resolved decision, both ways
        return Engine.from_pretrained(ckpt, device="cuda", dtype=torch.bfloat16, options={
            "prefill_chunk": CHUNK, "prefill_kernels": "fused" if fused else "torch", **opts})
    eng = Engine.from_pretrained(ckpt, device="cpu", options={"prefill_chunk": CHUNK, **opts})
    if fused:  # the CPU resolves prefill_kernels to torch (no GPU); the test drives the Triton kernel anyway
        kernels = dataclasses.replace(eng.model.kernels, fused_prefill=True)
        eng.model.kernels = kernels
        for layer in eng.model.layers:
            layer.kernels = layer.mixer.kernels = kernels
    return eng


def _prefill(eng, ids):
    state = eng.runner.new_state()
    logits = eng.runner.prefill(state, ids.to(eng.model.device))  # the runner takes ids where the model is
    return logits, state


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("t, heads, v", [(37, 3, 48), (5, 2, 128), (1, 1, 7)])
def test_gated_rms_norm_matches_the_reference(t, heads, v, dtype, nan_empty):
    gen = torch.Generator().manual_seed(t * heads + v)
    o = (torch.randn(t, heads, v, generator=gen) * 3).to(DEVICE)  # the rule's fp32 output
    z = torch.randn(t, heads * v, generator=gen).to(dtype).view(t, heads, v).to(DEVICE)
    w = (1 + 0.3 * torch.randn(v, generator=gen)).to(dtype).to(DEVICE)
    got = gdn_norm.gated_rms_norm(o, z, w, 1e-6)
    ref = rms_norm_gated(o.to(dtype), z, w, 1e-6)
    assert got.dtype == dtype and got.shape == ref.shape and torch.isfinite(got).all()
    # the same roundings; 1/sqrt for rsqrt: an ulp of the output dtype at most
    ulp = 2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -21
    assert ((got.float() - ref.float()).abs() <= ulp * ref.float().abs() + 1e-6).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("t", [45, 2, 1])  # several token blocks; fewer tokens than the state holds
def test_conv_silu_split_matches_the_reference(t, dtype, nan_empty):
    gen = torch.Generator().manual_seed(t)
    kd, vd, width = 24, 40, 4  # channel blocks that straddle the q | k | v boundaries
    c = 2 * kd + vd
    x = torch.randn(t, c, generator=gen).to(dtype).to(DEVICE)
    weight = (torch.randn(c, width, generator=gen) * 0.5).to(dtype).to(DEVICE)
    state = torch.randn(c, width - 1, generator=gen).to(DEVICE)  # fp32, as the cache may hold it
    q, k, v, new_state = gdn_conv.conv_silu_split(x, weight, state, kd)
    mixed, ref_state = causal_conv1d(x.t(), weight, state)
    ref = mixed.t()
    assert q.is_contiguous() and k.is_contiguous() and v.is_contiguous()
    got = torch.cat([q, k, v], dim=1)
    assert got.shape == ref.shape and got.dtype == dtype and torch.isfinite(got).all()
    ulp = 2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -20  # the conv's summation order may differ
    assert ((got.float() - ref.float()).abs() <= 2 * ulp * ref.float().abs() + 1e-5).all()
    assert torch.equal(new_state, ref_state)  # the last inputs, moved, not computed


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("t, heads, kvh, hd, rd", [(5, 3, 1, 48, 16), (2, 2, 2, 64, 64), (1, 1, 1, 20, 0)])
def test_attention_prologue_rows_is_the_decode_prologue_at_each_token(t, heads, kvh, hd, rd, dtype, nan_empty):
    """Each token's q and k are the decode prologue's for that token at its position, byte for byte (one
    per-head code); positions far apart (RoPE's large angles)."""
    gen = torch.Generator().manual_seed(t * heads + hd)
    wide = (torch.randn(t, heads * 2 * hd + 8, generator=gen) * 2).to(dtype).to(DEVICE)
    q_gate = wide[:, :heads * 2 * hd]  # stride-1 rows of a wider buffer, as a merged projection's slice
    k = (torch.randn(t, kvh * hd, generator=gen) * 2).to(dtype).to(DEVICE)
    qw, kw = ((0.2 * torch.randn(hd, generator=gen)).to(dtype).to(DEVICE) for _ in range(2))
    positions = torch.tensor([0, 7, 4096, 100_000, 131_071][:t], device=DEVICE)
    q, k_rot = prologue.attention_prologue_rows(q_gate, k, qw, kw, positions, 1e-6, heads, kvh, hd, rd, 1e7)
    assert q.shape == (t, heads, hd) and k_rot.shape == (t, kvh, hd) and q.dtype == k_rot.dtype == dtype
    v = torch.zeros(kvh * hd, device=DEVICE, dtype=dtype)
    for i in range(t):
        one_q, _, one_k, _ = prologue.attention_prologue(q_gate[i].contiguous(), k[i], v, qw, kw, positions[i:i + 1],
                                                         1e-6, heads, kvh, hd, rd, 1e7)
        assert torch.equal(q[i], one_q) and torch.equal(k_rot[i], one_k)


def test_fused_prefill_kernels_run_at_every_step_and_stay_at_the_torch_level(ckpt, monkeypatch):
    calls, gated, convs, prologues = [], [], [], []
    real, real_gated, real_conv = decode_norm.add_rms_norm, gdn_norm.gated_rms_norm, gdn_conv.conv_silu_split
    real_prologue = prologue.attention_prologue_rows

    def counted_prologue(*args, **kwargs):
        prologues.append(1)
        return real_prologue(*args, **kwargs)

    monkeypatch.setattr(prologue, "attention_prologue_rows", counted_prologue)

    def counted(*args, **kwargs):
        if args[0].shape[0] > 1:  # a prefill chunk's rows; a GPU engine's fused decode step (1 row) uses it too
            calls.append(args[1] is not None)
        return real(*args, **kwargs)

    def counted_gated(*args, **kwargs):
        gated.append(1)
        return real_gated(*args, **kwargs)

    monkeypatch.setattr(decode_norm, "add_rms_norm", counted)
    def counted_conv(*args, **kwargs):
        convs.append(1)
        return real_conv(*args, **kwargs)

    monkeypatch.setattr(gdn_norm, "gated_rms_norm", counted_gated)
    monkeypatch.setattr(gdn_conv, "conv_silu_split", counted_conv)
    ids = torch.randint(0, 500, (40,), generator=torch.Generator().manual_seed(8))  # 3 chunks, the last partial
    ref, _ = _prefill(_engine(ckpt, False), ids)
    assert not calls
    eng = _engine(ckpt, True)
    got, _ = _prefill(eng, ids)
    layers = len(eng.model.layers)
    assert calls.count(False) == calls.count(True) == 3 * layers  # the input norm, then add + post norm
    gdn_layers = sum(not layer.is_attention for layer in eng.model.layers)
    assert len(gated) == len(convs) == 3 * gdn_layers  # GDN layers' conv and output norm
    assert prologues and len(prologues) == 3 * (layers - gdn_layers)  # attention layers' q/k norms and RoPE
    assert torch.isfinite(got).all()
    rel = ((got.float() - ref.float()).norm() / ref.float().norm()).item()
    assert rel < (1e-5 if DEVICE == "cpu" else 2e-2)  # fp32: ulps of rsqrt and the conv's order; bf16 level


def test_layer_major_is_byte_equal_to_chunked_with_fused_prefill(ckpt):
    ids = torch.randint(0, 500, (40,), generator=torch.Generator().manual_seed(9))
    base = {"expert_slots": 20}
    a, sa = _prefill(_engine(ckpt, True, prefill_mode="chunked", **base), ids)
    b, sb = _prefill(_engine(ckpt, True, prefill_mode="layer-major", **base), ids)
    assert torch.equal(a, b)
    assert all(torch.equal(sa.recurrent[i], sb.recurrent[i]) for i in sa.recurrent)
    assert all(torch.equal(sa.kv[i].k[:40], sb.kv[i].k[:40]) for i in sa.kv)
