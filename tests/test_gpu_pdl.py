"""Programmatic dependent launch (engine/kernels/launch.py), GPU only (sm_90+): a kernel launched with PDL
that begins with gdc_prologue sees every write of the kernel before it; the negative control, the same reader
without griddepcontrol.wait, starts while the writer still runs and reads the stale value."""
import pytest
import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents

from qwenlocal.engine.kernels.launch import gdc_prologue, pdl_launch, programmatic_launch

pytestmark = pytest.mark.gpu


@triton.jit
def _slow_writer(flag_ptr, spins, USE_GDC: tl.constexpr):
    gdc_launch_dependents()  # let the reader be scheduled at once: the test wants it running beside this
    acc = tl.load(flag_ptr + 1)
    for _ in range(spins):  # ~tens of microseconds of dependent arithmetic before the write
        acc = acc * 0.999999 + 1e-7
    tl.store(flag_ptr, 1.0 + acc * 0.0)


@triton.jit
def _reader(flag_ptr, out_ptr, WAIT: tl.constexpr):
    if WAIT:
        gdc_prologue(True)
    else:
        gdc_launch_dependents()  # the control: no griddepcontrol.wait
    tl.store(out_ptr, tl.load(flag_ptr))


def _run(wait: bool) -> float:
    flag = torch.zeros(2, device="cuda")
    out = torch.full((1,), -1.0, device="cuda")
    _slow_writer[(1,)](flag, 2_000_000, USE_GDC=True)
    _reader[(1,)](flag, out, WAIT=wait, launch_pdl=True)
    torch.cuda.synchronize()
    return float(out)


def test_pdl_reader_sees_the_writer_and_the_control_does_not():
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("programmatic dependent launch needs sm_90+")
    assert all(_run(True) == 1.0 for _ in range(5))
    stale = [_run(False) for _ in range(5)]
    assert 0.0 in stale, f"without the wait the reader should run beside the writer and read 0.0, got {stale}"


def test_pdl_launch_arguments_follow_the_context_and_the_device():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert pdl_launch(cuda) == {"USE_GDC": False}
    with programmatic_launch(True):
        assert pdl_launch(cuda) == {"USE_GDC": True, "launch_pdl": True}
        assert pdl_launch(cpu) == {"USE_GDC": False}  # the interpreter has no griddepcontrol
        with programmatic_launch(False):
            assert pdl_launch(cuda) == {"USE_GDC": False}
    assert pdl_launch(cuda) == {"USE_GDC": False}
