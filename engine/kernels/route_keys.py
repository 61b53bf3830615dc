"""The router's top-k over 16-bit logits as packed integer keys: route_topk's one program in half the time.

Why: route_topk is a one-program launch between the router GEMV and the experts' gate/up, on the step's critical
path 40 times. Its fp32 form (decode_router._route_tail) takes k rounds of an argmax over (value, index) pairs
after a softmax over all E experts: 3.5 us on the H200. Here a key per expert packs its logit's 16 bits, made
monotone as a signed integer, above 16 bits of (0xFFFF - id): one integer max a round finds the largest logit
and, among equal ones, the lowest id (route_topk's order; torch.topk's where the logits are distinct); 1.7 us
(docs/RESULTS.md session 15).
The weights: e_r = exp(l_r - l_0) added in rank order as scalars, then e_r / sum (softmax's denominator cancels
in the renormalisation; an ulp from the fp32 form's at most). Scalar and elementwise arithmetic only, and
integer maxima, so the bytes do not depend on the launch's warps. Logits must be finite, bf16 or fp16.
route_rank_key: one rank's key alone, for a program that needs only its own expert (the integer gate/up's, where
it routes itself: nvfp4_int_experts.ROUTE). In a one-warp program a round is a REDUX.MAX.S32 and a few integer
min/max, compares and selects (sm_90 SASS, Triton 3.6.0): no shared memory, no barrier.
Reference: route_topk_reference (decode_router.py); tests/test_kernels_route_keys.py.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .nvfp4_triton import _store_exact, exact_out

NONE = tl.constexpr(-2147483648)  # below every key of a finite logit (a key's low half is >= 1: ids < 0xFFFF)
MAX_EXPERTS = 0xFFFF


@triton.jit
def _keys(logits_ptr, E, BLOCK_E: tl.constexpr, L2_ONLY: tl.constexpr = False):
    """[BLOCK_E] int32 keys: monotone(logit) * 2^16 + (0xFFFF - id); NONE past E. -0.0 and +0.0 are one value.
    L2_ONLY: the logits read from L2 (ld.global.cg), past any SM's L1: for a reader that runs before its PDL
    wait (nvfp4_experts_parts' EARLY_ROUTE)."""
    ids = tl.arange(0, BLOCK_E)
    valid = ids < E
    if L2_ONLY:
        raw = tl.load(logits_ptr + ids, mask=valid, other=0.0, cache_modifier=".cg")
    else:
        raw = tl.load(logits_ptr + ids, mask=valid, other=0.0)
    bits = raw.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    mono = tl.where(bits >= 0x8000, 0x8000 - bits, bits)  # negative values: the larger the bits, the smaller
    return tl.where(valid, mono * 65536 + (0xFFFF - ids), NONE)


@triton.jit
def _value(key, F16: tl.constexpr):
    """A key's logit as fp32 (exact)."""
    mono = key >> 16
    bits = tl.where(mono < 0, 0x8000 - mono, mono).to(tl.int16)
    if F16:
        return bits.to(tl.float16, bitcast=True).to(tl.float32)
    return bits.to(tl.bfloat16, bitcast=True).to(tl.float32)


@triton.jit
def _id(key):
    return 0xFFFF - (key & 0xFFFF)


@triton.jit
def route_rank_key(logits_ptr, E, j, BLOCK_E: tl.constexpr, L2_ONLY: tl.constexpr = False):
    """The key of rank j (0-based, a runtime index) of logits[0..E-1]: j rounds of removing the max, then the
    max; _id(key) is the expert, route_weights' ids[j] (the same keys and integer maxima). L2_ONLY: see _keys."""
    keys = _keys(logits_ptr, E, BLOCK_E, L2_ONLY)
    for _ in range(j):
        keys = tl.where(keys == tl.max(keys, axis=0), NONE, keys)
    return tl.max(keys, axis=0)


def _rank_key_ptx(rounds: int) -> str:
    """The PTX of route_rank_key in one warp, for up to 256 experts: lane l holds experts 8 l ... 8 l + 7 (keys as
    _keys makes them, NONE past E), `rounds` rounds of removing the warp's largest key where the round is below the
    rank j, then the largest: REDUX.MAX over each lane's own maximum, no shared memory, no barrier. $0: the key;
    $1: the logits (16-bit), $2: E, $3: j."""
    keys = ", ".join(f"k{i}" for i in range(8))
    out = ["{ .reg .b32 " + keys + ", base, id, b, t, m, lane, none, half;",
           ".reg .b64 a; .reg .b16 h; .reg .pred v, p, q, live;",
           "mov.u32 lane, %laneid; shl.b32 base, lane, 3; mov.b32 none, 0x80000000; mov.b32 half, 0x8000;"]
    for i in range(8):  # 0xFFFF - id as id ^ 0xFFFF (ids < 0x10000); mono = 0x8000 - bits for negative logits
        out.append(f"add.u32 id, base, {i}; setp.lt.u32 v, id, $2; mov.b32 k{i}, none;")
        out.append("@v mad.wide.u32 a, id, 2, $1; @v ld.global.u16 h, [a]; @v cvt.u32.u16 b, h;")
        out.append("@v setp.ge.u32 p, b, half; @v sub.s32 t, half, b; @v selp.b32 b, t, b, p;")
        out.append(f"@v shl.b32 b, b, 16; @v xor.b32 t, id, 0xFFFF; @v or.b32 k{i}, b, t;")

    def warp_max():
        chain = ["max.s32 m, k0, k1;"] + [f"max.s32 m, m, k{i};" for i in range(2, 8)]
        return chain + ["redux.sync.max.s32 m, m, 0xffffffff;"]
    for r in range(rounds):
        out += warp_max() + [f"setp.gt.u32 live, $3, {r};"]  # the round is below the rank
        for i in range(8):
            out.append(f"setp.eq.and.s32 q, k{i}, m, live; selp.b32 k{i}, none, k{i}, q;")
    out += warp_max() + ["mov.b32 $0, m; }"]
    return "\n".join(out)


RANK_KEY_PTX = tl.constexpr(_rank_key_ptx(7))  # ranks 0..7: top-8 (the real model's), fewer rounds never needed
WARP_EXPERTS = 256  # the most experts RANK_KEY_PTX's lanes hold (8 a lane)


@triton.jit
def route_rank_key_warps(logits_ptr, E, j, W: tl.constexpr, DECODE: tl.constexpr):
    """route_rank_key's key for a program of W warps without a cross-warp max a round: on the PTX path every warp
    finds it alone (RANK_KEY_PTX, E <= 256, j <= 7), and one max over the warps' equal keys makes it a scalar; in
    the interpreter route_rank_key itself. The same keys and integer maxima, so the same key."""
    if DECODE == "asm":
        lanes = tl.arange(0, 32 * W)
        key = tl.inline_asm_elementwise(RANK_KEY_PTX, "=r,l,r,r", [logits_ptr + 0 * lanes, E + 0 * lanes,
                                                                   j + 0 * lanes],
                                        dtype=tl.int32, is_pure=False, pack=1)  # its loads after the PDL wait
        return tl.max(key, axis=0)
    return route_rank_key(logits_ptr, E, j, 256)


@triton.jit
def routed_expert_warps(logits_ptr, E, j, W: tl.constexpr, DECODE: tl.constexpr, ids_ptr, TRACE: tl.constexpr):
    """routed_expert's expert (int64) through route_rank_key_warps (E <= WARP_EXPERTS, j <= 7); with TRACE the
    trace's row ids[j], the rank still found."""
    return _expert_of(route_rank_key_warps(logits_ptr, E, j, W, DECODE), ids_ptr, j, TRACE)


@triton.jit
def _expert_of(key, ids_ptr, j, TRACE: tl.constexpr, L2_ONLY: tl.constexpr = False):
    """A rank's key as its expert (int64); with TRACE the trace's row ids[j] (read from L2 where L2_ONLY), the rank
    still found (a key is never -2^31 + 1: it stays live)."""
    e = _id(key).to(tl.int64)
    if TRACE:
        if L2_ONLY:
            traced = tl.load(ids_ptr + j, cache_modifier=".cg")
        else:
            traced = tl.load(ids_ptr + j)
        e = tl.where(key == -2147483647, e, traced.to(tl.int64))
    return e


@triton.jit
def routed_expert(logits_ptr, E, j, BLOCK_E: tl.constexpr, ids_ptr, TRACE: tl.constexpr,
                  L2_ONLY: tl.constexpr = False):
    """The expert a program of rank j finds itself (int64): route_rank_key's; with TRACE (a benchmark's routing
    trace) ids[j], the trace's row, with the rank still found (a key is never -2^31 + 1: it stays live).
    L2_ONLY: the logits and the trace's id read from L2 (see _keys)."""
    return _expert_of(route_rank_key(logits_ptr, E, j, BLOCK_E, L2_ONLY), ids_ptr, j, TRACE, L2_ONLY)


def check_route_logits(logits: torch.Tensor, experts: int, k: int) -> torch.Tensor:
    """The router's logits as a launch that routes itself reads them (flat, contiguous, 16-bit; E + 1 entries with
    the shared gate's last), after checking them and the top-k against the experts."""
    flat = logits.reshape(-1)
    if flat.dtype not in (torch.bfloat16, torch.float16) or flat.numel() != experts + 1 or not flat.is_contiguous():
        raise ValueError(f"route's logits must be {experts} + 1 contiguous bf16/fp16 entries, got "
                         f"{tuple(logits.shape)} {flat.dtype}")
    if not 1 <= k <= experts or experts > MAX_EXPERTS:
        raise ValueError(f"route needs 1 <= top_k {k} <= experts {experts} <= {MAX_EXPERTS}")
    return flat


@triton.jit
def route_weights(logits_ptr, E, TOP_K: tl.constexpr, KP: tl.constexpr, BLOCK_E: tl.constexpr,
                  F16: tl.constexpr):
    """(ids [KP] int32, weights [KP] fp32) of ranks 0..TOP_K-1 (entries past TOP_K: 0): the renormalised top-k."""
    keys = _keys(logits_ptr, E, BLOCK_E)
    rank = tl.arange(0, KP)
    ids = tl.zeros([KP], tl.int32)
    e = tl.zeros([KP], tl.float32)
    best = tl.max(keys, axis=0)  # rank 0's key: its logit is the softmax's shift
    l0 = _value(best, F16)
    total = l0 * 0.0
    for r in tl.static_range(TOP_K):
        er = tl.exp(_value(best, F16) - l0)
        total += er  # in rank order: the same sum in every kernel
        ids = tl.where(rank == r, _id(best), ids)
        e = tl.where(rank == r, er, e)
        if r + 1 < TOP_K:  # the next rank's key (one max a round, none after the last)
            keys = tl.where(keys == best, NONE, keys)
            best = tl.max(keys, axis=0)
    return ids, e / total


@triton.jit
def store_route(logits_ptr, weights_ptr, ids_ptr, shared_ptr, E, TOP_K: tl.constexpr, KP: tl.constexpr,
                BLOCK_E: tl.constexpr, F16: tl.constexpr, OUT_BF16: tl.constexpr):
    """route_weights' top-k of 16-bit logits stored as route_topk's outputs, and the shared gate's sigmoid; returns
    the ids ([KP] int32, 0 past TOP_K) for a kernel that goes on with them (the slot cache's ensure)."""
    ids, weights = route_weights(logits_ptr, E, TOP_K, KP, BLOCK_E, F16)
    rank = tl.arange(0, KP)
    _store_exact(weights_ptr + rank, weights, rank < TOP_K, OUT_BF16)
    tl.store(ids_ptr + rank, ids.to(tl.int64), mask=rank < TOP_K)
    gate = tl.load(logits_ptr + E).to(tl.float32)
    tl.store(shared_ptr, 1.0 / (1.0 + tl.exp(-gate)))
    return ids


def route_args(route: tuple | None, trace_ids: torch.Tensor | None) -> dict:
    """A kernel's keyword arguments for route= (a launch that does route_topk's work: store_route), after checking
    them: route = (logits [E + 1] bf16/fp16, E, weights_out [1, k], ids_out [1, k] int64, shared_out [1] fp32);
    trace_ids: a benchmark trace's ids [1, k] (ROUTE 2: those rows, the outs still route_topk's), or None
    (ROUTE 1). None for no route: no keywords."""
    if route is None:
        return {}
    logits, experts, weights, ids, shared = route
    k = ids.shape[-1]
    flat = check_route_logits(logits, experts, k)
    if (ids.dtype != torch.int64 or ids.shape != (1, k) or weights.shape != (1, k) or shared.numel() != 1
            or shared.dtype != torch.float32):
        raise ValueError("route's outs must be (weights [1, k], ids [1, k] int64, shared_scale [1] fp32)")
    if trace_ids is not None and trace_ids.shape[-1] != k:
        raise ValueError(f"the trace's ids must be [1, {k}] like route's, got {tuple(trace_ids.shape)}")
    return dict(logits_ptr=flat, E=experts, wts_out_ptr=exact_out(weights), ids_out_ptr=ids, shared_out_ptr=shared,
                ROUTE=2 if trace_ids is not None else 1, BLOCK_E=triton.next_power_of_2(experts),
                F16=flat.dtype == torch.float16, W_BF16=weights.dtype == torch.bfloat16)
