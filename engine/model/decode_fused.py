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
its split-KV merge inside, instead of FlashInfer's decode and merge kernels; a seventh (parts_norm.TILE_SUMS, on:
0.983x the step on the H200) leaves the next layer's input add + RMSNorm to the MoE down launch's per-tile tails
(the new residual and its tiles' sums of squares) and that layer's first GEMV (the norm applied as x is
loaded): no launch of its own. Tried, and removed after their A/B (docs/RESULTS.md session 18): the weights
streamed through shared memory in pipelined K steps, of the FP8 GEMVs (1.042x the step) and of gate/up
(1.038x); the LM head on the tensor cores (1.088x); route_topk in the router norm launch's last program
(1.017x); gate/up as persistent programs that load a tile ahead (1.003x) and at one warp a program (0.995x and
0.998x); and, not run (its premise gone under the H200's Triton), the GEMVs' register cap. The experts' gate/up
on the tensor cores (nvfp4_experts_mma, fp16 activations) lost 1.05-1.09x the step (session 13) and was removed
in session 22 (history: 8258d57).
The MoE's part of the layer is moe_fused.py; what both share (the merged projection, counters, stand-ins) is
fused_parts.py. The unfused path (the model's own forward) is the reference these are tested against (tests/
test_decode_fused.py, in Triton's interpreter on the CPU and natively on the GPU tier). Every kernel here is
deterministic with a launch configuration fixed by the shapes, so graph replay equals eager byte for byte.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..kernels import attention_decode as attention_decode_mod
from ..kernels import gdn_decode as gdn_decode_mod
from ..kernels import gemv_norm, nvfp4_mma
from ..kernels.attention_merge import merge_gate
from ..kernels.attention_prologue import rope_inv_freq
from ..kernels.decode_fused import add_rms_norm, attention_prologue, sigmoid_gate_mul
from ..kernels.gdn_decode import gdn_decode_step
from ..kernels.gemv_multi import gemv
from ..kernels.launch import programmatic_launch
from .fused_parts import counters_for, project, stand_in
from .moe_fused import moe_decode, router_takes_the_norm

if TYPE_CHECKING:
    from .attention import GatedAttention
    from .cache import SequenceState
    from .gdn import GatedDeltaNet
    from .qwen3_5_moe import Qwen35MoeModel


# Diagnostics only (scripts/profile_decode.py arms "drop-route", "drop-prenorm", "drop-normshift",
# "drop-prologue"): launches left out of the step to measure what removing them could give at most (the router's
# top-k tail; the pre-mixer add + RMSNorm; GDN's gated norm and conv shift, its unnormed output going on; the
# attention's q/k norm + RoPE + KV write, zeros for q). The step's bytes are then wrong; the engine never sets it.
DROP: frozenset = frozenset()


def gdn_decode(mixer: "GatedDeltaNet", h: torch.Tensor, state: "SequenceState") -> torch.Tensor:
    """The GDN mixer's output activation [1, V * heads], before its out_proj."""
    c = mixer.cfg
    qkv, z, b, a = project(h, [mixer.in_proj_qkv, mixer.in_proj_z, mixer.in_proj_b, mixer.in_proj_a])
    counters = None
    if gdn_decode_mod.NORM_SHIFT_TAIL:  # the norm and conv shift in the step's launch (made eagerly, once)
        counters = counters_for(mixer, "step_counters", h.device, c.num_value_heads + c.num_key_heads)
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
        q = stand_in(mixer, "drop_q", lambda: torch.zeros(a.num_heads, a.head_dim, device=h.device, dtype=dtype))
        k = v = stand_in(mixer, "drop_kv", lambda: torch.zeros(a.num_kv_heads, a.head_dim, device=h.device,
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
        counters = counters_for(mixer, "attn_counters", h.device, a.num_kv_heads * (groups + 1))
        out = attention_decode_mod.decode_attention(q, *rows, positions, counters, splits=attention_decode_mod.SPLITS,
                                                    block_t=attention_decode_mod.BLOCK_T).reshape(1, -1)
    elif rows is not None:
        out = backend.attend_written(kv, q.view(1, *q.shape)).reshape(1, -1)
    else:
        out = backend.attend(kv, q.view(1, *q.shape), k.view(1, *k.shape), v.view(1, *v.shape), positions, start,
                             True).reshape(1, -1)
    return sigmoid_gate_mul(out, gate, dest=out)


def forward(model: "Qwen35MoeModel", ids: torch.Tensor, positions: torch.Tensor, state: "SequenceState",
            start: int) -> torch.Tensor:
    """One token ids [1] -> final-normed hidden [1, H], the fused twin of Qwen35MoeModel.forward(decode=True).
    The kernels launch with programmatic dependent launch where the config says so (kernels.pdl, sm_90+)."""
    with programmatic_launch(model.kernels.pdl):
        return _forward(model, ids, positions, state, start)


def _project_add_norm(layer, act: torch.Tensor, proj, x: torch.Tensor, eps: float):
    """The mixer's projection, then the residual add + post-attention RMSNorm: (new x, normed)."""
    if gemv_norm.FUSED:  # one launch: the norm in the GEMV's last program
        counter = counters_for(layer, "post_norm_counter", x.device)
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
    for i, layer in enumerate(layers):
        if "prenorm" in DROP and i > 0:
            h = stand_in(layer, "drop_h", lambda: x.clone())
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
                                pending=(x, gemv(act, proj), layer.post_norm, eps), defer_norm=defer,
                                drop_route="route" in DROP)
        else:
            x, h = _project_add_norm(layer, act, proj, x, eps)
            out = moe_decode(layer.moe, h, layer_ids, next_norm=(x, next_w, eps), defer_norm=defer,
                             drop_route="route" in DROP)
        (x, normed), delta = (out, None) if isinstance(out, tuple) else ((x, None), out)
    return normed if normed is not None else add_rms_norm(x, delta, model.norm, eps)[1]


def logits(model: "Qwen35MoeModel", hidden: torch.Tensor) -> torch.Tensor:
    """fp32 logits [1, V] straight from the LM head GEMV (the unfused path rounds them to the compute dtype).
    An NVFP4 head goes on the integer tensor cores where nvfp4_mma.LM_HEAD is on (x quantized by its own launch).
    (Tried: the NVFP4 head as integer dots, nvfp4_int_dot.gemv_int; 1.015x / 1.016x the step in two A/Bs,
    docs/RESULTS.md session 19.)"""
    with programmatic_launch(model.kernels.pdl):
        t = getattr(model.lm_head_w, "tensors", model.lm_head_w)  # a QuantLinear's dict, or a plain weight
        if nvfp4_mma.LM_HEAD and isinstance(t, dict) and "weight_scale_2" in t \
                and (2 * t["weight"].shape[1]) % 64 == 0:
            return nvfp4_mma.gemv_mma(t["weight"], t["weight_scale"].view(torch.uint8), t["weight_scale_2"],
                                      hidden.reshape(-1), warps=nvfp4_mma.LM_WARPS).reshape(1, -1)
        return gemv(hidden, model.lm_head_w, out_dtype=torch.float32)
