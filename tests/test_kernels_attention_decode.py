"""The batch-1 split-KV decode attention with its merge in the last programs (kernels/attention_decode.py)
against its fp32 reference: GQA, KV lengths from 1 (most splits empty) to several steps a split, the position
read on the device, fp32 and bf16; the counters back at 0 after each launch; a negative control (a head
counter that says all groups but one are in: the output is merged from unwritten partials); the refusals.
Interpreter on the CPU, natively on a GPU (and the GPU tier's step-level gate, tests/test_gpu_decode_fused.py)."""
import pytest
import torch

pytest.importorskip("triton")

from qwenlocal.engine.kernels import attention_decode as ad  # noqa: E402
from qwenlocal.engine.kernels.launch import new_counter  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SMALL = dict(splits=8, group=4, block_t=16)  # 2 groups a head: both merge levels, few programs


def _case(heads, kvh, d, rows, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, heads, d, generator=gen).to(dtype).to(DEVICE)
    k = (torch.randn(rows, kvh, d, generator=gen) * 2).to(dtype).to(DEVICE)
    v = torch.randn(rows, kvh, d, generator=gen).to(dtype).to(DEVICE)
    return q, k, v


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads, kvh, d", [(8, 2, 32), (4, 4, 16), (6, 1, 64)])
def test_decode_attention_matches_the_reference(heads, kvh, d, dtype):
    q, k, v = _case(heads, kvh, d, 300, dtype, seed=heads * d)
    counters = new_counter(q.device, kvh * (SMALL["splits"] // SMALL["group"] + 1))
    for position in (0, 5, 130, 299):  # one row; some splits empty; several steps in every split
        out = ad.decode_attention(q, k, v, torch.tensor([position], device=DEVICE), counters, **SMALL)
        ref = ad.decode_attention_reference(q, k, v, position)
        assert out.shape == (1, heads, d) and out.dtype == dtype and torch.isfinite(out).all()
        tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(out.float().cpu(), ref.cpu(), **tol)
        assert not counters.any()


def test_the_default_grid_on_a_long_cache():
    q, k, v = _case(16, 2, 64, 3000, torch.float32, seed=1)
    counters = new_counter(q.device, 2 * (ad.SPLITS // ad.GROUP + 1))
    out = ad.decode_attention(q, k, v, torch.tensor([2999], device=DEVICE), counters)
    torch.testing.assert_close(out.cpu(), ad.decode_attention_reference(q, k, v, 2999).cpu(), rtol=1e-5, atol=1e-5)


@pytest.mark.interpreter_order
def test_a_merge_before_every_group_arrived_gives_other_bytes(nan_empty):
    """Negative control: head 0's counter preset to all its groups but one: the first group to finish merges the
    head's output from group partials the other has not written."""
    q, k, v = _case(8, 2, 32, 300, torch.float32, seed=2)
    position = torch.tensor([299], device=DEVICE)
    good = ad.decode_attention(q, k, v, position, new_counter(q.device, 2 * 3), **SMALL)
    early = new_counter(q.device, 2 * 3)
    early[2 * 2] = 1  # head 0's count of groups (2 a head): one already "in"
    bad = ad.decode_attention(q, k, v, position, early, **SMALL)
    assert torch.equal(bad[:, 4:], good[:, 4:])  # head 1's query heads: untouched
    assert not torch.equal(bad[:, :4], good[:, :4])


def test_bad_calls_are_refused():
    q, k, v = _case(8, 2, 32, 10, torch.float32, seed=3)
    position = torch.tensor([3], device=DEVICE)
    with pytest.raises(ValueError, match="counters"):
        ad.decode_attention(q, k, v, position, new_counter(q.device, 3), **SMALL)
    with pytest.raises(ValueError, match="multiple of group"):
        ad.decode_attention(q, k, v, position, new_counter(q.device, 2 * 3), splits=6, group=4)
    with pytest.raises(ValueError, match="kv_heads"):
        ad.decode_attention(q, k[:, :1].contiguous(), v, position, new_counter(q.device, 2 * 3), **SMALL)


@pytest.mark.gpu
def test_graph_replay_at_the_real_geometry_reads_the_position_on_the_device():
    """16 query heads on 2 KV heads of 256, bf16, the default grid: one captured launch replayed at positions
    set in place gives the eager call's bytes at each (the KV length is read on the device)."""
    q, k, v = _case(16, 2, 256, 20_000, torch.bfloat16, seed=4)
    position = torch.tensor([0], device=DEVICE)
    counters = new_counter(q.device, 2 * (ad.SPLITS // ad.GROUP + 1))
    ad.decode_attention(q, k, v, position, counters)  # compile off-capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = ad.decode_attention(q, k, v, position, counters)
    for p in (0, 63, 16_383, 19_999):
        position.fill_(p)
        graph.replay()
        eager = ad.decode_attention(q, k, v, position, counters)
        assert torch.equal(captured, eager)
        ref = ad.decode_attention_reference(q, k, v, p)
        torch.testing.assert_close(captured.float(), ref, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads, kvh, d, splits", [(8, 2, 32, 8), (6, 2, 64, 16), (4, 4, 16, 4), (12, 4, 128, 8)])
def test_the_merge_in_the_gate_launch_matches_the_reference_and_the_in_launch_merge(heads, kvh, d, splits, dtype):
    """attention_decode.MERGE_APART: decode_attention_parts (no merge in the launch) then attention_merge.merge_gate
    (the splits weighed in one load a program, times sigmoid(gate)): against merge_gate_reference from the same
    partials, against the fp32 attention reference times the gate, and against decode_attention +
    sigmoid_gate_mul (the in-launch merge, another order of sums) within the output dtype's rounding; G = 3
    (not a power of 2) among them, KV lengths with empty splits."""
    from qwenlocal.engine.kernels.attention_merge import merge_gate, merge_gate_reference
    from qwenlocal.engine.kernels.decode_norm import sigmoid_gate_mul

    q, k, v = _case(heads, kvh, d, 300, dtype, seed=heads * d + splits)
    gen = torch.Generator().manual_seed(d)
    gate2 = torch.randn(heads, 2 * d, generator=gen).to(dtype).to(DEVICE)
    gate = gate2[:, d:]  # stride-1 rows of stride 2 * d, as attention_prologue's view
    counters = new_counter(q.device, kvh * (splits // 4 + 1))
    for position in (0, 5, 130, 299):
        pos = torch.tensor([position], device=DEVICE)
        acc, ml = ad.decode_attention_parts(q, k, v, pos, splits=splits, block_t=16)
        out = merge_gate(acc, ml, gate, dtype)
        assert out.shape == (1, heads * d) and out.dtype == dtype and torch.isfinite(out).all()
        twin = merge_gate_reference(acc.cpu(), ml.cpu(), gate.cpu(), dtype)
        ref = ad.decode_attention_reference(q, k, v, position).cpu().reshape(heads, d)
        ref = (ref.to(dtype).float() * torch.sigmoid(gate.cpu()).float()).reshape(1, -1)
        in_launch = sigmoid_gate_mul(ad.decode_attention(q, k, v, pos, counters, splits=splits, group=4, block_t=16),
                                     gate).reshape(1, -1)
        if dtype == torch.float32:
            for other in (twin, ref, in_launch.cpu()):
                torch.testing.assert_close(out.cpu(), other, rtol=1e-5, atol=1e-5)
        else:  # a bf16 rounding of the attention output apart at most
            for other in (twin.float(), ref, in_launch.float().cpu()):
                torch.testing.assert_close(out.float().cpu(), other, rtol=1.6e-2, atol=1e-2)


def test_the_merge_reads_every_splits_partial():
    """Negative control: one split's partial changed after the attention launch changes the merged output (the
    merge takes the partials it is given; with a split's running max set to -inf, that split drops out)."""
    from qwenlocal.engine.kernels.attention_merge import merge_gate

    q, k, v = _case(8, 2, 32, 300, torch.float32, seed=7)
    gate = torch.zeros(8, 32, device=DEVICE)
    acc, ml = ad.decode_attention_parts(q, k, v, torch.tensor([299], device=DEVICE), splits=8, block_t=16)
    good = merge_gate(acc, ml, gate, torch.float32)
    ml[0, 3, :, 0] = float("-inf")
    bad = merge_gate(acc, ml, gate, torch.float32)
    assert torch.equal(bad[:, 4 * 32:], good[:, 4 * 32:]) and not torch.equal(bad[:, :4 * 32], good[:, :4 * 32])


def test_the_parts_and_the_merge_refuse_bad_shapes():
    from qwenlocal.engine.kernels.attention_merge import merge_gate

    q, k, v = _case(8, 2, 32, 10, torch.float32, seed=3)
    position = torch.tensor([3], device=DEVICE)
    with pytest.raises(ValueError, match="power of 2"):
        ad.decode_attention_parts(q, k, v, position, splits=6)
    acc, ml = ad.decode_attention_parts(q, k, v, position, splits=8, block_t=16)
    with pytest.raises(ValueError, match="gate must be"):
        merge_gate(acc, ml, torch.zeros(8, 16, device=DEVICE), torch.float32)
    with pytest.raises(ValueError, match="acc / ml"):
        merge_gate(acc, ml[:, :4], torch.zeros(8, 32, device=DEVICE), torch.float32)


@pytest.mark.gpu
def test_the_merge_apart_at_the_real_geometry_is_graph_stable():
    """16 query heads on 2 KV heads of 256, bf16, the default splits: decode_attention_parts + merge_gate captured
    once and replayed at positions set in place give the eager calls' bytes, at the reference's bf16 level."""
    from qwenlocal.engine.kernels.attention_merge import merge_gate

    q, k, v = _case(16, 2, 256, 20_000, torch.bfloat16, seed=5)
    gate = torch.randn(16, 256, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16).to(DEVICE)
    position = torch.tensor([0], device=DEVICE)
    run = lambda: merge_gate(*ad.decode_attention_parts(q, k, v, position), gate, torch.bfloat16)  # noqa: E731
    run()  # compile off-capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run()
    for p in (0, 63, 16_383, 19_999):
        position.fill_(p)
        graph.replay()
        assert torch.equal(captured, run())
        ref = ad.decode_attention_reference(q, k, v, p).reshape(16, 256).to(torch.bfloat16).float()
        ref = ref * torch.sigmoid(gate).float()
        torch.testing.assert_close(captured.float().reshape(16, 256), ref, rtol=2e-2, atol=2e-2)
