"""The fused batch-1 decode step against the unfused one it replaces, on the CPU in Triton's interpreter: the
same checkpoint (NVFP4 experts and FP8/NVFP4 linears kept in their bytes, as on a GPU), the same prefill, then
decode steps through each path. fp32 on both sides: the fused kernels dequantize the same codes, so the logits
agree to fp32 rounding, and the GDN/KV states carried across steps agree too."""
import dataclasses

import pytest
import torch

pytest.importorskip("triton")

from qwenlocal.engine import Engine  # noqa: E402
from qwenlocal.engine.offload.overlap import DecodeOverlap  # noqa: E402
from qwenlocal.engine.quant.convert import quantize_checkpoint  # noqa: E402
from test_overlap import FakeStreams  # noqa: E402

CHUNK = 16


@pytest.fixture(scope="module")
def quantized_ckpt(tiny_ckpt, tmp_path_factory):
    return quantize_checkpoint(tiny_ckpt, tmp_path_factory.mktemp("fused-decode"))


def _engine(ckpt, fused: bool, split: str = "off", dtype=None, **opts):
    eng = Engine.from_pretrained(ckpt, device="cpu", dtype=dtype,
                                 options={"prefill_chunk": CHUNK, "expert_format": "nvfp4", "linear_format": "native",
                                          **opts})
    if fused:  # the CPU refuses decode_kernels=fused (too slow for users); the test drives the kernels anyway
        eng.model.kernels = dataclasses.replace(eng.model.kernels, fused_decode=True)
    if split != "off":  # the shared expert apart from the routed kernels (its GPU path beside the miss copy)
        overlap = DecodeOverlap(split, FakeStreams())
        eng.model.overlap = overlap
        for layer in eng.model.layers:
            layer.moe.overlap = overlap
    return eng


def _check(ckpt, steps: int, split: str = "off", **opts):
    ids = torch.randint(0, 600, (24 + steps,), generator=torch.Generator().manual_seed(3))
    ref = _engine(ckpt, False, **opts).score(ids, prefill=24)
    got = _engine(ckpt, True, split, **opts).score(ids, prefill=24)
    assert torch.isfinite(got).all()
    tail, ref_tail = got[24:], ref[24:]
    err = (tail - ref_tail).abs().max() / ref_tail.abs().max()
    assert err < 1e-4, f"fused decode differs from the unfused step by {err:.2e} (relative to the largest logit)"
    assert torch.equal(got[:24], ref[:24])  # prefill is the same path on both
    assert (tail.argmax(-1) == ref_tail.argmax(-1)).all()


def test_fused_decode_matches_the_unfused_step_on_a_quantized_checkpoint(quantized_ckpt):
    _check(quantized_ckpt, steps=3)


def test_fused_decode_matches_with_offloaded_experts_and_the_shared_expert_apart(quantized_ckpt):
    """Also under a benchmark routing trace: the fused step gathers every layer's trace row in one launch
    (RoutingTrace.one_token_ids), the unfused one per layer; the same ids either way."""
    _check(quantized_ckpt, steps=2, split="copy-side", expert_slots=12, routing={"seed": 5, "length": 7})


def test_fused_decode_matches_on_a_bf16_checkpoint(tiny_ckpt):
    """Plain weights and dense experts: the fused norms, projections, router, GDN step and attention prologue
    with the unfused expert kernels."""
    _check(tiny_ckpt, steps=2, expert_format="auto", linear_format="auto")


def test_fused_decode_with_the_shared_expert_apart_is_byte_equal_to_serial(quantized_ckpt):
    """The overlap's shared expert apart (same kernels' programs, ids [1, 0]) gives the serial step's bytes.
    One split here: on the CPU both run the same calls in the same order (FakeStreams); the GPU tier
    (test_gpu_overlap.py) runs both splits on real streams."""
    ids = torch.randint(0, 600, (24 + 2,), generator=torch.Generator().manual_seed(4))
    serial = _engine(quantized_ckpt, True, expert_slots=12).score(ids, prefill=24)
    apart = _engine(quantized_ckpt, True, "copy-side", expert_slots=12).score(ids, prefill=24)
    assert torch.equal(serial, apart)


def test_every_one_launch_tail_together_gives_the_same_logits(quantized_ckpt, monkeypatch):
    """The four tail switches and the two-format GEMV at once (router top-k in its GEMV, the post-mixer norm in
    out_proj / o_proj, the next norm in the MoE down projection, GDN's norm and shift in its step, in_proj_b + a
    in the FP8 in_proj launch): in the interpreter each is the same bytes (tests/test_kernels_*.py), so together
    they are too; each runs at every layer of every step (counted), three steps carry every state and counter."""
    from qwenlocal.engine.kernels import gdn_decode, gemv_mixed, gemv_norm, parts_norm, router_gemv
    from qwenlocal.engine.model import decode_fused, moe_fused

    steps = 3
    ids = torch.randint(0, 600, (24 + steps,), generator=torch.Generator().manual_seed(5))
    monkeypatch.setattr(gemv_mixed, "MIXED", False)  # on by default: "off" is every switch off
    monkeypatch.setattr(parts_norm, "TILE_SUMS", False)  # on by default; partsnorm's tail takes the norm here
    off = _engine(quantized_ckpt, True).score(ids, prefill=24)
    for module, attr in ((router_gemv, "FUSED"), (gemv_norm, "FUSED"), (parts_norm, "FUSED"),
                         (gdn_decode, "NORM_SHIFT_TAIL"), (gemv_mixed, "MIXED")):
        monkeypatch.setattr(module, attr, True)
    calls = {name: 0 for name in ("router", "gemvnorm", "partsnorm", "gdntail", "mixed")}

    def counting(name, fn, when=lambda *a, **kw: True):
        def wrapped(*args, **kwargs):
            out = fn(*args, **kwargs)
            calls[name] += bool(when(out, *args, **kwargs))
            return out
        return wrapped

    monkeypatch.setattr(router_gemv, "router_topk", counting("router", router_gemv.router_topk))
    monkeypatch.setattr(gemv_norm, "gemv_add_rms_norm", counting("gemvnorm", gemv_norm.gemv_add_rms_norm))
    monkeypatch.setattr(moe_fused, "_norm_tail", counting("partsnorm", moe_fused._norm_tail,
                                                          lambda out, *a, **kw: out is not None))
    monkeypatch.setattr(decode_fused, "gdn_decode_step", counting(
        "gdntail", decode_fused.gdn_decode_step, lambda out, *a, **kw: kw.get("counters") is not None))
    monkeypatch.setattr(gemv_mixed, "gemv_two_formats", counting("mixed", gemv_mixed.gemv_two_formats))
    eng = _engine(quantized_ckpt, True)
    on = eng.score(ids, prefill=24)
    assert torch.isfinite(on).all() and torch.equal(on, off)
    layers = len(eng.model.layers)
    gdn_layers = sum(not layer.is_attention for layer in eng.model.layers)
    assert gdn_layers > 0
    assert calls == {"router": steps * layers, "gemvnorm": steps * layers, "partsnorm": steps * layers,
                     "gdntail": steps * gdn_layers, "mixed": steps * gdn_layers}


def test_the_router_doing_the_post_mixer_norm_matches_the_unfused_step(quantized_ckpt, monkeypatch):
    """router_norm.FUSED: every layer's post-mixer add + RMSNorm runs in the router's launch (counted), the
    separate launch is gone (one add_rms_norm fewer a layer a step), and the step still matches the unfused one
    (the router's logits sum in another order: fp32 rounding)."""
    from qwenlocal.engine.config import load_model_config
    from qwenlocal.engine.kernels import parts_norm, router_norm
    from qwenlocal.engine.model import decode_fused

    monkeypatch.setattr(router_norm, "FUSED", True)
    monkeypatch.setattr(parts_norm, "TILE_SUMS", False)  # each layer's input norm its own launch, counted below
    calls = {"router_norm": 0, "add_rms_norm": 0}

    def counting(name, fn):
        def wrapped(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(router_norm, "router_norm", counting("router_norm", router_norm.router_norm))
    monkeypatch.setattr(decode_fused, "add_rms_norm", counting("add_rms_norm", decode_fused.add_rms_norm))
    steps = 3
    _check(quantized_ckpt, steps=steps)
    layers = load_model_config(quantized_ckpt).num_layers
    # Per step: one input norm a layer and the final norm; the post-mixer ones are the router's.
    assert calls == {"router_norm": steps * layers, "add_rms_norm": steps * (layers + 1)}


@pytest.mark.parametrize("what", ["route", "prenorm", "normshift", "prologue"])
def test_a_dropped_launch_of_the_profile_ceilings_changes_the_step(quantized_ckpt, monkeypatch, what):
    """decode_fused.DROP (scripts/profile_decode.py's drop-X arms, a ceiling of what removing a launch gives):
    the step still runs, and its logits change (the launch really is left out)."""
    from qwenlocal.engine.model import decode_fused

    ids = torch.randint(0, 600, (24 + 1,), generator=torch.Generator().manual_seed(6))
    full = _engine(quantized_ckpt, True).score(ids, prefill=24)
    monkeypatch.setattr(decode_fused, "DROP", frozenset({what}))
    dropped = _engine(quantized_ckpt, True).score(ids, prefill=24)
    assert torch.isfinite(dropped).all() and torch.equal(full[:24], dropped[:24])
    assert not torch.equal(full[24:], dropped[24:])


def test_the_next_norm_in_the_down_launch_and_the_first_gemv_keeps_the_step(quantized_ckpt, monkeypatch):
    """parts_norm.TILE_SUMS: the MoE down launch leaves the new residual and its tiles' sums of squares, the next
    layer's first GEMV norms x as it loads it; add_rms_norm then runs twice a step (the first layer's input, the
    final norm), and the logits stay within fp32 rounding of the switch off (rstd's sum in another order). With
    the shared expert apart (the overlap's split), the bytes of the serial launch."""
    from qwenlocal.engine.kernels import parts_norm
    from qwenlocal.engine.model import decode_fused

    ids = torch.randint(0, 600, (24 + 2,), generator=torch.Generator().manual_seed(10))
    monkeypatch.setattr(parts_norm, "TILE_SUMS", False)
    off = _engine(quantized_ckpt, True, expert_slots=12).score(ids, prefill=24)
    monkeypatch.setattr(parts_norm, "TILE_SUMS", True)
    calls = []
    real = decode_fused.add_rms_norm
    monkeypatch.setattr(decode_fused, "add_rms_norm", lambda *a, **k: calls.append(1) or real(*a, **k))
    on = _engine(quantized_ckpt, True, expert_slots=12).score(ids, prefill=24)
    assert len(calls) == 2 * 2  # two decode steps
    assert torch.equal(on[:24], off[:24])
    assert ((on[24:] - off[24:]).abs().max() / off[24:].abs().max()) < 1e-5
    assert (on[24:].argmax(-1) == off[24:].argmax(-1)).all()
    apart = _engine(quantized_ckpt, True, "copy-side", expert_slots=12).score(ids, prefill=24)
    assert torch.equal(apart, on)


def test_the_down_launchs_tile_is_read_at_the_call(quantized_ckpt, monkeypatch):
    """nvfp4_experts_parts.BLOCK_M (profile_decode's arm value downbm) set after import reaches the step's down
    launches and their tile-sum counters: 8 rows a program gives the 16-row step's logits within fp32 rounding
    (the tiles' sums of squares added in other groups), the same argmax."""
    from qwenlocal.engine.kernels import nvfp4_experts_parts

    ids = torch.randint(0, 600, (24 + 2,), generator=torch.Generator().manual_seed(12))
    default = _engine(quantized_ckpt, True).score(ids, prefill=24)
    monkeypatch.setattr(nvfp4_experts_parts, "BLOCK_M", 8)
    grids, real = [], nvfp4_experts_parts.expert_down_parts_kernel

    class Spy:  # each launch's grid and tile
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                grids.append((grid[0], kwargs["BLOCK_M"]))
                return real[grid](*args, **kwargs)
            return launch
    monkeypatch.setattr(nvfp4_experts_parts, "expert_down_parts_kernel", Spy())
    eng = _engine(quantized_ckpt, True)
    eight = eng.score(ids, prefill=24)
    hidden = eng.model.layers[0].moe.hidden
    assert grids and all(g == (hidden // 8, 8) for g in grids)
    assert ((eight[24:] - default[24:]).abs().max() / default[24:].abs().max()) < 1e-5
    assert (eight[24:].argmax(-1) == default[24:].argmax(-1)).all()
