"""nvfp4_down_tiles: the MoE down projection with every expert of an output tile in one program, its outputs
TILE_SUMS' (the new residual and each tile's sum of squares) without the arrival tail. In Triton's interpreter on
awkward sizes (masked rows, masked groups, odd expert counts): the bytes of expert_down_parts' group path with
sums= at the same tile size, the plain math's values, the refusals, and the engine's step taking it in every
down launch with the group path's logits byte for byte. On a GPU (this file's CUDA run): the PTX path against
the plain one and the reference; the bf16-level / graph == eager gate is test_gpu_decode_fused's [dntiles]."""
import pytest
import torch

pytest.importorskip("triton")

from qwenlocal.engine.kernels import nvfp4_down_tiles, nvfp4_experts_parts  # noqa: E402
from qwenlocal.engine.kernels.launch import new_counter  # noqa: E402
from qwenlocal.engine.kernels.nvfp4_down_tiles import expert_down_tiles, expert_down_tiles_reference  # noqa: E402
from qwenlocal.engine.kernels.nvfp4_experts_parts import expert_down_parts  # noqa: E402
from test_down_preload import _case  # noqa: E402
from test_decode_fused import _engine, quantized_ckpt  # noqa: E402,F401 (the fixture, by name)
from test_kernels_nvfp4_experts_decode import DEVICE  # noqa: E402

CASES = [(160, 48, 12, 5, 16), (112, 80, 9, 3, 32), (96, 32, 33, 8, 8), (48, 16, 4, 1, 16)]  # H, I, E, k, block_m


def _x(hidden, seed):
    return torch.randn(1, hidden, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16).to(DEVICE)


@pytest.mark.parametrize("hidden, inter, experts, k, block_m", CASES)
def test_the_tiles_give_the_group_paths_residual_and_tile_sums(hidden, inter, experts, k, block_m):
    act, weights, ids, rows, _, extra, scale = _case(hidden, inter, experts, k, 41)
    x = _x(hidden, 42)
    # the plain forms of both (the interpreter's; on a GPU too, the group path's non-PTX form is its "fp16")
    want_x, want_sums = expert_down_parts(act, weights, ids, rows, hidden, inter, extra=extra, extra_scale=scale,
                                          groups=True, block_m=block_m, decode="fp16",
                                          sums=(x, new_counter(x.device, -(-hidden // block_m))))
    got_x, got_sums = expert_down_tiles(act, weights, ids, rows, hidden, inter, extra, scale, x, block_m=block_m,
                                        num_warps=2, decode="plain")
    assert got_sums.shape == want_sums.shape and got_sums.abs().sum() > 0
    if DEVICE == "cpu":  # one order of every sum in the interpreter
        assert torch.equal(got_x, want_x) and torch.equal(got_sums, want_sums)
    else:  # the tiles' layouts differ on a GPU: the row sums in another order
        assert torch.allclose(got_sums, want_sums, rtol=1e-4)
        assert (got_x.float() - want_x.float()).abs().max() <= 2 ** -7 * want_x.float().abs().max()


@pytest.mark.parametrize("hidden, inter, experts, k, block_m", CASES[:2])
def test_the_tiles_are_the_plain_math(hidden, inter, experts, k, block_m):
    act, weights, ids, rows, _, extra, scale = _case(hidden, inter, experts, k, 51)
    x = _x(hidden, 52)
    got_x, got_sums = expert_down_tiles(act, weights, ids, rows, hidden, inter, extra, scale, x, block_m=block_m)
    want_x, want_sums = expert_down_tiles_reference(act.cpu(), weights.cpu(), ids.cpu(), rows.cpu(), hidden, inter,
                                                    tuple(t.cpu() for t in extra), scale.cpu(), x.cpu(), block_m)
    got_x, got_sums = got_x.cpu().float(), got_sums.cpu()
    # each side rounds the parts' sum to bf16 once, then x + it: at most a bf16 rounding apart
    assert (got_x - want_x.float()).abs().max() <= 2 ** -7 * want_x.float().abs().max()
    assert torch.allclose(got_sums, want_sums, rtol=2e-2)


def test_without_a_gate_scale_and_with_no_routed_expert():
    hidden, inter, experts, k = 64, 32, 6, 3
    act, weights, ids, rows, _, extra, scale = _case(hidden, inter, experts, k, 61)
    x = _x(hidden, 62)
    for kw in (dict(), dict(none=True)):
        a, w, i = (act[k:], weights[:, :0], ids[:, :0]) if kw else (act, weights, ids)
        got_x, got_sums = expert_down_tiles(a, w, i, rows, hidden, inter, extra, None, x, block_m=16)
        want_x, want_sums = expert_down_tiles_reference(a.cpu(), w.cpu(), i.cpu(), rows.cpu(), hidden, inter,
                                                        tuple(t.cpu() for t in extra), None, x.cpu(), 16)
        assert (got_x.cpu().float() - want_x.float()).abs().max() <= 2 ** -7 * want_x.float().abs().max()
        assert torch.allclose(got_sums.cpu(), want_sums, rtol=2e-2)


def test_bad_operands_are_refused_before_the_launch():
    hidden, inter, experts, k = 64, 32, 6, 3
    act, weights, ids, rows, _, extra, scale = _case(hidden, inter, experts, k, 71)
    x = _x(hidden, 72)
    with pytest.raises(ValueError, match="act must be fp32"):
        expert_down_tiles(act[:k], weights, ids, rows, hidden, inter, extra, scale, x)
    with pytest.raises(ValueError, match="x must be"):
        expert_down_tiles(act, weights, ids, rows, hidden, inter, extra, scale, x.reshape(-1))
    with pytest.raises(ValueError, match="weights must hold"):
        expert_down_tiles(act, weights[:, :2], ids, rows, hidden, inter, extra, scale, x)
    with pytest.raises(ValueError, match="decode must be"):
        expert_down_tiles(act, weights, ids, rows, hidden, inter, extra, scale, x, decode="fp16")
    if DEVICE == "cpu":  # the PTX path's alignment is checked before the launch, wherever it would run
        with pytest.raises(ValueError, match="16-byte"):
            expert_down_tiles(act, weights, ids, rows[:, 4:], hidden, inter, extra, scale, x, decode="asm")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU tier's: Triton's interpreter runs the CPU engine's "
                    "fused kernels (the GPU tier's step gate is test_gpu_decode_fused's [dntiles])")
def test_every_down_launch_of_the_step_takes_it_and_the_logits_keep_their_bytes(quantized_ckpt,  # noqa: F811
                                                                                monkeypatch):
    """The engine's step (resident experts, gate/up routing itself, bf16 as on a GPU): with the switch every down
    launch of both decode steps is the tiles' launch (none of expert_down_parts'), and at the parts' tile size
    the logits are the group path's bytes."""
    ids = torch.randint(0, 600, (24 + 2,), generator=torch.Generator().manual_seed(9))
    eng = _engine(quantized_ckpt, True, dtype=torch.bfloat16)
    launches = []

    def spy(module, name):
        kernel = getattr(module, name)

        class Spy:
            def __getitem__(self, grid):
                return lambda *a, **k: launches.append(name) or kernel[grid](*a, **k)

        monkeypatch.setattr(module, name, Spy())

    spy(nvfp4_down_tiles, "expert_down_tiles_kernel")
    spy(nvfp4_experts_parts, "expert_down_parts_kernel")
    monkeypatch.setattr(nvfp4_experts_parts, "GROUPS", True)
    monkeypatch.setattr(nvfp4_down_tiles, "BLOCK_M", nvfp4_experts_parts.BLOCK_M)
    want = eng.score(ids, prefill=24)
    monkeypatch.setattr(nvfp4_down_tiles, "ON", True)
    got = eng.score(ids, prefill=24)
    layers = len(eng.model.layers)
    # the last layer's MoE has no next layer to leave its norm to: it keeps the parts launch
    parts, tiles = "expert_down_parts_kernel", "expert_down_tiles_kernel"
    assert launches == [parts] * 2 * layers + [tiles] * (layers - 1) + [parts] + [tiles] * (layers - 1) + [parts]
    assert torch.isfinite(got).all() and torch.equal(got, want)


def test_the_experts_found_before_the_wait_give_the_ids_bytes(monkeypatch):
    """EARLY (route= given): the programs find the k experts from the logits and load their rows before the PDL
    wait; the same bytes as reading route_topk's ids after it. Under a trace the trace's rows are taken (they
    differ from the logits' top-k here), the ranks still found."""
    hidden, inter, experts, k = 144, 48, 20, 5
    act, weights, ids, rows, logits, extra, scale = _case(hidden, inter, experts, k, 81)
    x = _x(hidden, 82)
    trace = torch.tensor([[7, 3, 19, 3, 0]], device=DEVICE)
    for chosen, traced in ((ids, False), (trace, True)):
        call = lambda: expert_down_tiles(act, weights, chosen, rows, hidden, inter, extra, scale, x,  # noqa: E731
                                         block_m=16, route=(logits, experts, traced))
        monkeypatch.setattr(nvfp4_down_tiles, "EARLY", False)
        want = call()
        monkeypatch.setattr(nvfp4_down_tiles, "EARLY", True)
        got = call()
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]) and got[1].abs().sum() > 0
    assert not torch.equal(trace, ids)
    with pytest.raises(ValueError, match="route's logits"):
        expert_down_tiles(act, weights, ids, rows, hidden, inter, extra, scale, x, route=(logits[:-1], experts, False))


_COMPILE = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from qwenlocal.engine.kernels import nvfp4_down_tiles as d
fn, out = d.expert_down_tiles_kernel, {}
for early in (0, 1, 2):
    sig = {n: "constexpr" for n in fn.arg_names}
    sig.update(act_ptr="*fp32", wts_ptr="*bf16", ids_ptr="*i64", words_ptr="*i32", bytes_ptr="*u8", xd_w="*i32",
               xd_s="*u8", xd_g="*fp32", extra_scale_ptr="*fp32", x_ptr="*bf16", new_x_out_ptr="*i16",
               sums_ptr="*fp32", I="i32", H="i32", row_words="i32", dn_at="i32", dn_scale_at="i32", glob_at="i32")
    consts = dict(K_ROUTED=8, KP=8, HAS_EXTRA_SCALE=True, BLOCK_M=4, BLOCK_G=32, DECODE="asm", ROUND=1, USE_GDC=True,
                  EARLY_ROUTE=early, BLOCK_E=256)
    if early:
        sig.update(logits_ptr="*bf16", E="i32")
    else:
        consts.update(logits_ptr=None, E=0)
    k = triton.compile(ASTSource(fn, sig, consts), target=GPUTarget("cuda", 90, 32), options=dict(num_warps=2))
    out[early] = k.asm["ptx"]
print(json.dumps(out))
"""


def test_sm90_code_loads_the_rows_before_the_wait_and_the_activations_after(tmp_path):
    from sass_support import sm90_json
    from test_down_preload import _split_loads

    out = sm90_json(_COMPILE, tmp_path)
    for early in ("1", "2"):
        before, after = _split_loads(out[early])
        # the logits (from L2), the code words and the scale bytes before the wait; the activations after it
        assert any(".cg" in op for op in before), before
        assert "ld.global.v2.b32" in before and "ld.global.u8" in before, before
        assert "ld.global.v4.f32" in after and "ld.global.v4.f32" not in before
        assert "ld.global.v2.b32" not in after and "ld.global.u8" not in after, after
    # the negative control: without the early route nothing is loaded before the wait
    before, after = _split_loads(out["0"])
    assert not before and "ld.global.v2.b32" in after
