"""The fused GatedDeltaNet decode step against its torch reference (the model's unfused steps for t = 1), on
awkward sizes, both launch plans, several consecutive tokens (states carried and compared), outputs
NaN-poisoned; plus determinism and the conv state's in-place shift (the race the plans avoid)."""
import pytest
import torch

pytest.importorskip("triton")

from qwenlocal.engine.kernels.gdn_decode import gdn_decode_step, gdn_decode_step_reference  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# (Hk, Hv, K, V, W)
SIZES = [(3, 6, 24, 40, 4), (2, 2, 16, 48, 4), (1, 4, 16, 24, 4), (2, 6, 8, 20, 3)]
BF16_TOL = (1.6e-2, 8e-3)  # ~2 bf16 ulps (the interpreter matches bit for bit; a GPU's exp may not)
PLANS = [dict(one_launch=False), dict(one_launch=True), dict(one_launch=False, block_v=16, num_warps=2),
         dict(one_launch=False, block_v=8, num_warps=4)]  # the last: profile_decode's arm gdnbv=8


def make_layer(hk, hv, kd, vd, width, dtype, seed):
    """Weights and states of one layer (device tensors); conv weights / norm weight in dtype, the rest fp32."""
    gen = torch.Generator().manual_seed(seed)
    conv_dim = 2 * hk * kd + hv * vd
    layer = dict(
        conv_state=torch.randn(conv_dim, width - 1, generator=gen).to(dtype),
        conv_w=(torch.randn(conv_dim, 1, width, generator=gen) * 0.5).to(dtype),  # the checkpoint's layout
        neg_a=-torch.empty(hv).uniform_(-2, 1, generator=gen).exp(),
        dt_bias=torch.randn(hv, generator=gen),
        state=torch.randn(hv, kd, vd, generator=gen) * 0.3,
        norm_w=(1 + 0.2 * torch.randn(vd, generator=gen)).to(dtype),
    )
    return {n: t.to(DEVICE) for n, t in layer.items()}


def make_token(hk, hv, kd, vd, dtype, seed, views=False):
    """The in-projection outputs of one token. views: slices of one merged buffer at odd offsets (the merged
    GEMV's output), z as a [Hv, V] view with a padded row stride."""
    gen = torch.Generator().manual_seed(10_000 + seed)
    conv_dim = 2 * hk * kd + hv * vd
    n = conv_dim + hv * vd + 2 * hv
    buf = (torch.randn(n + 3, generator=gen) * 1.5).to(dtype).to(DEVICE)
    a = buf[3 + n - hv:]
    a[0] = 30.0  # a + dt_bias past softplus's threshold of 20
    if hv > 1:
        a[1] = -40.0  # softplus ~ e^x: the accurate log1p
    if not views:
        buf = buf.clone()
    mixed_qkv, b = buf[3:3 + conv_dim], buf[3 + n - 2 * hv:3 + n - hv]
    z = buf[3 + conv_dim:3 + conv_dim + hv * vd]
    if views:
        padded = torch.randn(hv, vd + 5, generator=gen).to(dtype).to(DEVICE)
        padded[:, :vd] = z.view(hv, vd)
        z = padded[:, :vd]
    else:
        mixed_qkv, z, b, a = (t.contiguous() for t in (mixed_qkv, z, b, a))
    return dict(mixed_qkv=mixed_qkv, z=z, b=b, a=a)


def clone_layer(layer):
    return {n: t.clone() for n, t in layer.items()}


def step(fn, token, layer, hk, hv, kd, vd, **kw):
    return fn(token["mixed_qkv"], token["z"], token["b"], token["a"], layer["conv_state"], layer["conv_w"],
              layer["neg_a"], layer["dt_bias"], layer["state"], layer["norm_w"], 1e-6, hk, hv, kd, vd, **kw)


def close(out, ref, rtol, atol_rel):
    out, ref = out.float().cpu(), ref.float().cpu()
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, rtol=rtol, atol=atol_rel * ref.abs().max().item())


@pytest.mark.parametrize("plan", PLANS, ids=["two-launch", "one-launch", "two-launch-bv16", "two-launch-bv8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("hk, hv, kd, vd, width", SIZES)
def test_decode_steps_match_reference(hk, hv, kd, vd, width, dtype, plan, nan_empty):
    rtol, atol = (1e-5, 1e-5) if dtype == torch.float32 else BF16_TOL
    fused = make_layer(hk, hv, kd, vd, width, dtype, seed=hk * 100 + vd)
    ref = clone_layer(fused)
    for t in range(4):
        token = make_token(hk, hv, kd, vd, dtype, seed=t, views=t % 2 == 1)
        out = step(gdn_decode_step, token, fused, hk, hv, kd, vd, **plan)
        expect = step(gdn_decode_step_reference, token, ref, hk, hv, kd, vd)
        assert out.shape == (hv * vd,) and out.dtype == dtype
        close(out, expect, rtol, atol)
        close(fused["state"], ref["state"], rtol, atol)
        assert torch.equal(fused["conv_state"], ref["conv_state"])  # copies of rounded inputs: exact


@pytest.mark.parametrize("one_launch", [False, True])
def test_fp32_inputs_with_bf16_compute_are_rounded_like_the_model(one_launch, nan_empty):
    """The merged GEMV may return fp32: the step rounds it to the compute dtype first, as linear() would."""
    hk, hv, kd, vd, width = 3, 6, 24, 40, 4
    fused = make_layer(hk, hv, kd, vd, width, torch.bfloat16, seed=5)
    ref = clone_layer(fused)
    for t in range(3):
        token = make_token(hk, hv, kd, vd, torch.float32, seed=20 + t, views=True)
        out = step(gdn_decode_step, token, fused, hk, hv, kd, vd, one_launch=one_launch)
        expect = step(gdn_decode_step_reference, token, ref, hk, hv, kd, vd)
        assert out.dtype == torch.bfloat16
        close(out, expect, *BF16_TOL)
        close(fused["state"], ref["state"], *BF16_TOL)
        assert torch.equal(fused["conv_state"], ref["conv_state"])


@pytest.mark.parametrize("one_launch", [False, True])
def test_out_parameter_is_written_and_returned(one_launch, nan_empty):
    hk, hv, kd, vd, width = 2, 2, 16, 48, 4
    layer = make_layer(hk, hv, kd, vd, width, torch.float32, seed=7)
    ref = clone_layer(layer)
    token = make_token(hk, hv, kd, vd, torch.float32, seed=3)
    out = torch.empty(hv * vd, device=DEVICE)  # NaN-poisoned
    got = step(gdn_decode_step, token, layer, hk, hv, kd, vd, out=out, one_launch=one_launch)
    assert got.data_ptr() == out.data_ptr()
    close(out, step(gdn_decode_step_reference, token, ref, hk, hv, kd, vd), 1e-5, 1e-5)


@pytest.mark.parametrize("one_launch", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_two_runs_give_identical_bytes(dtype, one_launch, nan_empty):
    hk, hv, kd, vd, width = 3, 6, 24, 40, 4
    first = make_layer(hk, hv, kd, vd, width, dtype, seed=11)
    second = clone_layer(first)
    for t in range(2):
        token = make_token(hk, hv, kd, vd, dtype, seed=40 + t)
        out1 = step(gdn_decode_step, token, first, hk, hv, kd, vd, one_launch=one_launch)
        out2 = step(gdn_decode_step, token, second, hk, hv, kd, vd, one_launch=one_launch)
        for x, y in [(out1, out2), (first["state"], second["state"]), (first["conv_state"], second["conv_state"])]:
            assert torch.equal(x.view(torch.uint8), y.view(torch.uint8))


@pytest.mark.parametrize("plan", PLANS[:2], ids=["two-launch", "one-launch"])
@pytest.mark.parametrize("hk, hv, kd, vd, width", [(3, 6, 24, 40, 4), (1, 4, 16, 24, 4)])
def test_conv_state_holds_the_last_inputs_after_several_steps(hk, hv, kd, vd, width, plan, nan_empty):
    """Independent of the reference: after n >= W-1 steps the conv state is the last W-1 raw inputs (q/k
    channels are read by several programs: a shift before every read is done would corrupt them), and
    the conv of each step used the inputs before it (the outputs match the reference all along)."""
    dtype = torch.bfloat16
    fused = make_layer(hk, hv, kd, vd, width, dtype, seed=13)
    ref = clone_layer(fused)
    inputs = []
    for t in range(width + 2):
        token = make_token(hk, hv, kd, vd, dtype, seed=60 + t)
        inputs.append(token["mixed_qkv"].clone())
        out = step(gdn_decode_step, token, fused, hk, hv, kd, vd, **plan)
        close(out, step(gdn_decode_step_reference, token, ref, hk, hv, kd, vd), *BF16_TOL)
    assert torch.equal(fused["conv_state"], torch.stack(inputs[-(width - 1):], dim=1))


@pytest.mark.gpu
@pytest.mark.parametrize("one_launch", [False, True])
def test_cuda_graph_replay_is_byte_equal_to_eager_at_the_real_geometry(one_launch):
    """The decode step runs captured: a replay from the same inputs and states gives the eager call's bytes."""
    hk, hv, kd, vd, width = 16, 32, 128, 128, 4
    eager = make_layer(hk, hv, kd, vd, width, torch.bfloat16, seed=17)
    captured = clone_layer(eager)
    token = make_token(hk, hv, kd, vd, torch.bfloat16, seed=5, views=True)
    expect = step(gdn_decode_step, token, eager, hk, hv, kd, vd, one_launch=one_launch)
    saved, out = clone_layer(captured), torch.empty(hv * vd, device=DEVICE, dtype=torch.bfloat16)
    step(gdn_decode_step, token, captured, hk, hv, kd, vd, out=out, one_launch=one_launch)  # compile off-capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step(gdn_decode_step, token, captured, hk, hv, kd, vd, out=out, one_launch=one_launch)
    for name, t in captured.items():
        t.copy_(saved[name])
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, expect)
    assert torch.equal(captured["state"], eager["state"]) and torch.equal(captured["conv_state"], eager["conv_state"])
    ref = clone_layer(saved)
    close(out, step(gdn_decode_step_reference, token, ref, hk, hv, kd, vd), *BF16_TOL)


@pytest.mark.parametrize("hk, hv, kd, vd, width", SIZES[:2])
def test_the_state_loaded_before_the_wait_gives_the_same_bytes(hk, hv, kd, vd, width, monkeypatch):
    """gdn_decode.EARLY_STATE: the state tile loaded before the PDL wait (from L2); the output, the state and the
    conv state are the bytes of the plain order, over three consecutive tokens."""
    from qwenlocal.engine.kernels import gdn_decode

    results = []
    for early in (False, True):
        monkeypatch.setattr(gdn_decode, "EARLY_STATE", early)
        layer = make_layer(hk, hv, kd, vd, width, torch.bfloat16, 5)
        outs = [step(gdn_decode_step, make_token(hk, hv, kd, vd, torch.bfloat16, t), layer, hk, hv, kd, vd)
                for t in range(3)]
        results.append((outs, layer))
    (want, want_layer), (got, got_layer) = results
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert all(torch.equal(got_layer[n], want_layer[n]) for n in ("state", "conv_state"))


_COMPILE = r"""
import json
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from qwenlocal.engine.kernels import gdn_decode as g
fn, out = g.gdn_step_kernel, {}
for early in (False, True):
    sig = {n: "constexpr" for n in fn.arg_names}
    sig.update(qkv_ptr="*bf16", z_ptr="*bf16", b_ptr="*bf16", a_ptr="*bf16", cs_ptr="*bf16", cw_ptr="*bf16",
               nega_ptr="*fp32", dtb_ptr="*fp32", state_ptr="*fp32", normw_ptr="*bf16", o_ptr="*bf16",
               out_ptr="*bf16", counters_ptr="*bf16", cs_stride="i32", cw_stride="i32", key_dim="i32", K="i32",
               V="i32", REP="i32", HEADS_PER="i32", scale="fp32", eps="fp32")
    consts = dict(W=4, WF=4, HP=1, BK=128, BV=32, ONE_LAUNCH=False, DT=1, WDT=1, USE_GDC=True, TAIL=False, BVF=128,
                  FENCE=True, EARLY=early)
    k = triton.compile(ASTSource(fn, sig, consts), target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
    out[str(early)] = k.asm["ptx"]
print(json.dumps(out))
"""


def test_sm90_code_loads_the_state_before_the_wait_and_the_projections_after(tmp_path):
    from sass_support import sm90_json
    from test_down_preload import _split_loads

    out = sm90_json(_COMPILE, tmp_path)
    before, after = _split_loads(out["True"])
    assert before and all(".cg" in op for op in before), before  # the state, from L2
    assert after and not any(".cg" in op for op in after)  # q, k, v, z, b, a and the conv state: after the wait
    before, after = _split_loads(out["False"])
    assert not before and any(op.startswith("ld.global") for op in after)  # the negative control
