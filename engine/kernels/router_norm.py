"""The post-mixer residual add + RMSNorm computed by every program of the MoE router's GEMV, not in a launch of
its own: each program reads the residual and the mixer's output (2 x 4 KB at the real size), does add_rms_norm's
row itself (decode_norm._add_rms_norm_row, the same code) and multiplies its rows of the router + shared-gate
weights by the normed row while it is still in registers.

Why: that norm was a one-program launch, 40 a step at 2.52 us each (101 us of the resident 16K step, docs/
RESULTS.md session 10), a dependent phase the router GEMV then waited on. Folding it into the producer's last
program (gemv_norm, parts_norm) kept the phase and lost (call 1 of session 10); here it is done redundantly, in
parallel, by the consumer, so the phase is gone. Program 0 stores the new residual and the normed row (the
experts read it after the router's top-k).

Bytes: the residual and the normed row are add_rms_norm's row code, so its bytes in the interpreter; on a GPU
the sum of squares is laid out by this launch's warps (an ulp of rstd where it differs). The logits are each
row's fp32 dot product in one order of this tile (not gemv_multi's chunked order): gemv_multi's within rounding.
No ordering between programs: each one reads only what the launches before it wrote.
Reference: add_rms_norm then gemv_multi. On by default (the module switch FUSED): paired on the H200, resident
16K, 5 rounds, the step 2.096 against 2.136 ms, faster in every round (ratios 0.971-0.984; docs/RESULTS.md
session 11, call 2).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .decode_norm import _add_rms_norm_row, round_code
from .launch import gdc_prologue, pdl_launch
from .nvfp4_int_dot import quantize_row_block, x16_buffers
from .nvfp4_hilo import hilo_buffers, quantize_row_block_hilo
from .nvfp4_triton import _store_exact, exact_out

FUSED = True  # measured: docs/RESULTS.md session 11 call 2 (the profile_decode arm "routernorm")
# x's int16 blocks recomputed from memory (rq16) lost 1.74x the step (docs/RESULTS.md session 21); history: 52f5195
# (Tried: route_topk's packed-key top-k in this launch's last program to arrive; removed after its A/B,
# docs/RESULTS.md session 18: 1.017x the step.)


@triton.jit
def router_norm_kernel(x_ptr, delta_ptr, norm_w_ptr, new_x_ptr, normed_ptr, router_ptr, gate_ptr, logits_ptr, E,
                       eps, K: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, ROUND: tl.constexpr,
                       USE_GDC: tl.constexpr = False, pairs_ptr=None, scales_ptr=None, QUANT: tl.constexpr = False):
    """Program pid: rows pid * BLOCK_N ... of [router (E rows) | shared gate (row E)] times the normed row;
    program 0 also stores the new residual and the normed row (int16 views for bf16); QUANT: the programs store
    the normed row's nvfp4_int_dot int16 blocks pid, pid + programs, ... (the integer gate/up's input); QUANT 2:
    nvfp4_hilo's high / low bytes of them instead (pairs_ptr: int8 [2 K]; the tensor-core gate/up's input)."""
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = rows <= E
    cols = tl.arange(0, BLOCK_H)
    mask_k = cols < K
    r64 = rows.to(tl.int64)
    base = tl.where(r64 < E, router_ptr + r64 * K, gate_ptr + (r64 - E) * K)
    tile = tl.load(base[:, None] + cols[None, :], mask=mask_n[:, None] & mask_k[None, :],
                   other=0.0)  # weights: nothing of this step writes them, so before the PDL wait
    gdc_prologue(USE_GDC)  # PDL: the residual and the mixer's output are read only after this
    normed = _add_rms_norm_row(x_ptr, delta_ptr, norm_w_ptr, new_x_ptr, normed_ptr, 0, K, 0, 0, 0, 0, eps, 0,
                               True, ROUND, BLOCK_H, 0, FIRST_STORES=True)
    logits = tl.sum(tile.to(tl.float32) * normed[None, :], axis=1)
    _store_exact(logits_ptr + rows, logits, mask_n, ROUND == 1)
    if QUANT:  # each program its share of the blocks (at the real size one each), not program 0 all of them
        # pairs_ptr: the pairs as int16
        for b in range(pid, K // 16, tl.num_programs(0)):
            if QUANT == 2:
                quantize_row_block_hilo(normed, b, pairs_ptr, scales_ptr, K, BLOCK_H)
            else:
                quantize_row_block(normed, b, pairs_ptr, scales_ptr, BLOCK_H)


def router_norm(x: torch.Tensor, delta: torch.Tensor, norm_w: torch.Tensor, eps: float, router_w: torch.Tensor,
                shared_gate: torch.Tensor, *, num_warps: int | None = None, quantize: bool | str = False) -> tuple:
    """x, delta [1, K] (the residual, the mixer's projected output), norm_w [K]; router_w [E, K] and shared_gate
    [1, K] plain tensors of x's dtype -> (new_x [1, K], normed [1, K], logits [1, E + 1]): add_rms_norm(x, delta,
    norm_w, eps)'s bytes (an ulp of rstd on a GPU), then gemv_multi(normed, [router_w, shared_gate]) within the
    rounding of another summation order (see above). One launch, no host sync. quantize (K a multiple of 16):
    also normed as nvfp4_int_dot.quantize_x16's (pairs, scales), a fourth result; "hilo": as nvfp4_hilo.
    quantize_hilo's (bytes, scales)."""
    k = x.shape[-1]
    for name, t in (("x", x), ("delta", delta)):
        if t.shape != (1, k) or t.stride(-1) != 1:
            raise ValueError(f"router_norm takes {name} as [1, {k}] with stride-1 columns, got {tuple(t.shape)}")
    if norm_w.shape != (k,):
        raise ValueError(f"norm_w must be [{k}], got {tuple(norm_w.shape)}")
    for w in (router_w, shared_gate):
        if not isinstance(w, torch.Tensor) or w.dim() != 2 or w.dtype != x.dtype or w.shape[1] != k:
            raise ValueError(f"router_norm takes plain [N, {k}] weights in x's dtype {x.dtype}")
    if shared_gate.shape[0] != 1:
        raise ValueError(f"shared_gate must be [1, {k}], got {tuple(shared_gate.shape)}")
    if k > 8192:
        raise ValueError(f"the norm keeps a row in registers: K {k} > 8192")
    e = router_w.shape[0]
    block_n = 2 if x.device.type == "cuda" else 32  # the interpreter's time goes by programs
    new_x = torch.empty(1, k, device=x.device, dtype=x.dtype)
    normed = torch.empty(1, k, device=x.device, dtype=x.dtype)
    logits = torch.empty(1, e + 1, device=x.device, dtype=x.dtype)
    hilo = quantize == "hilo"
    xq = (hilo_buffers if hilo else x16_buffers)(k, x.device) if quantize else (None, None)
    router_norm_kernel[(triton.cdiv(e + 1, block_n),)](
        x, delta.contiguous(), norm_w, exact_out(new_x), exact_out(normed), router_w.contiguous(),
        shared_gate.contiguous(), exact_out(logits), e, eps,
        K=k, BLOCK_H=triton.next_power_of_2(k), BLOCK_N=block_n, ROUND=round_code(x.dtype),
        num_warps=num_warps or 2, **pdl_launch(x.device),
        pairs_ptr=None if not quantize else xq[0] if hilo else xq[0].view(torch.int16), scales_ptr=xq[1],
        QUANT=2 if hilo else bool(quantize))
    return (new_x, normed, logits, xq) if quantize else (new_x, normed, logits)
