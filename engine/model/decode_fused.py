"""The fused batch-1 decode step (options.decode_kernels="fused"): the same model, fewer and larger kernels.

Why: the unfused step launched ~185 kernels per layer (7,394 per token on the H200, 11.6 ms); a CUDA graph
removes their CPU cost, not the 1-3 us each one takes on the GPU. Here one layer is about a dozen launches:
  residual add + RMSNorm (one kernel, twice per layer; the MoE output is added by the next layer's norm)
  GDN:       in_proj_qkv+z and in_proj_b+a in merged GEMVs -> one fused conv/l2norm/gating/delta-rule/gated-norm
             step -> out_proj GEMV
  attention: q+k+v in one GEMV -> q/k RMSNorm + partial RoPE in one kernel -> FlashInfer decode -> sigmoid gate
             -> o_proj GEMV
  MoE:       router + shared-expert gate in one GEMV -> softmax/top-k/renormalise/sigmoid in one kernel ->
             ensure (offloaded) -> routed experts + the shared expert over NVFP4 bytes in two kernels (the
             down one leaves a part per expert; the next residual add + RMSNorm sums them in order)
Four A/B switches (off until measured) fold a one-program launch into the tail of the launch before it, by the
last program to arrive (kernels/launch.last_to_arrive): the router's top-k into its GEMV (router_gemv.FUSED),
the post-mixer add + RMSNorm into out_proj / o_proj (gemv_norm.FUSED), the next add + RMSNorm into the serial
MoE down projection (parts_norm.FUSED), GDN's gated norm and conv shift into its step
(gdn_decode.NORM_SHIFT_TAIL). A fifth (gemv_mixed.MIXED) takes GDN's in_proj_b + a (BF16) into the FP8
in_proj_qkv + z launch; a sixth (attention_decode.TRITON) runs the decode attention as one Triton launch with
its split-KV merge inside, instead of FlashInfer's decode and merge kernels; a seventh (nvfp4_experts_mma.FUSED,
off: measured slower) runs the experts' gate/up on the tensor cores; an eighth (parts_norm.TILE_SUMS, on:
0.983x the step on the H200) leaves the next layer's input add + RMSNorm to the MoE down launch's per-tile tails
(the new residual and its tiles' sums of squares) and that layer's first GEMV (the norm applied as x is
loaded): no launch of its own. Tried, and removed after their A/B (docs/RESULTS.md session 18): the weights
streamed through shared memory in pipelined K steps, of the FP8 GEMVs (1.042x the step) and of gate/up
(1.038x); the LM head on the tensor cores (1.088x); route_topk in the router norm launch's last program
(1.017x); gate/up as persistent programs that load a tile ahead (1.003x) and at one warp a program (0.995x and
0.998x); and, not run (its premise gone under the H200's Triton), the GEMVs' register cap.
The unfused path (the model's own forward) is the reference these are tested against (tests/
test_decode_fused.py, in Triton's interpreter on the CPU and natively on the GPU tier). Every kernel here is
deterministic with a launch configuration fixed by the shapes, so graph replay equals eager byte for byte.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch
import triton

from ..kernels import attention_decode as attention_decode_mod
from ..kernels import nvfp4_experts_mma
from ..kernels import gdn_decode as gdn_decode_mod
from ..kernels import gemv_mixed, gemv_norm, nvfp4_int_dot, nvfp4_int_experts, parts_norm, router_gemv, router_norm
from . import shared_early
from ..kernels.attention_merge import merge_gate
from ..kernels.attention_prologue import rope_inv_freq
from ..kernels.decode_fused import add_rms_norm, attention_prologue, route_topk, sigmoid_gate_mul
from ..kernels.gdn_decode import gdn_decode_step
from ..kernels.gemv_multi import gemv, gemv_multi
from ..kernels.launch import new_counter, programmatic_launch
from ..kernels.nvfp4_experts_decode import expert_gate_up, nvfp4_triples
from ..kernels.nvfp4_experts_parts import expert_down_parts
from ..kernels.nvfp4_experts_parts import BLOCK_M as PARTS_BLOCK_M
from ..kernels.route_keys import MAX_EXPERTS
from ..quant.linear import QuantLinear
from ..quant.scheme import NVFP4
from .moe import ResidentExperts
from .ops import swiglu

if TYPE_CHECKING:
    from .attention import GatedAttention
    from .cache import SequenceState
    from .gdn import GatedDeltaNet
    from .moe import SparseMoE
    from .qwen3_5_moe import Qwen35MoeModel


# Diagnostics only (scripts/profile_decode.py arms "drop-route", "drop-prenorm", "drop-normshift",
# "drop-prologue"): launches left out of the step to measure what removing them could give at most (the router's
# top-k tail; the pre-mixer add + RMSNorm; GDN's gated norm and conv shift, its unnormed output going on; the
# attention's q/k norm + RoPE + KV write, zeros for q). The step's bytes are then wrong; the engine never sets it.
DROP: frozenset = frozenset()


def _fixed(owner, name: str, make):
    """A stand-in tensor for a dropped launch's output, made on the first (eager) call, never inside a capture."""
    t = getattr(owner, name, None)
    if t is None:
        t = make()
        setattr(owner, name, t)
    return t


def _dropped_route(moe: "SparseMoE", h: torch.Tensor):
    k, dev = moe.top_k, h.device
    return (_fixed(moe, "drop_weights", lambda: torch.full((1, k), 1.0 / k, device=dev, dtype=h.dtype)),
            _fixed(moe, "drop_ids", lambda: torch.arange(k, device=dev).reshape(1, k)),
            _fixed(moe, "drop_scale", lambda: torch.full((1,), 0.5, device=dev)))


def _format(weight) -> str:
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
        if runs and _format(runs[-1][0]) == _format(w):
            runs[-1].append(w)
        else:
            runs.append([w])
    if gemv_mixed.MIXED and len(runs) == 2 and max(map(len, runs)) <= gemv_mixed.MAX_PARTS:  # one launch
        y = gemv_mixed.gemv_two_formats(x, runs[0], runs[1], out_dtype=out_dtype, norm=norm)
        return list(y.split([_out_features(w) for w in weights], dim=-1))
    views: list[torch.Tensor] = []
    for group in runs:
        y = gemv_multi(x, group, out_dtype=out_dtype, norm=norm)
        views.extend(y.split([_out_features(w) for w in group], dim=-1))
    return views


def _counters(owner, name: str, device: torch.device, n: int = 1) -> torch.Tensor:
    """owner's arrival counters for one call site's one-launch tail (launch.last_to_arrive), made on its first
    call: an eager or warm-up step, never inside a capture (new_counter refuses that)."""
    counters = getattr(owner, name, None)
    if counters is None:
        counters = new_counter(device, n)
        setattr(owner, name, counters)
    return counters


def _out_features(weight) -> int:
    return weight.out_features if isinstance(weight, QuantLinear) else weight.shape[0]


def gdn_decode(mixer: "GatedDeltaNet", h: torch.Tensor, state: "SequenceState") -> torch.Tensor:
    """The GDN mixer's output activation [1, V * heads], before its out_proj."""
    c = mixer.cfg
    qkv, z, b, a = project(h, [mixer.in_proj_qkv, mixer.in_proj_z, mixer.in_proj_b, mixer.in_proj_a])
    counters = None
    if gdn_decode_mod.NORM_SHIFT_TAIL:  # the norm and conv shift in the step's launch (made eagerly, once)
        counters = _counters(mixer, "step_counters", h.device, c.num_value_heads + c.num_key_heads)
    out = gdn_decode_step(qkv[0], z[0], b[0], a[0], state.conv[mixer.layer], mixer.conv_w, mixer.neg_a,
                          mixer.dt_bias, state.recurrent[mixer.layer], mixer.norm_w, mixer.eps,
                          c.num_key_heads, c.num_value_heads, c.key_head_dim, c.value_head_dim, counters=counters,
                          norm_shift="normshift" not in DROP)
    return out.view(1, -1)


def attention_decode(mixer: "GatedAttention", h: torch.Tensor, positions: torch.Tensor, state: "SequenceState",
                     start: int) -> torch.Tensor:
    """The gated attention output [1, heads * head_dim], before its o_proj."""
    a = mixer.cfg
    q_gate, k, v = project(h, [mixer.q_proj, mixer.k_proj, mixer.v_proj])
    if getattr(mixer, "inv_freq", None) is None:  # made on the first (eager) call, never inside a capture
        mixer.inv_freq = rope_inv_freq(a.rotary_dim, a.rope_theta, h.device)
    kv, backend = state.kv[mixer.layer], mixer.backend
    # A paged cache takes the step's k and v straight from the prologue (no index_copy kernels).
    rows = backend.decode_rows(kv) if hasattr(backend, "decode_rows") else None
    if "prologue" in DROP:  # stand-ins (zeros) for q, k and v; the step's k and v are not written
        dtype = rows[0].dtype if rows is not None else q_gate.dtype
        q = _fixed(mixer, "drop_q", lambda: torch.zeros(a.num_heads, a.head_dim, device=h.device, dtype=dtype))
        k = v = _fixed(mixer, "drop_kv", lambda: torch.zeros(a.num_kv_heads, a.head_dim, device=h.device,
                                                             dtype=dtype))
        gate = q_gate[0].view(a.num_heads, 2 * a.head_dim)[:, a.head_dim:]
    else:
        q, gate, k, v = attention_prologue(q_gate[0], k[0], v[0], mixer.q_norm, mixer.k_norm, positions, mixer.eps,
                                           a.num_heads, a.num_kv_heads, a.head_dim, a.rotary_dim, a.rope_theta,
                                           inv_freq=mixer.inv_freq, kv_cache=rows,
                                           dtype=rows[0].dtype if rows is not None else None)
    if rows is not None and attention_decode_mod.TRITON and attention_decode_mod.MERGE_APART:
        # the partials only, merged in the output gate's launch (attention_merge.py)
        acc, ml = attention_decode_mod.decode_attention_parts(q, *rows, positions)
        return merge_gate(acc, ml, gate, q.dtype)
    if rows is not None and attention_decode_mod.TRITON:  # split KV merged in the launch (attention_decode.py)
        groups = attention_decode_mod.SPLITS // attention_decode_mod.GROUP
        counters = _counters(mixer, "attn_counters", h.device, a.num_kv_heads * (groups + 1))
        out = attention_decode_mod.decode_attention(q, *rows, positions, counters, splits=attention_decode_mod.SPLITS,
                                                    block_t=attention_decode_mod.BLOCK_T).reshape(1, -1)
    elif rows is not None:
        out = backend.attend_written(kv, q.view(1, *q.shape)).reshape(1, -1)
    else:
        out = backend.attend(kv, q.view(1, *q.shape), k.view(1, *k.shape), v.view(1, *v.shape), positions, start,
                             True).reshape(1, -1)
    return sigmoid_gate_mul(out, gate, dest=out)


def _nvfp4_shared(moe: "SparseMoE") -> bool:
    """The shared expert can ride in the routed experts' kernels: NVFP4 bytes, the routed experts' sizes."""
    return (all(isinstance(w, QuantLinear) and w.fmt == NVFP4 for w in moe.shared)
            and moe.shared[0].out_features == moe.inter)


def _route(moe: "SparseMoE", h: torch.Tensor):
    """(weights, ids, shared_scale) of this token: the router + shared-expert gate in one GEMV, then the tail."""
    gates = [moe.router_w, moe.shared_gate]
    if "route" in DROP:
        gemv_multi(h, gates)
        return _dropped_route(moe, h)
    plain = all(_format(g) == "dense" and g.dtype == h.dtype for g in gates)
    if router_gemv.FUSED and plain:  # one launch: the tail in the GEMV's last program (the same bytes)
        return router_gemv.router_topk(h, *gates, moe.top_k, h.dtype, _counters(moe, "route_counter", h.device))
    # Logits in the compute dtype, as the unfused router's F.linear gives them (top-k then agrees on near-ties).
    if _format(gates[0]) == _format(gates[1]):  # always so in the known checkpoints (both BF16): one launch
        router_logits = gemv_multi(h, gates)
    else:
        router_logits = torch.cat(project(h, gates), dim=-1)
    return route_topk(router_logits.reshape(-1), moe.router_w.shape[0], moe.top_k, h.dtype)


def _norm_tail(moe: "SparseMoE", next_norm: tuple | None, hidden: int) -> tuple | None:
    """expert_down_parts' norm= for the next residual add + RMSNorm (parts_norm.FUSED), with this layer's
    counters (made on the first, eager, call: never inside a capture)."""
    if not parts_norm.FUSED or next_norm is None:
        return None
    return (*next_norm, _counters(moe, "norm_counters", next_norm[0].device, triton.cdiv(hidden, PARTS_BLOCK_M) + 1))


def _sums_tail(moe: "SparseMoE", next_norm: tuple | None, hidden: int) -> tuple | None:
    """expert_down_parts' sums= (parts_norm.TILE_SUMS, next_norm = (x, norm_w, eps) of a next layer): the new
    residual and its tiles' sums of squares, the norm left to that layer's first GEMV."""
    if not parts_norm.TILE_SUMS or next_norm is None:
        return None
    return next_norm[0], _counters(moe, "sum_counters", next_norm[0].device, triton.cdiv(hidden, PARTS_BLOCK_M))


def _deferred(result, next_norm: tuple) -> tuple:
    """expert_down_parts' (new_x, tile sums) as moe_decode's (new_x, the next layer's DeferredNorm input)."""
    new_x, sums = result
    return new_x, DeferredNorm(new_x, sums, next_norm[1], next_norm[2])


def router_takes_the_norm(moe: "SparseMoE", x: torch.Tensor) -> bool:
    """router_norm.FUSED and plain router + shared-gate weights in x's dtype: the post-mixer add + RMSNorm is
    done by the router GEMV's programs (kernels/router_norm.py), not by a launch of its own."""
    return (router_norm.FUSED and not gemv_norm.FUSED
            and all(_format(g) == "dense" and g.dtype == x.dtype for g in (moe.router_w, moe.shared_gate)))


def _route_with_norm(moe: "SparseMoE", pending: tuple):
    """(weights, ids, shared_scale, new_x, normed, xq, aside, route): pending = (x, mixer delta, post_norm, eps)
    normed by the router's programs, then route_topk's tail on their logits; xq: the normed row's int16 blocks
    where the experts' gate/up takes them (_int_gate_up), else None; aside: the shared expert's gate/up forked
    between the two launches (shared_early), else None; route: expert_gate_up_int's route= where its programs
    route themselves (routes_itself: weights, ids and shared_scale are then the empty tensors it fills), else
    None."""
    quantize = _int_gate_up(moe)
    out = router_norm.router_norm(*pending, moe.router_w, moe.shared_gate, quantize=quantize)
    new_x, h, router_logits = out[:3]
    xq = out[3] if quantize else None
    aside = None
    if shared_early.wanted(moe, quantize) and moe.experts.fmt == "nvfp4" and _nvfp4_shared(moe):
        gate, up, _ = nvfp4_triples(*moe.shared)
        aside = shared_early.start(moe, h, xq, gate + up, moe.experts.decode_bank())
    try:
        if "route" in DROP:
            return (*_dropped_route(moe, h), new_x, h, xq, aside, None)
        if routes_itself(moe, router_logits):  # the gate/up launch fills route_topk's outputs
            k = moe.top_k
            weights = torch.empty(1, k, device=h.device, dtype=h.dtype)
            ids = torch.empty(1, k, device=h.device, dtype=torch.int64)
            shared_scale = torch.empty(1, device=h.device, dtype=torch.float32)
            route = (router_logits.reshape(-1), moe.router_w.shape[0], weights, ids, shared_scale)
            return weights, ids, shared_scale, new_x, h, xq, aside, route
        weights, ids, shared_scale = route_topk(router_logits.reshape(-1), moe.router_w.shape[0], moe.top_k,
                                                h.dtype)
    except BaseException:
        if aside is not None:  # no side work outlives its layer
            aside.join()
        raise
    return weights, ids, shared_scale, new_x, h, xq, aside, None


def routes_itself(moe: "SparseMoE", logits: torch.Tensor) -> bool:
    """The integer gate/up's programs find their own experts from the router's logits (nvfp4_int_experts.ROUTE;
    no route_topk launch): the experts resident (no slot map to ensure first), the integer gate/up with the
    shared expert in the experts' kernels, the overlap's split off, 16-bit logits."""
    return (nvfp4_int_experts.ROUTE and isinstance(moe.experts, ResidentExperts) and _int_gate_up(moe)
            and _nvfp4_shared(moe) and moe.overlap.split == "off"
            and logits.dtype in (torch.bfloat16, torch.float16) and moe.router_w.shape[0] <= MAX_EXPERTS)


def _int_gate_up(moe: "SparseMoE") -> bool:
    """The NVFP4 experts' gate/up as integer dots (nvfp4_int_experts.ON) for this layer."""
    return nvfp4_int_experts.ON and moe.experts.fmt == "nvfp4" and moe.hidden % 16 == 0


def moe_decode(moe: "SparseMoE", h: torch.Tensor | None, trace_ids: torch.Tensor | None = None,
               next_norm: tuple | None = None, pending: tuple | None = None, defer_norm: bool = False):
    """The MoE's output as a delta for the next add_rms_norm (a tensor, or fp32 parts [k + 1, 1, H]), or, where
    next_norm = (x, norm_w, eps) is given and the down projection can take it (parts_norm.FUSED, serial NVFP4
    launch), that norm already done: (new_x, normed). trace_ids: this layer's row of a benchmark routing trace
    (RoutingTrace.one_token_ids), replacing the router's ids (its weights are kept). pending = (x, mixer delta,
    post_norm, eps) instead of h (router_takes_the_norm): the router's launch does the post-mixer norm, and the
    result is (new_x, the above), next_norm's x replaced by new_x. defer_norm (next_norm is a next layer's
    input norm, parts_norm.TILE_SUMS on, an NVFP4 parts launch): (new_x, DeferredNorm) instead of (new_x, normed)."""
    if pending is not None:
        weights, ids, shared_scale, new_x, h, xq, aside, route = _route_with_norm(moe, pending)
        if next_norm is not None:
            next_norm = (new_x, *next_norm[1:])
        try:
            return new_x, _moe_after_route(moe, h, weights, ids, shared_scale, trace_ids, next_norm, defer_norm, xq,
                                           aside, route)
        finally:  # no side work outlives its layer (joined before the down launch already; once)
            if aside is not None:
                aside.join()
    weights, ids, shared_scale = _route(moe, h)
    return _moe_after_route(moe, h, weights, ids, shared_scale, trace_ids, next_norm, defer_norm)


def _gate_up(moe: "SparseMoE", h: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor, extra, site: str,
             xq: tuple | None = None, out: torch.Tensor | None = None, route: tuple | None = None,
             trace_ids: torch.Tensor | None = None):
    """expert_gate_up's act: as integer dots where xq (h's int16 blocks, _int_gate_up) is given; on the tensor
    cores where nvfp4_experts_mma.FUSED and the layer allows it (K in whole split steps; its input norm's
    outputs fit fp16: moe.mma_ok, set by forward on an eager step). site: the call site's arrival counters on
    moe (one set a launch site: serial, shared apart, routed). out: where the integer path writes act. route:
    the integer launch's programs route themselves (routes_itself; ids are then route's, filled by it), with a
    benchmark's trace_ids as their rows where given."""
    if route is not None:
        return nvfp4_int_experts.expert_gate_up_int(h, trace_ids, rows, moe.hidden, moe.inter, extra, out=out, xq=xq,
                                                    route=route)
    if xq is not None:
        return nvfp4_int_experts.expert_gate_up_int(h, ids, rows, moe.hidden, moe.inter, extra, out=out, xq=xq)
    cfg = nvfp4_experts_mma.CONFIG
    if (nvfp4_experts_mma.FUSED and getattr(moe, "mma_ok", False)
            and nvfp4_experts_mma.step_codes(moe.hidden, cfg["split"]) is not None):
        n = ids.shape[-1] + (extra is not None)
        counters = _counters(moe, site, h.device, n * triton.cdiv(moe.inter, cfg["block_n"]))
        return nvfp4_experts_mma.expert_gate_up_mma(h, ids, rows, moe.hidden, moe.inter, extra, counters=counters,
                                                    **cfg)
    return expert_gate_up(h, ids, rows, moe.hidden, moe.inter, extra=extra)


def _moe_after_route(moe: "SparseMoE", h: torch.Tensor, weights, ids, shared_scale, trace_ids, next_norm,
                     defer_norm: bool = False, xq: tuple | None = None, aside=None, route: tuple | None = None):
    """moe_decode after the router: the experts (and the shared one) of this token. xq: h's int16 blocks where
    the router's launch made them (the integer gate/up; made here otherwise). aside: the shared expert's act
    being made on a side stream (shared_early): the routed gate/up writes the other rows, the down launch
    waits for it. route: the gate/up launch routes itself (routes_itself), filling weights, ids and
    shared_scale before the down launch reads them."""
    sums = _sums_tail(moe, next_norm, moe.hidden) if defer_norm else None
    if trace_ids is not None:  # forward gathers them for every layer (model.routing is every layer's moe.routing)
        ids = trace_ids
    slots, expert_weights, copy = moe.experts.for_decode(ids)
    cfg_h, cfg_i = moe.hidden, moe.inter
    if moe.experts.fmt == "nvfp4" and _nvfp4_shared(moe):
        if xq is None and _int_gate_up(moe):  # no router_norm launch made them: one launch here
            xq = nvfp4_int_dot.quantize_x16(h.reshape(-1))
        gate, up, down_extra = nvfp4_triples(*moe.shared)
        gate_up_extra = gate + up
        rows = expert_weights[0]
        # The down projection leaves one fp32 part per expert ([k + 1, 1, H]); the next add_rms_norm sums them.
        if moe.overlap.split == "off":
            copy()
            if aside is not None:
                act = aside.act
                _gate_up(moe, h, slots, rows, None, "mma_counters_routed", xq, out=act[:slots.shape[-1]], route=route,
                         trace_ids=trace_ids)
                aside.join()
            else:
                act = _gate_up(moe, h, slots, rows, gate_up_extra, "mma_counters", xq, route=route,
                               trace_ids=trace_ids)
            if sums is not None:  # the next norm left to the next layer's first GEMV
                return _deferred(expert_down_parts(act, weights, slots, rows, cfg_h, cfg_i, extra=down_extra,
                                                   extra_scale=shared_scale, sums=sums), next_norm)
            return expert_down_parts(act, weights, slots, rows, cfg_h, cfg_i, extra=down_extra,
                                     extra_scale=shared_scale, norm=_norm_tail(moe, next_norm, cfg_h))
        # The shared expert apart (on its stream beside the miss copy): the same two kernels' programs with no
        # routed experts, writing the last part, so the bytes are those of the serial launch.
        k = slots.shape[-1]
        parts = torch.empty(k + 1, 1, cfg_h, device=h.device, dtype=torch.float32)
        none = slots[:, :0]

        def shared_alone():
            act_shared = _gate_up(moe, h, none, rows, gate_up_extra, "mma_counters_shared", xq)
            expert_down_parts(act_shared, weights, none, rows, cfg_h, cfg_i, extra=down_extra,
                              extra_scale=shared_scale, out=parts[k:])

        moe.overlap.run(copy, shared_alone, h)
        act = _gate_up(moe, h, slots, rows, None, "mma_counters_routed", xq)
        if sums is not None:
            return _deferred(expert_down_parts(act, weights, slots, rows, cfg_h, cfg_i, out=parts, write_shared=False,
                                               sums=sums), next_norm)
        return expert_down_parts(act, weights, slots, rows, cfg_h, cfg_i, out=parts, write_shared=False)
    # Dense experts (the BF16 checkpoint) or a dense shared expert: the fused router, then the unfused kernels.
    shared = moe.overlap.run(copy, lambda: shared_scale.to(h.dtype) * swiglu(h, *moe.shared), h)
    kernel = moe.kernels.experts_decode_nvfp4 if moe.experts.fmt == "nvfp4" else moe.kernels.experts_decode
    return kernel(h, weights, slots, *expert_weights) + shared


def forward(model: "Qwen35MoeModel", ids: torch.Tensor, positions: torch.Tensor, state: "SequenceState",
            start: int) -> torch.Tensor:
    """One token ids [1] -> final-normed hidden [1, H], the fused twin of Qwen35MoeModel.forward(decode=True).
    The kernels launch with programmatic dependent launch where the config says so (kernels.pdl, sm_90+)."""
    with programmatic_launch(model.kernels.pdl):
        return _forward(model, ids, positions, state, start)


def _project_add_norm(layer, act: torch.Tensor, proj, x: torch.Tensor, eps: float):
    """The mixer's projection, then the residual add + post-attention RMSNorm: (new x, normed)."""
    if gemv_norm.FUSED:  # one launch: the norm in the GEMV's last program
        counter = _counters(layer, "post_norm_counter", x.device)
        return gemv_norm.gemv_add_rms_norm(act, proj, x, layer.post_norm, eps, counter)
    return add_rms_norm(x, gemv(act, proj), layer.post_norm, eps)


def _forward(model, ids, positions, state, start):
    eps = model.cfg.rms_norm_eps
    x = model.embed_ids(ids)
    delta = None
    trace = model.routing
    trace_ids = trace.one_token_ids() if trace is not None else None
    layers = model.layers
    normed = None  # the next norm, where the MoE's launch did it (parts_norm.FUSED)
    if nvfp4_experts_mma.FUSED and not hasattr(layers[0].moe, "mma_ok"):  # once, on the first (eager) step
        for layer in layers:
            layer.moe.mma_ok = nvfp4_experts_mma.fp16_safe_norm(layer.post_norm, layer.moe.hidden)
    for i, layer in enumerate(layers):
        if "prenorm" in DROP and i > 0:
            h = _fixed(layer, "drop_h", lambda: x.clone())
        else:
            x, h = add_rms_norm(x, delta, layer.input_norm, eps) if normed is None else (x, normed)
        if layer.is_attention:
            act, proj = attention_decode(layer.mixer, h, positions, state, start), layer.mixer.o_proj
        else:
            act, proj = gdn_decode(layer.mixer, h, state), layer.mixer.out_proj
        next_w = layers[i + 1].input_norm if i + 1 < len(layers) else model.norm
        layer_ids = trace_ids[layer.moe.layer] if trace_ids is not None else None
        defer = i + 1 < len(layers)  # a next layer's first GEMV can take the norm (parts_norm.TILE_SUMS)
        if router_takes_the_norm(layer.moe, x):  # the post-mixer norm in the router's launch
            x, out = moe_decode(layer.moe, None, layer_ids, next_norm=(x, next_w, eps),
                                pending=(x, gemv(act, proj), layer.post_norm, eps), defer_norm=defer)
        else:
            x, h = _project_add_norm(layer, act, proj, x, eps)
            out = moe_decode(layer.moe, h, layer_ids, next_norm=(x, next_w, eps), defer_norm=defer)
        (x, normed), delta = (out, None) if isinstance(out, tuple) else ((x, None), out)
    return normed if normed is not None else add_rms_norm(x, delta, model.norm, eps)[1]


def logits(model: "Qwen35MoeModel", hidden: torch.Tensor) -> torch.Tensor:
    """fp32 logits [1, V] straight from the LM head GEMV (the unfused path rounds them to the compute dtype).
    (Tried: the NVFP4 head as integer dots, nvfp4_int_dot.gemv_int; 1.015x / 1.016x the step in two A/Bs,
    docs/RESULTS.md session 19.)"""
    with programmatic_launch(model.kernels.pdl):
        return gemv(hidden, model.lm_head_w, out_dtype=torch.float32)
