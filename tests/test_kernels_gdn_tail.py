"""GatedDeltaNet's decode step with the gated norm and the conv-state shift as the step kernel's tail
(gdn_decode_step counters=, the switch gdn_decode.NORM_SHIFT_TAIL) against the two-launch plan it replaces:
out, conv state and recurrent state byte for byte in the interpreter (on a GPU the norm's sum may be laid out
by the step's warps: an ulp of out), several tokens, the counters back at 0; a negative control (a key head's
q/k channels shifted before all its value heads have read them changes the bytes). The fused step with the
switch on: tests/test_decode_fused.py. Interpreter on the CPU, natively on a GPU."""
import pytest
import torch

pytest.importorskip("triton")

from qwenlocal.engine.kernels.gdn_decode import gdn_decode_step  # noqa: E402
from qwenlocal.engine.kernels.launch import new_counter  # noqa: E402
from test_kernels_gdn_decode import DEVICE, SIZES, clone_layer, make_layer, make_token, step  # noqa: E402


def _same_out(got, ref, dtype):
    if DEVICE == "cpu":
        assert torch.equal(got, ref)
    else:  # the norm's sum in another order: an ulp of the output dtype
        ulp = 2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -22
        assert ((got.float() - ref.float()).abs() <= 2 * ulp * ref.float().abs() + 1e-6).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("hk, hv, kd, vd, width", SIZES)
def test_the_tail_gives_the_bytes_of_the_two_launches(hk, hv, kd, vd, width, dtype, nan_empty):
    two = make_layer(hk, hv, kd, vd, width, dtype, seed=hk + vd)
    tail = clone_layer(two)
    counters = new_counter(two["state"].device, hv + hk)
    for t in range(3):  # states carried: each step reads what the last one shifted in
        token = make_token(hk, hv, kd, vd, dtype, seed=t, views=t == 1)
        ref = step(gdn_decode_step, token, two, hk, hv, kd, vd, one_launch=False, block_v=16)
        got = step(gdn_decode_step, token, tail, hk, hv, kd, vd, one_launch=False, block_v=16, counters=counters)
        _same_out(got, ref, dtype)
        assert torch.equal(tail["conv_state"], two["conv_state"]) and torch.equal(tail["state"], two["state"])
        assert not counters.any()


@pytest.mark.interpreter_order
def test_a_shift_before_every_reader_arrived_gives_other_bytes(nan_empty):
    """Negative control: key head 0's counter preset to 'all its value heads but one arrived': the first of its
    value heads to finish shifts its q/k channels while the other still has to read them."""
    hk, hv, kd, vd, width = SIZES[0]
    assert hv // hk >= 2
    two = make_layer(hk, hv, kd, vd, width, torch.float32, seed=3)
    early = clone_layer(two)
    token = make_token(hk, hv, kd, vd, torch.float32, seed=4)
    ref = step(gdn_decode_step, token, two, hk, hv, kd, vd, one_launch=False, block_v=16)
    counters = new_counter(two["state"].device, hv + hk)
    counters[hv] = hv // hk - 1
    got = step(gdn_decode_step, token, early, hk, hv, kd, vd, one_launch=False, block_v=16, counters=counters)
    assert not (torch.equal(got, ref) and torch.equal(early["state"], two["state"]))


def test_bad_counters_are_refused():
    hk, hv, kd, vd, width = SIZES[0]
    layer = make_layer(hk, hv, kd, vd, width, torch.float32, seed=5)
    token = make_token(hk, hv, kd, vd, torch.float32, seed=5)
    with pytest.raises(ValueError, match="counters"):
        step(gdn_decode_step, token, layer, hk, hv, kd, vd, counters=new_counter(layer["state"].device, hv))
