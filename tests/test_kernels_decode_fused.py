"""The small fused decode kernels (kernels/decode_norm.py, decode_router.py, attention_prologue.py) against their
torch references (the model's own functions), on awkward sizes, fp32 and bf16, outputs NaN-poisoned.
Interpreter on the CPU, natively on a GPU."""
import pytest
import torch

pytest.importorskip("triton")

from qwenlocal.engine.kernels.decode_fused import (  # noqa: E402
    add_rms_norm, add_rms_norm_reference, attention_prologue, attention_prologue_reference, rope_inv_freq,
    route_topk, route_topk_reference, sigmoid_gate_mul, sigmoid_gate_mul_reference)
from qwenlocal.engine.model.ops import apply_partial_rope, rms_norm_zero_centered, rope_cos_sin  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.bfloat16]
EPS = 1e-6


def rand(*shape, seed: int, scale: float = 1.0, dtype=torch.float32) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen) * scale).to(dtype).to(DEVICE)


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    """fp32: a few ulp; bf16: one ulp (2^-7 relative at most: the two sides may round apart)."""
    assert out.dtype == ref.dtype and out.shape == ref.shape
    assert not out.isnan().any()
    tol = dict(rtol=1e-6, atol=1e-6) if dtype == torch.float32 else dict(rtol=2 ** -7, atol=1e-5)
    torch.testing.assert_close(out.float(), ref.float(), **tol)


# ---- add_rms_norm ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, hidden", [(1, 2048), (3, 2051), (2, 37), (1, 8192), (5, 1), (300, 64)])  # prefill rows too
def test_add_rms_norm_matches_the_layer(rows, hidden, dtype, nan_empty):
    x, delta = rand(rows, hidden, seed=hidden, dtype=dtype), rand(rows, hidden, seed=hidden + 1, dtype=dtype)
    w = rand(hidden, seed=hidden + 2, scale=0.3, dtype=dtype)
    new_x, normed = add_rms_norm(x, delta, w, EPS)
    ref_x, ref_norm = add_rms_norm_reference(x, delta, w, EPS)
    assert torch.equal(new_x, ref_x)  # the add rounds as torch's does
    assert_close(normed, ref_norm, dtype)
    assert torch.equal(x, rand(rows, hidden, seed=hidden, dtype=dtype))  # inputs untouched


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm_without_delta_is_the_plain_norm(dtype, nan_empty):
    x, w = rand(2, 300, seed=1, dtype=dtype), rand(300, seed=2, scale=0.3, dtype=dtype)
    new_x, normed = add_rms_norm(x, None, w, EPS)
    assert new_x is x
    assert_close(normed, rms_norm_zero_centered(x, w, EPS), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm_in_place_on_row_strided_views(dtype, nan_empty):
    """x and delta are column slices of wider buffers (row stride > H); new_x written over x, normed into out."""
    hidden = 97
    big_x, big_d = rand(3, 130, seed=5, dtype=dtype), rand(3, 111, seed=6, dtype=dtype)
    x, delta = big_x[:, 7:7 + hidden], big_d[:, 1:1 + hidden]
    w = rand(hidden, seed=7, scale=0.3, dtype=dtype)
    ref_x, ref_norm = add_rms_norm_reference(x.clone(), delta, w, EPS)
    before = big_x.clone()
    out_norm = torch.empty(3, hidden, device=DEVICE, dtype=dtype)
    new_x, normed = add_rms_norm(x, delta, w, EPS, out_x=x, out_norm=out_norm)
    assert new_x is x and normed is out_norm
    assert torch.equal(x, ref_x)
    assert_close(normed, ref_norm, dtype)
    assert torch.equal(big_x[:, :7], before[:, :7]) and torch.equal(big_x[:, 7 + hidden:], before[:, 7 + hidden:])


def test_add_rms_norm_refuses_what_it_cannot_do():
    x = torch.zeros(2, 16, device=DEVICE)
    with pytest.raises(ValueError):
        add_rms_norm(x.t(), None, torch.zeros(2, device=DEVICE), EPS)
    with pytest.raises(ValueError):
        add_rms_norm(x, torch.zeros(2, 15, device=DEVICE), torch.zeros(16, device=DEVICE), EPS)
    with pytest.raises(ValueError):
        add_rms_norm(torch.zeros(1, 8193, device=DEVICE), None, torch.zeros(8193, device=DEVICE), EPS)


# ---- route_topk --------------------------------------------------------------------------------------------

def distinct_logits(experts: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    """E distinct router logits (distinct in bf16 too) in random order, then the shared gate logit."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randperm(experts, generator=gen).float() * (6.0 / experts) - 3.0
    logits = torch.cat([logits, torch.randn(1, generator=gen)]).to(dtype)
    assert logits[:experts].unique().numel() == experts
    return logits.to(DEVICE)


@pytest.mark.parametrize("weights_dtype", DTYPES)
@pytest.mark.parametrize("logits_dtype", DTYPES)
@pytest.mark.parametrize("experts, top_k", [(7, 3), (13, 5), (256, 8), (100, 1), (5, 5)])
def test_route_topk_matches_the_router(experts, top_k, logits_dtype, weights_dtype, nan_empty):
    logits = distinct_logits(experts, experts * 10 + top_k, logits_dtype)
    weights, ids, shared = route_topk(logits, experts, top_k, weights_dtype)
    ref_w, ref_ids, ref_shared = route_topk_reference(logits, experts, top_k, weights_dtype)
    assert ids.dtype == torch.int64 and ids.shape == (1, top_k)
    assert torch.equal(ids, ref_ids)
    assert_close(weights, ref_w, weights_dtype)
    assert shared.dtype == torch.float32 and shared.shape == (1,)
    torch.testing.assert_close(shared, ref_shared, rtol=1e-6, atol=1e-7)


def test_route_topk_reference_is_moe_route():
    """The reference is moe.route after its F.linear: the same weights and ids from the same logits."""
    from qwenlocal.engine.model.moe import route

    x, router_w = rand(1, 64, seed=1), rand(13, 64, seed=2, scale=0.2)
    w, ids = route(x, router_w, 5)
    logits = torch.cat([torch.nn.functional.linear(x, router_w)[0], torch.zeros(1, device=DEVICE)])
    ref_w, ref_ids, _ = route_topk_reference(logits, 13, 5, x.dtype)
    assert torch.equal(ids, ref_ids) and torch.equal(w, ref_w)


def test_route_topk_ties_take_the_lower_expert_first(nan_empty):
    logits = torch.tensor([0.5, 2.0, 1.0, 2.0, 1.0, 1.0, -1.0, 0.0], device=DEVICE)  # last: the shared gate
    weights, ids, shared = route_topk(logits, 7, 4, torch.float32)
    assert ids.tolist() == [[1, 3, 2, 4]]
    p = torch.softmax(logits[:7], dim=0)[[1, 3, 2, 4]]
    torch.testing.assert_close(weights[0], p / p.sum(), rtol=1e-6, atol=0)
    torch.testing.assert_close(shared, torch.tensor([0.5], device=DEVICE))


def test_route_topk_writes_into_out(nan_empty):
    logits = distinct_logits(256, 3, torch.bfloat16)
    out = (torch.empty(1, 8, device=DEVICE, dtype=torch.bfloat16), torch.zeros(1, 8, device=DEVICE, dtype=torch.int64),
           torch.empty(1, device=DEVICE))
    got = route_topk(logits, 256, 8, torch.bfloat16, out=out)
    assert all(g is o for g, o in zip(got, out))
    ref_w, ref_ids, ref_shared = route_topk_reference(logits, 256, 8, torch.bfloat16)
    assert torch.equal(out[1], ref_ids)
    assert_close(out[0], ref_w, torch.bfloat16)


# ---- attention_prologue ---------------------------------------------------------------------------------------

GEOMETRIES = [(3, 1, 40, 10), (4, 2, 64, 16), (2, 2, 24, 24), (16, 2, 256, 64)]  # heads, kv heads, hd, rd
POSITIONS = [0, 1, 4097, 100000]
THETA = 10_000_000.0


def merged_projection(heads, kvh, hd, seed, dtype):
    """One token's merged q(+gate) | k | v projection output and the three views into it, plus the norms."""
    n_q = heads * 2 * hd
    buf = rand(1, n_q + 2 * kvh * hd, seed=seed, scale=2.0, dtype=dtype)
    q_gate, k, v = buf[:, :n_q], buf[:, n_q:n_q + kvh * hd], buf[:, n_q + kvh * hd:]
    q_norm_w, k_norm_w = (rand(hd, seed=seed + i, scale=0.3, dtype=dtype) for i in (1, 2))
    return buf, q_gate, k, v, q_norm_w, k_norm_w


def fp32_rope_on_rounded_norms(q_gate, k, qw, kw, position, heads, kvh, hd, rd):
    """What the kernel computes: the reference's norms (rounded to the dtype), RoPE in fp32 with fp32 cos/sin,
    one rounding at the end."""
    q = rms_norm_zero_centered(q_gate.reshape(1, heads, 2 * hd)[..., :hd], qw, EPS)
    kn = rms_norm_zero_centered(k.reshape(1, kvh, hd), kw, EPS)
    cos, sin = rope_cos_sin(position.reshape(1), rd, THETA, torch.float32)
    return tuple(apply_partial_rope(n.float(), cos, sin)[0].to(n.dtype) for n in (q, kn))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads, kvh, hd, rd", GEOMETRIES)
def test_attention_prologue_matches_gated_attention(heads, kvh, hd, rd, dtype, nan_empty):
    buf, q_gate, k, v, qw, kw = merged_projection(heads, kvh, hd, heads * 100 + hd, dtype)
    for p in POSITIONS:
        position = torch.tensor([p], device=DEVICE)
        q, gate, k_rot, v_out = attention_prologue(q_gate, k, v, qw, kw, position, EPS, heads, kvh, hd, rd, THETA)
        ref_q, ref_gate, ref_k, ref_v = attention_prologue_reference(q_gate, k, v, qw, kw, position, EPS, heads,
                                                                     kvh, hd, rd, THETA)
        assert q.shape == (heads, hd) and k_rot.shape == (kvh, hd) and q.dtype == k_rot.dtype == dtype
        assert torch.equal(gate, ref_gate) and gate.data_ptr() == q_gate.data_ptr() + hd * q_gate.element_size()
        assert torch.equal(v_out, ref_v) and v_out.data_ptr() == v.data_ptr()  # a view, no copy
        if dtype == torch.float32:
            assert_close(q, ref_q, dtype)
            assert_close(k_rot, ref_k, dtype)
        else:
            # the unrotated dims are the reference's norm; the rotated ones its bf16 RoPE to bf16 rounding, and
            # RoPE in fp32 on the rounded norms to one rounding
            assert_close(q[:, rd:], ref_q[:, rd:], dtype)
            assert_close(k_rot[:, rd:], ref_k[:, rd:], dtype)
            torch.testing.assert_close(q.float(), ref_q.float(), rtol=2 ** -6, atol=2 ** -6)
            torch.testing.assert_close(k_rot.float(), ref_k.float(), rtol=2 ** -6, atol=2 ** -6)
            exact_q, exact_k = fp32_rope_on_rounded_norms(q_gate, k, qw, kw, position, heads, kvh, hd, rd)
            assert_close(q, exact_q, dtype)
            assert_close(k_rot, exact_k, dtype)


def test_attention_prologue_writes_into_outputs_and_converts_fp32_projections(nan_empty):
    """An fp32 merged projection (as the FP8 GEMV returns it) into bf16 outputs given by the caller: v copied."""
    heads, kvh, hd, rd = 4, 2, 64, 16
    buf, q_gate, k, v, qw, kw = merged_projection(heads, kvh, hd, 11, torch.float32)
    position = torch.tensor([77], device=DEVICE)
    outs = [torch.empty(n, hd, device=DEVICE, dtype=torch.bfloat16) for n in (heads, kvh, kvh)]
    q, gate, k_rot, v_out = attention_prologue(q_gate, k, v, qw, kw, position, EPS, heads, kvh, hd, rd, THETA,
                                               q_out=outs[0], k_out=outs[1], v_out=outs[2])
    assert q is outs[0] and k_rot is outs[1] and v_out is outs[2]
    ref_q, ref_gate, ref_k, ref_v = attention_prologue_reference(q_gate, k, v, qw, kw, position, EPS, heads, kvh,
                                                                 hd, rd, THETA)
    assert_close(q, ref_q.to(torch.bfloat16), torch.bfloat16)
    assert_close(k_rot, ref_k.to(torch.bfloat16), torch.bfloat16)
    assert torch.equal(v_out, ref_v.to(torch.bfloat16))
    assert gate.dtype == torch.float32 and torch.equal(gate, ref_gate)


def test_attention_prologue_reads_the_position_on_the_device(nan_empty):
    """The same position tensor, changed in place between calls (as a graph replay sees it)."""
    heads, kvh, hd, rd = 3, 1, 40, 10
    buf, q_gate, k, v, qw, kw = merged_projection(heads, kvh, hd, 3, torch.float32)
    position = torch.tensor([5], device=DEVICE)
    inv_freq = rope_inv_freq(rd, THETA, position.device)
    first = attention_prologue(q_gate, k, v, qw, kw, position, EPS, heads, kvh, hd, rd, THETA, inv_freq=inv_freq)[0]
    position.fill_(90001)
    second = attention_prologue(q_gate, k, v, qw, kw, position, EPS, heads, kvh, hd, rd, THETA, inv_freq=inv_freq)[0]
    ref = attention_prologue_reference(q_gate, k, v, qw, kw, position, EPS, heads, kvh, hd, rd, THETA)[0]
    assert not torch.equal(first[:, :rd], second[:, :rd]) and torch.equal(first[:, rd:], second[:, rd:])
    assert_close(second, ref, torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads, kvh, hd, rd", [(3, 1, 40, 10), (4, 2, 64, 16)])
def test_attention_prologue_writes_k_and_v_into_the_cache_row_of_the_position(heads, kvh, hd, rd, dtype,
                                                                               nan_empty):
    """kv_cache: the step's KV write done by the prologue. Row `position` holds exactly the k and v the plain
    prologue returns (the bytes index_copy would have written); every other row is untouched; q is the same."""
    buf, q_gate, k, v, qw, kw = merged_projection(heads, kvh, hd, 21, dtype)
    rows = 37
    k_cache = rand(rows, kvh, hd, seed=5, dtype=dtype)
    v_cache = rand(rows, kvh, hd, seed=6, dtype=dtype)
    before = k_cache.clone(), v_cache.clone()
    for p in (0, 17, rows - 1):
        position = torch.tensor([p], device=DEVICE)
        q, gate, k_rot, v_ref = attention_prologue(q_gate, k, v, qw, kw, position, EPS, heads, kvh, hd, rd, THETA)
        q2, gate2, none_k, none_v = attention_prologue(q_gate, k, v, qw, kw, position, EPS, heads, kvh, hd, rd,
                                                       THETA, kv_cache=(k_cache, v_cache))
        assert none_k is None and none_v is None
        assert torch.equal(q2, q) and torch.equal(gate2, gate)
        assert torch.equal(k_cache[p], k_rot) and torch.equal(v_cache[p], v_ref)
        others = [r for r in range(rows) if r not in (0, 17, rows - 1)]
        assert torch.equal(k_cache[others], before[0][others]) and torch.equal(v_cache[others], before[1][others])
    with pytest.raises(ValueError, match="k_cache must be"):
        attention_prologue(q_gate, k, v, qw, kw, position, EPS, heads, kvh, hd, rd, THETA,
                           kv_cache=(k_cache[:, :, :-1], v_cache))


# ---- sigmoid_gate_mul --------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads, hd", [(3, 40), (16, 256), (1, 7)])
def test_sigmoid_gate_mul_on_the_prologue_gate(heads, hd, dtype, nan_empty):
    q_gate = rand(1, heads * 2 * hd, seed=heads + hd, scale=3.0, dtype=dtype)
    gate = q_gate.view(heads, 2 * hd)[:, hd:]  # as attention_prologue returns it: row stride 2 * hd
    out = rand(1, heads * hd, seed=hd, dtype=dtype)
    ref = sigmoid_gate_mul_reference(out, gate)
    got = sigmoid_gate_mul(out, gate)
    assert got.shape == out.shape
    assert_close(got, ref, dtype)
    if dtype == torch.bfloat16:  # the sigmoid rounded to bf16 first, as torch does: equal but for an exp ulp
        assert (got != ref).float().mean() < 0.01
    in_place = sigmoid_gate_mul(out, gate, dest=out)
    assert in_place is out and torch.equal(out, got)


# ---- GPU only: no host sync, and CUDA-graph replay equals eager ---------------------------------------------

def decode_chain(x, delta, w, logits, proj, qw, kw, position, attn_out):
    """All four kernels once, at the model's geometry but small: what a captured decode step calls."""
    heads, kvh, hd, rd = 4, 2, 64, 16
    n_q = heads * 2 * hd
    new_x, normed = add_rms_norm(x, delta, w, EPS)
    routed = route_topk(logits, 13, 5, torch.bfloat16)
    q, gate, k, v = attention_prologue(proj[:, :n_q], proj[:, n_q:n_q + kvh * hd], proj[:, n_q + kvh * hd:], qw, kw,
                                       position, EPS, heads, kvh, hd, rd, THETA)
    return (new_x, normed, *routed, q, k, v, sigmoid_gate_mul(attn_out, gate))


def chain_inputs():
    bf = torch.bfloat16
    return [rand(1, 2048, seed=1, dtype=bf), rand(1, 2048, seed=2, dtype=bf), rand(2048, seed=3, dtype=bf),
            rand(14, seed=4), rand(1, 4 * 128 + 2 * 128, seed=5, dtype=bf), rand(64, seed=6, dtype=bf),
            rand(64, seed=7, dtype=bf), torch.tensor([3], device=DEVICE), rand(1, 256, seed=8, dtype=bf)]


@pytest.mark.gpu
def test_decode_kernels_do_not_sync():
    inputs = chain_inputs()
    decode_chain(*inputs)  # compile and make rope_inv_freq's tensor outside the check
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = decode_chain(*inputs)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert all(not o.float().isnan().any() for o in out)


@pytest.mark.gpu
def test_decode_kernels_replay_in_a_cuda_graph_byte_equal_to_eager():
    """Inputs changed in place between replays (a new token, a new position): the replay reads them on the device."""
    inputs = chain_inputs()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        decode_chain(*inputs)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = decode_chain(*inputs)
    for step, position in enumerate([3, 4097, 100000]):
        for i, t in enumerate(inputs):
            if t.is_floating_point():
                t.copy_(rand(*t.shape, seed=100 * step + i, dtype=t.dtype))
        inputs[7].fill_(position)
        graph.replay()
        eager = decode_chain(*inputs)
        for c, e in zip(captured, eager):
            assert torch.equal(c, e)


def test_programmatic_launch_is_never_asked_of_the_interpreter():
    """The CPU (Triton's interpreter) gets plain launches whatever the context says; the context nests."""
    from qwenlocal.engine.kernels.launch import pdl_launch, programmatic_launch

    with programmatic_launch(True):
        assert pdl_launch(torch.device("cpu")) == {"USE_GDC": False}
        x, w = rand(1, 64, seed=1), rand(64, seed=2)
        new_x, normed = add_rms_norm(x, None, w, EPS)  # runs in the interpreter with PDL asked for
        assert torch.equal(normed, add_rms_norm_reference(x, None, w, EPS)[1]) or torch.allclose(
            normed, add_rms_norm_reference(x, None, w, EPS)[1], rtol=1e-6, atol=1e-6)
    assert pdl_launch(torch.device("cpu")) == {"USE_GDC": False}
