"""The prefill MoE kernels never make the host wait for the GPU (GPU only).

Why: a 64K-token layer-major prefill was measured half idle on the GPU (compute active 4.8 s of 10.1 s) with
2,562 stream synchronizations, two per MoE call, from torch.bincount in align_pairs; each one stops the CPU from
queueing the next layer's kernels. torch's sync debug mode turns any synchronizing op into an error."""
import pytest
import torch

pytest.importorskip("triton")

from qwenlocal.engine.kernels.moe_triton import align_pairs, moe_grouped  # noqa: E402
from qwenlocal.engine.kernels.nvfp4_grouped import nvfp4_moe_grouped, random_nvfp4_rows  # noqa: E402

pytestmark = pytest.mark.gpu


class sync_is_an_error:
    def __enter__(self):
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")

    def __exit__(self, *exc):
        torch.cuda.set_sync_debug_mode("default")


def routed(t, e, k, h):
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(t, h, device="cuda", dtype=torch.bfloat16, generator=gen)
    ids = torch.rand(t, e, device="cuda", generator=gen).topk(k, dim=-1).indices
    w = torch.softmax(torch.randn(t, k, device="cuda", generator=gen), -1).to(torch.bfloat16)
    return x, w, ids


def test_the_detector_catches_bincount():
    """Negative control: the op align_pairs used before must fail under the same check."""
    ids = torch.randint(0, 9, (100,), device="cuda")
    with pytest.raises(RuntimeError, match="synchroniz"), sync_is_an_error():
        torch.bincount(ids, minlength=9)


def test_align_pairs_and_grouped_moe_do_not_sync():
    e, k, h, i, t = 32, 8, 256, 128, 777
    x, w, ids = routed(t, e, k, h)
    gate_up = torch.randn(e, 2 * i, h, device="cuda", dtype=torch.bfloat16) / h ** 0.5
    down = torch.randn(e, h, i, device="cuda", dtype=torch.bfloat16) / i ** 0.5
    moe_grouped(x, w, ids, gate_up, down)  # compile outside the check
    with sync_is_an_error():
        align_pairs(ids, e, 32)
        out = moe_grouped(x, w, ids, gate_up, down)
    assert torch.isfinite(out).all()


def test_nvfp4_grouped_moe_does_not_sync():
    e, k, h, i, t = 32, 8, 256, 128, 777
    x, w, ids = routed(t, e, k, h)
    rows = random_nvfp4_rows(e, h, i, device="cuda")
    nvfp4_moe_grouped(x, w, ids, rows, h, i)
    with sync_is_an_error():
        out = nvfp4_moe_grouped(x, w, ids, rows, h, i)
    assert torch.isfinite(out).all()
