"""The MoE router for one decode token in one launch: the router + shared-expert-gate GEMV, then, in the
program that finishes last, the softmax / top-k / renormalise / sigmoid tail of route_topk.

Why: the tail was a launch of its own, one program of one warp: 3.5 us a layer on the H200, 140 us of a
~2.5 ms resident step (docs/RESULTS.md, session 9), and a launch the GEMV's 129 programs had to finish before.
Here every program computes its tile of logits with gemv_multi's own tile code (the same config, so the same
logits byte for byte), counts its arrival (launch.last_to_arrive), and the last one reads all E + 1 logits and
runs route_topk's tail (decode_router._route_tail, the same code). The outputs are route_topk's bytes; which
program is last changes nothing. Reference: gemv_multi then route_topk (and their own references).

Off until its GPU A/B (the module switch FUSED, profile_decode arm "router"); byte-equal either way.
"""
from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from .decode_norm import round_code
from .decode_router import _route_tail
from .gemv_multi import DENSE, _tile_product, _tile_rows, chunk_words, launch_config
from .launch import gdc_prologue, last_to_arrive, pdl_launch
from .nvfp4_triton import exact_out

FUSED = False


@triton.jit
def router_topk_kernel(x_ptr, logits_out_ptr, logits_ptr, w0, w1, n0, n1, p1, tiles, counter_ptr, weights_ptr,
                       ids_ptr, shared_ptr,
                       K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, CHUNK: tl.constexpr,
                       LOGITS_BF16: tl.constexpr, TOP_K: tl.constexpr, BLOCK_E: tl.constexpr,
                       WEIGHTS_BF16: tl.constexpr, FENCE: tl.constexpr, USE_GDC: tl.constexpr = False):
    """Tile pid of the [n0 router | n1 shared gate] rows (gemv_multi_kernel's dense tile, PARTS 2), then the
    tail in the last program to arrive. logits_out_ptr: the logits as _store_exact writes them (bf16 as int16
    bits); logits_ptr: the same bytes in their own dtype, as the tail reads them."""
    pid = tl.program_id(0)
    w, s, g, rows64, mask_n, out_rows = _tile_rows(pid, w0, w1, w0, w0, w0, w0, w0, w0, w0, w0, w0, w0,
                                                   n0, n1, 0, 0, p1, tiles, tiles, 2, BLOCK_N)
    gdc_prologue(USE_GDC)  # PDL: x (the previous kernel's output) is read only after this
    _tile_product(x_ptr, logits_out_ptr, w, s, g, rows64, mask_n, out_rows, K, 0, BLOCK_N, BLOCK_K, CHUNK,
                  LOGITS_BF16, False)
    if last_to_arrive(counter_ptr, tiles, FENCE):
        _route_tail(logits_ptr, weights_ptr, ids_ptr, shared_ptr, n0, TOP_K, BLOCK_E, WEIGHTS_BF16)


def router_topk(h: torch.Tensor, router_w: torch.Tensor, shared_gate: torch.Tensor, top_k: int,
                weights_dtype: torch.dtype, counter: torch.Tensor, *, num_warps: int | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """h [1, K]; router_w [E, K] and shared_gate [1, K], plain tensors of h's dtype -> (weights [1, k] in
    weights_dtype, ids [1, k] int64, shared_scale [1] fp32), the bytes of
    route_topk(gemv_multi(h, [router_w, shared_gate]), E, k, weights_dtype). counter:
    launch.new_counter(h.device), one per call site. One launch, no host sync."""
    for w in (router_w, shared_gate):
        if not isinstance(w, torch.Tensor) or w.dim() != 2 or w.dtype != h.dtype:
            raise ValueError(f"router_topk takes plain [N, K] weights in h's dtype {h.dtype}")
    e, k = router_w.shape
    if shared_gate.shape != (1, k) or h.numel() != k:
        raise ValueError(f"router_topk needs h [1, {k}] and shared_gate [1, {k}], got {tuple(h.shape)} and "
                         f"{tuple(shared_gate.shape)}")
    if not 1 <= top_k <= e:
        raise ValueError(f"top_k {top_k} must be in 1..{e}")
    if counter.dtype != torch.int32 or counter.numel() != 1 or counter.device != h.device:
        raise ValueError("counter must be launch.new_counter(h.device): one int32 on h's device")
    round_code(weights_dtype)
    cfg = launch_config(DENSE, e + 1, k, h.element_size(), h.device)
    if num_warps is not None:
        cfg = dataclasses.replace(cfg, num_warps=num_warps)
    router_w, shared_gate = router_w.contiguous(), shared_gate.contiguous()
    logits = torch.empty(1, e + 1, device=h.device, dtype=h.dtype)
    weights = torch.empty(1, top_k, device=h.device, dtype=weights_dtype)
    ids = torch.empty(1, top_k, device=h.device, dtype=torch.int64)
    shared = torch.empty(1, device=h.device, dtype=torch.float32)
    t0, t1 = triton.cdiv(e, cfg.block_n), triton.cdiv(1, cfg.block_n)
    router_topk_kernel[(t0 + t1,)](
        h.reshape(-1).contiguous(), exact_out(logits), logits, router_w, shared_gate, e, 1, t0, t0 + t1, counter,
        exact_out(weights), ids, shared, K=k, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        CHUNK=chunk_words(DENSE, cfg, h.element_size()), LOGITS_BF16=h.dtype == torch.bfloat16, TOP_K=top_k,
        BLOCK_E=triton.next_power_of_2(e), WEIGHTS_BF16=weights_dtype == torch.bfloat16,
        FENCE=h.device.type == "cuda", num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **pdl_launch(h.device))
    return weights, ids, shared
