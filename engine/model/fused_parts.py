"""What the fused decode step's pieces share (decode_fused.py: the layers' mixers and the step; moe_fused.py: the
MoE): the merged projection of one input through several linears in their stored formats (project), the layer
input whose RMSNorm its first GEMV applies (DeferredNorm), a call site's arrival counters made once, and the
diagnostics' stand-in outputs."""
from __future__ import annotations

import dataclasses

import torch

from ..kernels import gemv_mixed
from ..kernels.gemv_multi import gemv_multi
from ..kernels.launch import new_counter
from ..quant.linear import QuantLinear


def stand_in(owner, name: str, make):
    """A stand-in tensor for a dropped launch's output (decode_fused.DROP), made on the first (eager) call, never
    inside a capture."""
    t = getattr(owner, name, None)
    if t is None:
        t = make()
        setattr(owner, name, t)
    return t


def weight_format(weight) -> str:
    return weight.fmt if isinstance(weight, QuantLinear) else "dense"


@dataclasses.dataclass(frozen=True)
class DeferredNorm:
    """A layer's input whose RMSNorm is left to its first GEMV (parts_norm.TILE_SUMS): the residual x [1, H], its
    tiles' sums of squares (the MoE down launch's), the norm's weight and eps. project() passes it as norm=."""
    x: torch.Tensor
    sums: torch.Tensor
    weight: torch.Tensor
    eps: float

    @property
    def device(self) -> torch.device:
        return self.x.device


def project(x, weights, out_dtype: torch.dtype | None = None) -> list[torch.Tensor]:
    """x [1, K] (or a DeferredNorm: normed as the GEMV loads it) through several linears of the same input: one
    launch per run of equal-format weights (stored formats kept: FP8/NVFP4 bytes or plain), or one for two runs
    (gemv_mixed.MIXED), returned as [1, N_i] views in order."""
    norm = None
    if isinstance(x, DeferredNorm):
        x, norm = x.x, (x.sums, x.weight, x.eps)
    runs: list[list] = []
    for w in weights:
        if runs and weight_format(runs[-1][0]) == weight_format(w):
            runs[-1].append(w)
        else:
            runs.append([w])
    if gemv_mixed.MIXED and len(runs) == 2 and max(map(len, runs)) <= gemv_mixed.MAX_PARTS:  # one launch
        y = gemv_mixed.gemv_two_formats(x, runs[0], runs[1], out_dtype=out_dtype, norm=norm)
        return list(y.split([out_features(w) for w in weights], dim=-1))
    views: list[torch.Tensor] = []
    for group in runs:
        y = gemv_multi(x, group, out_dtype=out_dtype, norm=norm)
        views.extend(y.split([out_features(w) for w in group], dim=-1))
    return views


def counters_for(owner, name: str, device: torch.device, n: int = 1) -> torch.Tensor:
    """owner's arrival counters for one call site's one-launch tail (launch.last_to_arrive), made on its first
    call: an eager or warm-up step, never inside a capture (new_counter refuses that)."""
    counters = getattr(owner, name, None)
    if counters is None:
        counters = new_counter(device, n)
        setattr(owner, name, counters)
    return counters


def out_features(weight) -> int:
    return weight.out_features if isinstance(weight, QuantLinear) else weight.shape[0]
