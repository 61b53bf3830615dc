"""GPU tier of the fused decode step (decode_kernels=auto on a GPU): against the unfused step at the bf16 level
(both measured against the CPU fp32 reference), CUDA-graph replay byte-equal to eager over >= 180 steps, on the
real-format synthetic model (NVFP4 experts/shared/lm_head, FP8 projections) and on a BF16 checkpoint."""
import pytest
import torch

from qwenlocal.engine import Engine

pytestmark = pytest.mark.gpu
CHUNK = 50


def build(ref, **options):
    return Engine.from_pretrained(ref, device="cuda", dtype=torch.bfloat16,
                                  options={"prefill_chunk": CHUNK, "overlap": "off", **options})


def _rel(x, ref):
    return float((x - ref).norm() / ref.norm())


@pytest.mark.parametrize("which", ["synthetic:small-nvfp4", "small"])
def test_fused_decode_is_at_the_bf16_level_of_the_unfused_step(small_ckpt, which):
    ref = small_ckpt if which == "small" else which
    fused, unfused = build(ref), build(ref, decode_kernels="reference")
    assert fused.model.kernels.fused_decode and not unfused.model.kernels.fused_decode
    ids = torch.randint(0, 600, (64 + 40,), generator=torch.Generator().manual_seed(31))
    a, b = fused.score(ids, prefill=64), unfused.score(ids, prefill=64)
    cpu = Engine.from_pretrained(ref, device="cpu", options={"prefill_chunk": CHUNK}).score(ids, prefill=64)
    assert torch.isfinite(a).all()
    assert torch.equal(a[:64], b[:64])  # prefill is the same path
    ra, rb = _rel(a[64:], cpu[64:]), _rel(b[64:], cpu[64:])
    assert ra <= max(2e-2, 1.5 * rb), (ra, rb)
    assert (a[64:].argmax(-1) == b[64:].argmax(-1)).float().mean() >= 0.9


@pytest.mark.parametrize("which", ["synthetic:small-nvfp4", "small"])
def test_fused_decode_graph_is_byte_equal_to_eager(small_ckpt, which):
    ref = small_ckpt if which == "small" else which
    graphs, eager = build(ref), build(ref, cuda_graphs=False)
    assert graphs.runner.use_graph and not eager.runner.use_graph and graphs.model.kernels.fused_decode
    ids = torch.randint(0, 600, (64 + 190,), generator=torch.Generator().manual_seed(32))
    a, b = graphs.score(ids, prefill=64), eager.score(ids, prefill=64)
    assert torch.isfinite(a).all() and torch.equal(a, b)


def test_programmatic_launch_is_on_and_gives_the_plain_launch_bytes():
    """decode_kernels=fused-pdl (sm_90+) launches the fused kernels with programmatic dependent launch; the logits
    are byte-equal to the same kernels launched plainly (decode_kernels=fused), through the graph, 190 steps."""
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("programmatic dependent launch needs sm_90+")
    pdl = build("synthetic:small-nvfp4", decode_kernels="fused-pdl")
    plain = build("synthetic:small-nvfp4", decode_kernels="fused")  # not the default: auto is fused-pdl on sm_90
    assert pdl.model.kernels.pdl and pdl.engine_config.decode == "fused-pdl"
    assert not plain.model.kernels.pdl and plain.model.kernels.fused_decode and plain.engine_config.decode == "fused"
    ids = torch.randint(0, 600, (64 + 190,), generator=torch.Generator().manual_seed(33))
    a, b = pdl.score(ids, prefill=64), plain.score(ids, prefill=64)
    assert torch.isfinite(a).all() and torch.equal(a, b)
