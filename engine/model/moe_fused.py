"""The fused decode step's MoE (decode_fused.py calls moe_decode once a layer): the router with the post-mixer
RMSNorm in its launch (router_norm), the top-k tail (route_topk, or the integer gate/up's programs routing
themselves: nvfp4_int_experts.ROUTE), the slots ensured and the misses copied where the experts are offloaded,
then the routed experts and the shared one over NVFP4 bytes in two launches (gate/up, then the down rows
leaving a part per expert, their sum and the next layer's input norm by the down launch's per-tile tails:
parts_norm.TILE_SUMS), serially or with the shared expert apart beside the miss copy (the decode overlap's
split). Dense experts (the BF16 checkpoint) take the fused router and the unfused expert kernels."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton

from ..kernels import (gemv_norm, nvfp4_experts_parts, nvfp4_hilo, nvfp4_int_dot, nvfp4_int_experts,
                       nvfp4_mma_experts, parts_norm, router_gemv, router_norm, slot_ensure)
from ..kernels.decode_fused import route_topk
from ..kernels.gemv_multi import gemv_multi
from ..kernels.nvfp4_experts_decode import expert_gate_up, nvfp4_triples
from ..kernels.nvfp4_experts_parts import expert_down_parts
from ..kernels.route_keys import MAX_EXPERTS
from ..quant.linear import QuantLinear
from ..quant.scheme import NVFP4
from .fused_parts import DeferredNorm, counters_for, project, stand_in, weight_format
from ..offload.experts import OffloadedExperts
from .moe import ResidentExperts
from .ops import swiglu

if TYPE_CHECKING:
    from .moe import SparseMoE


def _dropped_route(moe: "SparseMoE", h: torch.Tensor):
    """Fixed weights, ids and shared scale for the drop-route ceiling (decode_fused.DROP)."""
    k, dev = moe.top_k, h.device
    return (stand_in(moe, "drop_weights", lambda: torch.full((1, k), 1.0 / k, device=dev, dtype=h.dtype)),
            stand_in(moe, "drop_ids", lambda: torch.arange(k, device=dev).reshape(1, k)),
            stand_in(moe, "drop_scale", lambda: torch.full((1,), 0.5, device=dev)))


def _nvfp4_shared(moe: "SparseMoE") -> bool:
    """The shared expert can ride in the routed experts' kernels: NVFP4 bytes, the routed experts' sizes."""
    return (all(isinstance(w, QuantLinear) and w.fmt == NVFP4 for w in moe.shared)
            and moe.shared[0].out_features == moe.inter)


def _route(moe: "SparseMoE", h: torch.Tensor, drop_route: bool = False):
    """(weights, ids, shared_scale) of this token: the router + shared-expert gate in one GEMV, then the tail."""
    gates = [moe.router_w, moe.shared_gate]
    if drop_route:
        gemv_multi(h, gates)
        return _dropped_route(moe, h)
    plain = all(weight_format(g) == "dense" and g.dtype == h.dtype for g in gates)
    if router_gemv.FUSED and plain:  # one launch: the tail in the GEMV's last program (the same bytes)
        return router_gemv.router_topk(h, *gates, moe.top_k, h.dtype, counters_for(moe, "route_counter", h.device))
    # Logits in the compute dtype, as the unfused router's F.linear gives them (top-k then agrees on near-ties).
    if weight_format(gates[0]) == weight_format(gates[1]):  # always so in the known checkpoints (both BF16): one launch
        router_logits = gemv_multi(h, gates)
    else:
        router_logits = torch.cat(project(h, gates), dim=-1)
    return route_topk(router_logits.reshape(-1), moe.router_w.shape[0], moe.top_k, h.dtype)


def _norm_tail(moe: "SparseMoE", next_norm: tuple | None, hidden: int) -> tuple | None:
    """expert_down_parts' norm= for the next residual add + RMSNorm (parts_norm.FUSED), with this layer's
    counters (made on the first, eager, call: never inside a capture)."""
    if not parts_norm.FUSED or next_norm is None:
        return None
    tiles = triton.cdiv(hidden, nvfp4_experts_parts.BLOCK_M)
    return (*next_norm, counters_for(moe, "norm_counters", next_norm[0].device, tiles + 1))


def _sums_tail(moe: "SparseMoE", next_norm: tuple | None, hidden: int) -> tuple | None:
    """expert_down_parts' sums= (parts_norm.TILE_SUMS, next_norm = (x, norm_w, eps) of a next layer): the new
    residual and its tiles' sums of squares, the norm left to that layer's first GEMV."""
    if not parts_norm.TILE_SUMS or next_norm is None:
        return None
    tiles = triton.cdiv(hidden, nvfp4_experts_parts.BLOCK_M)
    return next_norm[0], counters_for(moe, "sum_counters", next_norm[0].device, tiles)


def _deferred(result, next_norm: tuple) -> tuple:
    """expert_down_parts' (new_x, tile sums) as moe_decode's (new_x, the next layer's DeferredNorm input)."""
    new_x, sums = result
    return new_x, DeferredNorm(new_x, sums, next_norm[1], next_norm[2])


def router_takes_the_norm(moe: "SparseMoE", x: torch.Tensor) -> bool:
    """router_norm.FUSED and plain router + shared-gate weights in x's dtype: the post-mixer add + RMSNorm is
    done by the router GEMV's programs (kernels/router_norm.py), not by a launch of its own."""
    return (router_norm.FUSED and not gemv_norm.FUSED
            and all(weight_format(g) == "dense" and g.dtype == x.dtype for g in (moe.router_w, moe.shared_gate)))


def _route_with_norm(moe: "SparseMoE", pending: tuple, drop_route: bool = False):
    """(weights, ids, shared_scale, new_x, normed, xq, route): pending = (x, mixer delta, post_norm, eps) normed
    by the router's programs, then route_topk's tail on their logits; xq: the normed row's int16 blocks where the
    experts' gate/up takes them (_int_gate_up), else None; route: route= for a later launch that does
    route_topk's work, the integer gate/up's (routes_itself) or the slot cache's ensure (routes_in_ensure), else
    None; weights, ids and shared_scale are then the empty tensors it fills."""
    quantize = ("hilo" if _mma_gate_up(moe, pending[0]) else True) if _int_gate_up(moe) else False
    out = router_norm.router_norm(*pending, moe.router_w, moe.shared_gate, quantize=quantize)
    new_x, h, router_logits = out[:3]
    xq = out[3] if quantize else None
    # Shared gate/up on a side stream (sharedearly) lost 1.06x the step (docs/RESULTS.md session 21); history: 52f5195
    if drop_route:
        return (*_dropped_route(moe, h), new_x, h, xq, None)
    if routes_itself(moe, router_logits) or routes_in_ensure(moe, router_logits):  # a later launch routes
        k = moe.top_k
        weights = torch.empty(1, k, device=h.device, dtype=h.dtype)
        ids = torch.empty(1, k, device=h.device, dtype=torch.int64)
        shared_scale = torch.empty(1, device=h.device, dtype=torch.float32)
        route = (router_logits.reshape(-1), moe.router_w.shape[0], weights, ids, shared_scale)
        return weights, ids, shared_scale, new_x, h, xq, route
    weights, ids, shared_scale = route_topk(router_logits.reshape(-1), moe.router_w.shape[0], moe.top_k, h.dtype)
    return weights, ids, shared_scale, new_x, h, xq, None


def routes_itself(moe: "SparseMoE", logits: torch.Tensor) -> bool:
    """The integer gate/up's programs find their own experts from the router's logits (nvfp4_int_experts.ROUTE;
    no route_topk launch): the experts resident (no slot map to ensure first), the integer gate/up with the
    shared expert in the experts' kernels, the overlap's split off, 16-bit logits."""
    return (nvfp4_int_experts.ROUTE and isinstance(moe.experts, ResidentExperts) and _int_gate_up(moe)
            and _nvfp4_shared(moe) and moe.overlap.split == "off"
            and logits.dtype in (torch.bfloat16, torch.float16) and moe.router_w.shape[0] <= MAX_EXPERTS)


def routes_in_ensure(moe: "SparseMoE", logits: torch.Tensor) -> bool:
    """The slot cache's ensure launch does route_topk's work first (slot_ensure.ROUTE; no route_topk launch): the
    experts offloaded to slots with the one-launch ensure, 16-bit logits."""
    return (slot_ensure.ROUTE and isinstance(moe.experts, OffloadedExperts) and moe.experts.cache.one_launch_ensure
            and logits.dtype in (torch.bfloat16, torch.float16) and moe.router_w.shape[0] <= MAX_EXPERTS)


def _int_gate_up(moe: "SparseMoE") -> bool:
    """The NVFP4 experts' gate/up as integer dots (nvfp4_int_experts.ON) for this layer."""
    return nvfp4_int_experts.ON and moe.experts.fmt == "nvfp4" and moe.hidden % 16 == 0


def _mma_gate_up(moe: "SparseMoE", x: torch.Tensor) -> bool:
    """The integer gate/up on the tensor cores (nvfp4_mma_experts.ON) for this layer: x then comes as its high
    and low bytes (nvfp4_hilo.quantize_hilo), not as int16 pairs."""
    return _int_gate_up(moe) and nvfp4_mma_experts.takes(moe.hidden, x.device)


def moe_decode(moe: "SparseMoE", h: torch.Tensor | None, trace_ids: torch.Tensor | None = None,
               next_norm: tuple | None = None, pending: tuple | None = None, defer_norm: bool = False,
               drop_route: bool = False):
    """The MoE's output as a delta for the next add_rms_norm (a tensor, or fp32 parts [k + 1, 1, H]), or, where
    next_norm = (x, norm_w, eps) is given and the down projection can take it (parts_norm.FUSED, serial NVFP4
    launch), that norm already done: (new_x, normed). trace_ids: this layer's row of a benchmark routing trace
    (RoutingTrace.one_token_ids), replacing the router's ids (its weights are kept). pending = (x, mixer delta,
    post_norm, eps) instead of h (router_takes_the_norm): the router's launch does the post-mixer norm, and the
    result is (new_x, the above), next_norm's x replaced by new_x. defer_norm (next_norm is a next layer's
    input norm, parts_norm.TILE_SUMS on, an NVFP4 parts launch): (new_x, DeferredNorm) instead of (new_x, normed).
    drop_route: the drop-route ceiling (decode_fused.DROP): fixed weights and ids, no top-k launch."""
    if pending is not None:
        weights, ids, shared_scale, new_x, h, xq, route = _route_with_norm(moe, pending, drop_route)
        if next_norm is not None:
            next_norm = (new_x, *next_norm[1:])
        return new_x, _moe_after_route(moe, h, weights, ids, shared_scale, trace_ids, next_norm, defer_norm, xq,
                                       route)
    weights, ids, shared_scale = _route(moe, h, drop_route)
    return _moe_after_route(moe, h, weights, ids, shared_scale, trace_ids, next_norm, defer_norm)


def _gate_up(moe: "SparseMoE", h: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor, extra,
             xq: tuple | None = None, route: tuple | None = None, trace_ids: torch.Tensor | None = None):
    """expert_gate_up's act: as integer dots where xq (h's int16 blocks, _int_gate_up) is given, else the float
    kernel. route: the integer launch's programs route themselves (routes_itself; ids are then route's, filled by
    it), with a benchmark's trace_ids as their rows where given."""
    if xq is not None and _mma_gate_up(moe, h):  # xq: h's high / low bytes
        if route is not None:
            return nvfp4_mma_experts.expert_gate_up_mma(h, trace_ids, rows, moe.hidden, moe.inter, extra, xq=xq,
                                                        route=route)
        return nvfp4_mma_experts.expert_gate_up_mma(h, ids, rows, moe.hidden, moe.inter, extra, xq=xq)
    if route is not None:
        return nvfp4_int_experts.expert_gate_up_int(h, trace_ids, rows, moe.hidden, moe.inter, extra, xq=xq,
                                                    route=route)
    if xq is not None:
        return nvfp4_int_experts.expert_gate_up_int(h, ids, rows, moe.hidden, moe.inter, extra, xq=xq)
    return expert_gate_up(h, ids, rows, moe.hidden, moe.inter, extra=extra)


def _moe_after_route(moe: "SparseMoE", h: torch.Tensor, weights, ids, shared_scale, trace_ids, next_norm,
                     defer_norm: bool = False, xq: tuple | None = None, route: tuple | None = None):
    """moe_decode after the router: the experts (and the shared one) of this token. xq: h's int16 blocks where
    the router's launch made them (the integer gate/up; made here otherwise). route: a later launch does
    route_topk's work, filling weights, ids and shared_scale before the down launch reads them: the slot cache's
    ensure where the experts are offloaded (routes_in_ensure), else the integer gate/up (routes_itself)."""
    sums = _sums_tail(moe, next_norm, moe.hidden) if defer_norm else None
    if trace_ids is not None:  # forward gathers them for every layer (model.routing is every layer's moe.routing)
        ids = trace_ids
    if route is not None and not isinstance(moe.experts, ResidentExperts):  # the ensure's launch routes
        slots, expert_weights, copy = moe.experts.for_decode(trace_ids, route=route)
        route = None
    else:
        slots, expert_weights, copy = moe.experts.for_decode(ids)
    cfg_h, cfg_i = moe.hidden, moe.inter
    if moe.experts.fmt == "nvfp4" and _nvfp4_shared(moe):
        if xq is None and _int_gate_up(moe):  # no router_norm launch made them: one launch here
            xq = (nvfp4_hilo.quantize_hilo if _mma_gate_up(moe, h) else nvfp4_int_dot.quantize_x16)(h.reshape(-1))
        gate, up, down_extra = nvfp4_triples(*moe.shared)
        gate_up_extra = gate + up
        rows = expert_weights[0]
        # The down projection leaves one fp32 part per expert ([k + 1, 1, H]); the next add_rms_norm sums them.
        if moe.overlap.split == "off":
            copy()
            act = _gate_up(moe, h, slots, rows, gate_up_extra, xq, route=route, trace_ids=trace_ids)
            # where gate/up routed itself, the down launch may too (nvfp4_experts_parts.ROUTE)
            down_route = None if route is None else (route[0], route[1], trace_ids is not None)
            if sums is not None:  # the next norm left to the next layer's first GEMV
                return _deferred(expert_down_parts(act, weights, slots, rows, cfg_h, cfg_i, extra=down_extra,
                                                   extra_scale=shared_scale, sums=sums, route=down_route), next_norm)
            return expert_down_parts(act, weights, slots, rows, cfg_h, cfg_i, extra=down_extra,
                                     extra_scale=shared_scale, norm=_norm_tail(moe, next_norm, cfg_h),
                                     route=down_route)
        # The shared expert apart (on its stream beside the miss copy): the same two kernels' programs with no
        # routed experts, writing the last part, so the bytes are those of the serial launch.
        k = slots.shape[-1]
        parts = torch.empty(k + 1, 1, cfg_h, device=h.device, dtype=torch.float32)
        none = slots[:, :0]

        def shared_alone():
            act_shared = _gate_up(moe, h, none, rows, gate_up_extra, xq)
            expert_down_parts(act_shared, weights, none, rows, cfg_h, cfg_i, extra=down_extra,
                              extra_scale=shared_scale, out=parts[k:])

        moe.overlap.run(copy, shared_alone, h)
        act = _gate_up(moe, h, slots, rows, None, xq)
        if sums is not None:
            return _deferred(expert_down_parts(act, weights, slots, rows, cfg_h, cfg_i, out=parts, write_shared=False,
                                               sums=sums), next_norm)
        return expert_down_parts(act, weights, slots, rows, cfg_h, cfg_i, out=parts, write_shared=False)
    # Dense experts (the BF16 checkpoint) or a dense shared expert: the fused router, then the unfused kernels.
    shared = moe.overlap.run(copy, lambda: shared_scale.to(h.dtype) * swiglu(h, *moe.shared), h)
    kernel = moe.kernels.experts_decode_nvfp4 if moe.experts.fmt == "nvfp4" else moe.kernels.experts_decode
    return kernel(h, weights, slots, *expert_weights) + shared
