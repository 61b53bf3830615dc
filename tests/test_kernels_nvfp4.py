"""W4A16 NVFP4 GEMV against "dequantize, then the plain matmul", on awkward sizes, outputs NaN-poisoned."""
import pytest
import torch

pytest.importorskip("triton")

from qwenlocal.engine.kernels.nvfp4_triton import nvfp4_gemv  # noqa: E402
from qwenlocal.engine.quant.formats import dequant_nvfp4, quantize_nvfp4  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("n, k", [(37, 48), (64, 512), (100, 2048 + 16), (1, 16)])
def test_nvfp4_gemv_matches_dequantized_matmul(n, k, monkeypatch):
    gen = torch.Generator().manual_seed(n * 1000 + k)
    w = torch.randn(n, k, generator=gen)
    # Subnormal E4M3 scales too (tiny blocks), and negative codes everywhere.
    w[0, :16] *= 1e-5
    packed, scale, scale2 = quantize_nvfp4(w)
    bits = scale.view(torch.uint8)
    assert (packed >> 4 >= 8).any()  # negative codes present
    if n * k > 16:  # the tiny block's scale is an E4M3 subnormal (exponent bits 0)
        assert ((bits & 0x78) == 0).any()
    x = torch.randn(k, generator=gen)
    ref = dequant_nvfp4(packed, scale, scale2) @ x
    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: real_empty(*a, **kw).fill_(float("nan")))
    out = nvfp4_gemv(x.to(DEVICE), packed.to(DEVICE), scale.to(DEVICE), scale2.to(DEVICE)).cpu()
    assert torch.isfinite(out).all()
    assert torch.allclose(out, ref, rtol=1e-4, atol=1e-4 * ref.abs().max().item())


@pytest.mark.parametrize("experts, top_k, hidden, inter", [(7, 3, 64, 32), (13, 5, 96, 48), (4, 4, 256, 128)])
def test_nvfp4_moe_decode_over_native_rows_matches_reference(experts, top_k, hidden, inter):
    from qwenlocal.engine.kernels.nvfp4_triton import nvfp4_expert_row_bytes, nvfp4_moe_decode, pack_nvfp4_expert
    from qwenlocal.engine.model.moe import route, routed_experts_decode_reference

    gen = torch.Generator().manual_seed(experts * 7 + hidden)
    rows, gate_up, down = [], [], []
    for _ in range(experts):
        g, u = (torch.randn(inter, hidden, generator=gen) / hidden ** 0.5 for _ in range(2))
        d = torch.randn(hidden, inter, generator=gen) / inter ** 0.5
        q = [quantize_nvfp4(t) for t in (g, u, d)]
        rows.append(pack_nvfp4_expert(*q))
        gate_up.append(torch.cat([dequant_nvfp4(*q[0]), dequant_nvfp4(*q[1])]))
        down.append(dequant_nvfp4(*q[2]))
    rows = torch.stack(rows)
    assert rows.shape[1] == nvfp4_expert_row_bytes(hidden, inter)
    x = torch.randn(1, hidden, generator=gen)
    w, ids = route(x, torch.randn(experts, hidden, generator=gen), top_k)
    ref = routed_experts_decode_reference(x, w, ids, torch.stack(gate_up), torch.stack(down))
    out = nvfp4_moe_decode(x.to(DEVICE), w.to(DEVICE), ids.to(DEVICE), rows.to(DEVICE), hidden, inter).cpu()
    assert torch.allclose(out, ref, rtol=1e-4, atol=1e-4 * ref.abs().max().item())


def test_real_model_expert_row_is_the_checkpoint_byte_count():
    from qwenlocal.engine.kernels.nvfp4_triton import nvfp4_expert_row_bytes

    assert nvfp4_expert_row_bytes(2048, 512) == 1_769_484  # shared/reference/model-formats.md section 3.3
