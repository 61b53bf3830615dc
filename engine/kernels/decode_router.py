"""The MoE router's tail for one decode token in one launch: softmax, top-k, renormalise, and the shared
expert's sigmoid gate.

Input: the [E + 1] logits of the merged router + shared-expert-gate GEMV (entry E is the shared gate logit).
Reference (route_topk_reference below): engine/model/moe.py `route` after its F.linear (softmax over the experts
in fp32, torch.topk, top / sum(top), cast) and SparseMoE.shared_expert's torch.sigmoid of the gate logit; about
ten torch kernels, among them a sort-based topk.

One program holds all E logits in registers and takes k rounds of (max with its index, mask that lane out): no
sort. The rounds run on the logits, not on the probabilities: softmax is monotone, so the experts and their
order are those of torch.topk on the probabilities wherever those are distinct, and an ulp of the kernel's exp
cannot reorder two near-equal experts. Ties (equal logits, common with bf16 logits): the lower expert id
first; torch.topk does not specify its order among equal values, so where a tie straddles rank k the chosen
expert may differ from torch's. Logits must be finite (a -inf logit could be chosen twice).
16-bit logits (the engine's bf16 / fp16 router) go through route_keys.py's packed keys where KEYS is on (the
default): the same experts in the same order, the weights as e_r / sum of the top-k's e in rank order (an ulp
from the fp32 form's at most), in half the time (docs/RESULTS.md session 15).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import gdc_prologue, pdl_launch
from .decode_norm import round_code
from .nvfp4_triton import _store_exact, exact_out
from .route_keys import MAX_EXPERTS, store_route

# 16-bit logits through route_keys.py (profile_decode arm "no-keys" compares): 1.69 against 3.51 us a launch.
KEYS = True


@triton.jit
def _route_tail(logits_ptr, weights_ptr, ids_ptr, shared_ptr, E, TOP_K: tl.constexpr, BLOCK_E: tl.constexpr,
                OUT_BF16: tl.constexpr):
    """The [E + 1] logits at logits_ptr -> the top-k weights and ids, and the shared gate's sigmoid."""
    experts = tl.arange(0, BLOCK_E)
    valid = experts < E
    logits = tl.load(logits_ptr + experts, mask=valid, other=float("-inf")).to(tl.float32)
    e = tl.exp(logits - tl.max(logits, axis=0))
    probs = e / tl.sum(e, axis=0)
    left = logits
    rank = tl.full([BLOCK_E], TOP_K, tl.int32)  # TOP_K: not chosen
    for j in tl.static_range(TOP_K):
        hit = experts == tl.argmax(left, axis=0, tie_break_left=True)
        rank = tl.where(hit, j, rank)
        left = tl.where(hit, float("-inf"), left)
    chosen = rank < TOP_K
    total = tl.sum(tl.where(chosen, probs, 0.0), axis=0)
    _store_exact(weights_ptr + rank, probs / total, chosen, OUT_BF16)
    tl.store(ids_ptr + rank, experts.to(tl.int64), mask=chosen)
    gate = tl.load(logits_ptr + E).to(tl.float32)
    tl.store(shared_ptr, 1.0 / (1.0 + tl.exp(-gate)))


@triton.jit
def route_topk_kernel(logits_ptr, weights_ptr, ids_ptr, shared_ptr, E, TOP_K: tl.constexpr,
                      BLOCK_E: tl.constexpr, OUT_BF16: tl.constexpr, KEYS: tl.constexpr, KP: tl.constexpr,
                      F16: tl.constexpr, USE_GDC: tl.constexpr = False):
    gdc_prologue(USE_GDC)  # PDL: nothing is read before the previous kernel ends
    if KEYS:
        store_route(logits_ptr, weights_ptr, ids_ptr, shared_ptr, E, TOP_K, KP, BLOCK_E, F16, OUT_BF16)
    else:
        _route_tail(logits_ptr, weights_ptr, ids_ptr, shared_ptr, E, TOP_K, BLOCK_E, OUT_BF16)


def route_topk(logits: torch.Tensor, num_experts: int, top_k: int, weights_dtype: torch.dtype,
               out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None, *, num_warps: int = 1
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits [E + 1] (or [1, E + 1]) fp32 / bf16 / fp16, contiguous, entry E the shared-expert gate logit ->
    (weights [1, k] in weights_dtype, ids [1, k] int64, shared_scale [1] fp32): weights/ids as moe.route gives
    them for this token, shared_scale = sigmoid(logits[E]). out = (weights, ids, shared_scale) to write into.
    One launch of one program, no host sync. num_warps: 1 keeps every reduction inside one warp."""
    flat = logits.reshape(-1)
    if flat.numel() != num_experts + 1 or not flat.is_contiguous():
        raise ValueError(f"logits must hold {num_experts} + 1 contiguous entries, got {tuple(logits.shape)}")
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k {top_k} must be in 1..{num_experts}")
    if out is None:
        out = (torch.empty(1, top_k, device=logits.device, dtype=weights_dtype),
               torch.empty(1, top_k, device=logits.device, dtype=torch.int64),
               torch.empty(1, device=logits.device, dtype=torch.float32))
    weights, ids, shared = out
    if weights.dtype != weights_dtype or weights.numel() != top_k or ids.numel() != top_k or shared.numel() != 1:
        raise ValueError("out must be (weights [1, k] in weights_dtype, ids [1, k] int64, shared_scale [1] fp32)")
    round_code(weights_dtype)
    keys = KEYS and flat.dtype in (torch.bfloat16, torch.float16)
    if keys and num_experts > MAX_EXPERTS:
        raise ValueError(f"route_topk packs expert ids in 16 bits: {num_experts} experts > {MAX_EXPERTS}")
    route_topk_kernel[(1,)](flat, exact_out(weights), ids, shared, num_experts, TOP_K=top_k,
                            BLOCK_E=triton.next_power_of_2(num_experts), OUT_BF16=weights_dtype == torch.bfloat16,
                            KEYS=keys, KP=triton.next_power_of_2(top_k), F16=flat.dtype == torch.float16,
                            num_warps=num_warps, **pdl_launch(logits.device))
    return weights, ids, shared


def route_topk_reference(logits: torch.Tensor, num_experts: int, top_k: int, weights_dtype: torch.dtype):
    """moe.route's steps after its F.linear (softmax in fp32, topk, renormalise, cast), and the shared gate."""
    flat = logits.reshape(1, -1)
    probs = torch.softmax(flat[:, :num_experts], dim=-1, dtype=torch.float32)
    top, ids = torch.topk(probs, top_k, dim=-1)
    top = top / top.sum(dim=-1, keepdim=True)
    return top.to(weights_dtype), ids, torch.sigmoid(flat[0, num_experts:].float())
