"""Batch-1 GQA decode attention over a sequence's KV rows in one launch: split-KV partials and their merge by
the last programs to arrive (launch.last_to_arrive), no merge kernel.

Why: FlashInfer's decode on the H200 at 16K (prefill kernel, split KV, then its merge-states kernel) took 19.4 +
6.6 us a layer for 33.6 MB of KV (1.3 TB/s, docs/RESULTS.md session 9), against 8.0 us at HBM speed.
Here the grid is (kv heads, SPLITS): program (h, s) takes one run of positions, the query heads of KV head h
(GQA) as the rows of one tile, and leaves an unnormalised partial (acc [G, D], running max m and sum l).
Merging is in two levels:
  - the last of each GROUP of splits merges their partials, in split order;
  - the last group of a head merges the groups' results, in group order, and stores the bf16 output.
The KV length is the position + 1, read on the device (the step is captured in a CUDA graph), so the grid is
fixed and every program runs, an empty run leaving an empty partial. Deterministic: fixed order everywhere.

The KV rows are FlashInferAttention.decode_rows' view: one sequence owns the pages in order, so row p is
position p ([rows, kv heads, D], contiguous), and the step's k and v are already in row `position`.
Reference: decode_attention_reference below (softmax(q k^T * scale) v over rows 0..position, GQA by
repeat_interleave, fp32). On by default since its GPU A/B (session 10: the step's median ratio 0.974, five rounds
of five faster; 18.3 us a layer against FlashInfer's 19.2 + 6.6); the module switch TRITON, profile_decode arm
"no-attn" to compare. With it the CUDA graph's replay makes no FlashInfer plan (runtime/graph.py).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import gdc_prologue, last_to_arrive, pdl_launch
from .nvfp4_triton import _store_exact, exact_out

TRITON = True  # on: won the paired GPU A/B (docs/RESULTS.md session 10)
SPLITS = 64  # per KV head: 2 heads x 64 ~ one program an SM of an H200
GROUP = 8  # splits merged by one program first, then the groups by one program
BLOCK_T = 64  # positions a step of a program's loop
# The merge left to the output gate's launch (attention_merge.py: decode_attention_parts, then merge_gate): no
# last-to-arrive tails in this launch and no sigmoid_gate_mul; SPLITS (arm value "attnsplits") may be any power
# of 2, the merge being one load a program. Its GPU A/B (arm "attnmerge", docs/RESULTS.md session 21): 0.982x the
# resident 16K step back to back, 7 of 7 rounds. On by default since session 22, whose call 1 passed the gates
# with it on (graph == eager on both small models, the bf16 level, offloaded == resident, the overlap and its
# control); session 21's unfinished run of that gate did not recur.
MERGE_APART = True


@triton.jit
def _merge(src_acc, src_ml, count, G: tl.constexpr, D: tl.constexpr, GP: tl.constexpr):
    """The partials at src (acc [count, G, D] fp32, ml [count, G, 2]) merged in order -> (acc, m, l)."""
    g, d = tl.arange(0, GP), tl.arange(0, D)
    gm = g < G
    m = tl.full([GP], float("-inf"), tl.float32)
    for i in range(count):
        m = tl.maximum(m, tl.load(src_ml + (i * G + g) * 2, mask=gm, other=float("-inf")))
    safe = tl.where(m == float("-inf"), 0.0, m)
    acc = tl.zeros([GP, D], tl.float32)
    l = tl.zeros([GP], tl.float32)
    for i in range(count):
        mi = tl.load(src_ml + (i * G + g) * 2, mask=gm, other=float("-inf"))
        w = tl.exp(mi - safe)
        l += w * tl.load(src_ml + (i * G + g) * 2 + 1, mask=gm, other=0.0)
        acc += w[:, None] * tl.load(src_acc + (i * G + g)[:, None] * D + d[None, :], mask=gm[:, None], other=0.0)
    return acc, m, l


@triton.jit
def _store_partial(dst_acc, dst_ml, acc, m, l, G: tl.constexpr, D: tl.constexpr, GP: tl.constexpr):
    g, d = tl.arange(0, GP), tl.arange(0, D)
    gm = g < G
    tl.store(dst_acc + g[:, None] * D + d[None, :], acc, mask=gm[:, None])
    tl.store(dst_ml + g * 2, m, mask=gm)
    tl.store(dst_ml + g * 2 + 1, l, mask=gm)


@triton.jit
def decode_attention_kernel(q_ptr, k_ptr, v_ptr, pos_ptr, out_ptr, part_acc, part_ml, grp_acc, grp_ml, counters_ptr,
                            scale, KVH, G: tl.constexpr, D: tl.constexpr, GP: tl.constexpr, SPLITS: tl.constexpr,
                            GROUP: tl.constexpr, BLOCK_T: tl.constexpr, OUT_BF16: tl.constexpr,
                            FENCE: tl.constexpr, DOT_F32: tl.constexpr = False, USE_GDC: tl.constexpr = False,
                            MERGE: tl.constexpr = True):
    """Program (h, s). part_*: [KVH, SPLITS, G, ...]; grp_*: [KVH, SPLITS / GROUP, G, ...]; counters: [KVH *
    (SPLITS / GROUP)] per group, then [KVH] per head, all 0 between launches. DOT_F32: the dots' operands
    in fp32 (Triton's interpreter, whose dot of bf16 operands is not the GPU's); else in the KV's dtype, p
    rounded to it (FlashAttention's choice), fp32 sums. MERGE False: the partials only (attention_merge.py merges
    them in the output gate's launch; no counters, no fence)."""
    gdc_prologue(USE_GDC)  # PDL: the step's q, k and v are read only after this
    h = tl.program_id(0)
    s = tl.program_id(1)
    NG: tl.constexpr = SPLITS // GROUP
    kv_len = tl.load(pos_ptr).to(tl.int32) + 1
    run = tl.cdiv(tl.cdiv(kv_len, SPLITS), BLOCK_T) * BLOCK_T  # positions a split, whole steps
    lo = s * run
    hi = tl.minimum(lo + run, kv_len)
    g, d = tl.arange(0, GP), tl.arange(0, D)
    gm = g < G
    q = tl.load(q_ptr + (h * G + g)[:, None] * D + d[None, :], mask=gm[:, None], other=0.0)  # [GP, D]
    if DOT_F32:
        q = q.to(tl.float32)
    m = tl.full([GP], float("-inf"), tl.float32)
    l = tl.zeros([GP], tl.float32)
    acc = tl.zeros([GP, D], tl.float32)
    row = KVH * D  # elements a position
    for t0 in range(lo, hi, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        tm = t < hi
        kt = tl.load(k_ptr + t[None, :].to(tl.int64) * row + h * D + d[:, None], mask=tm[None, :], other=0.0)
        if DOT_F32:  # fp32 operands: IEEE products, not TF32
            sc = tl.dot(q, kt.to(tl.float32), input_precision="ieee") * scale
        else:
            sc = tl.dot(q, kt) * scale  # [GP, BLOCK_T] fp32
        sc = tl.where(tm[None, :], sc, float("-inf"))
        m_new = tl.maximum(m, tl.max(sc, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(sc - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        vt = tl.load(v_ptr + t[:, None].to(tl.int64) * row + h * D + d[None, :], mask=tm[:, None], other=0.0)
        if DOT_F32:
            acc = acc * alpha[:, None] + tl.dot(p, vt.to(tl.float32), input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt)
        m = m_new
    part = (h * SPLITS + s) * G
    _store_partial(part_acc + part * D, part_ml + part * 2, acc, m, l, G, D, GP)
    if MERGE:  # else the partials only (attention_merge.py)
        grp = s // GROUP
        if last_to_arrive(counters_ptr + h * NG + grp, GROUP, FENCE):
            first = (h * SPLITS + grp * GROUP) * G
            acc, m, l = _merge(part_acc + first * D, part_ml + first * 2, GROUP, G, D, GP)
            at = (h * NG + grp) * G
            _store_partial(grp_acc + at * D, grp_ml + at * 2, acc, m, l, G, D, GP)
            if last_to_arrive(counters_ptr + KVH * NG + h, NG, FENCE):
                acc, m, l = _merge(grp_acc + h * NG * G * D, grp_ml + h * NG * G * 2, NG, G, D, GP)
                o = acc / tl.where(l == 0.0, 1.0, l)[:, None]
                _store_exact(out_ptr + (h * G + g)[:, None] * D + d[None, :], o, gm[:, None], OUT_BF16)


def _check_rows(q: torch.Tensor, k_rows: torch.Tensor, v_rows: torch.Tensor, block_t: int) -> tuple[int, int, int]:
    """(heads, kv heads, head_dim) of a call, or a ValueError that says what is wrong."""
    heads, d = q.shape[-2:]
    rows, kvh, dk = k_rows.shape
    contiguous = k_rows.is_contiguous() and v_rows.is_contiguous()
    if dk != d or v_rows.shape != k_rows.shape or heads % kvh or not contiguous:
        raise ValueError(f"k_rows / v_rows must be contiguous [rows, kv_heads, {d}] alike with heads {heads} a "
                         f"multiple of kv_heads, got {tuple(k_rows.shape)} and {tuple(v_rows.shape)}")
    if d & (d - 1) or d < 16:
        raise ValueError(f"head_dim {d} must be a power of 2 >= 16 (the tile's dot)")
    if block_t & (block_t - 1) or block_t < 16:
        raise ValueError(f"block_t {block_t} must be a power of 2 >= 16")
    return heads, kvh, d


def _launch(q, k_rows, v_rows, position, out, part_acc, part_ml, grp_acc, grp_ml, counters, kvh: int, splits: int,
            group: int, block_t: int, num_warps: int, num_stages: int, merge: bool) -> None:
    heads, d = q.shape[-2:]
    g, dev = heads // kvh, q.device
    decode_attention_kernel[(kvh, splits)](
        q.reshape(heads, d).contiguous(), k_rows, v_rows, position, out, part_acc, part_ml, grp_acc, grp_ml,
        counters, d ** -0.5, kvh, G=g, D=d, GP=max(16, triton.next_power_of_2(g)), SPLITS=splits, GROUP=group,
        BLOCK_T=block_t, OUT_BF16=q.dtype == torch.bfloat16, FENCE=merge and dev.type == "cuda",
        DOT_F32=dev.type != "cuda" or q.dtype == torch.float32, MERGE=merge,
        num_warps=num_warps, num_stages=num_stages, **pdl_launch(dev))  # 3 stages: 141 KB of smem at D 256


def decode_attention(q: torch.Tensor, k_rows: torch.Tensor, v_rows: torch.Tensor, position: torch.Tensor,
                     counters: torch.Tensor, *, splits: int = SPLITS, group: int = GROUP, block_t: int = BLOCK_T,
                     num_warps: int = 4, num_stages: int = 3) -> torch.Tensor:
    """q [1 (or none), heads, D] of one token; k_rows / v_rows [rows, kv heads, D] contiguous (row p: position p,
    this step's row already written); position int64 [1] on the device -> out [1, heads, D] in q's dtype:
    softmax(q k^T / sqrt(D)) v over rows 0..position, query head i on KV head i // (heads / kv heads).
    counters: launch.new_counter(device, kv_heads * (splits / group + 1)). One launch, no host sync."""
    heads, kvh, d = _check_rows(q, k_rows, v_rows, block_t)
    if splits % group:
        raise ValueError(f"splits {splits} must be a multiple of group {group}")
    if counters.dtype != torch.int32 or counters.numel() != kvh * (splits // group + 1) \
            or counters.device != q.device:
        raise ValueError(f"counters must be launch.new_counter(device, {kvh * (splits // group + 1)})")
    g, ng = heads // kvh, splits // group
    f32 = dict(device=q.device, dtype=torch.float32)
    part_acc, part_ml = torch.empty(kvh * splits * g * d, **f32), torch.empty(kvh * splits * g * 2, **f32)
    grp_acc, grp_ml = torch.empty(kvh * ng * g * d, **f32), torch.empty(kvh * ng * g * 2, **f32)
    out = torch.empty(1, heads, d, device=q.device, dtype=q.dtype)
    _launch(q, k_rows, v_rows, position, exact_out(out), part_acc, part_ml, grp_acc, grp_ml, counters, kvh, splits,
            group, block_t, num_warps, num_stages, True)
    return out


def decode_attention_parts(q: torch.Tensor, k_rows: torch.Tensor, v_rows: torch.Tensor, position: torch.Tensor, *,
                           splits: int | None = None, block_t: int | None = None, num_warps: int = 4,
                           num_stages: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """decode_attention's split partials without its merge (the kernel's MERGE off): (acc fp32 [kv heads, splits,
    G, D], ml fp32 [kv heads, splits, G, 2]) with G = heads / kv heads; acc unnormalised, ml = (running max,
    sum) of each split's run of positions (an empty run: -inf, 0). attention_merge.merge_gate finishes them.
    splits: a power of 2 (None: SPLITS); block_t (None: BLOCK_T), read at the call (profile_decode's arm values).
    Under the H200's Triton 3.6.0 (sm_90) the launch compiles to 162 registers and 1,392 instructions at the
    default 64 splits / 64 positions a step / 3 stages, against 230 and 2,408 with the merge; at 128 / 32 / 3 to
    128 registers and 74 KB of shared memory (three programs an SM)."""
    splits = SPLITS if splits is None else splits
    block_t = BLOCK_T if block_t is None else block_t
    heads, kvh, d = _check_rows(q, k_rows, v_rows, block_t)
    if splits & (splits - 1):
        raise ValueError(f"splits {splits} must be a power of 2 (the merge's tile)")
    f32 = dict(device=q.device, dtype=torch.float32)
    acc, ml = torch.empty(kvh, splits, heads // kvh, d, **f32), torch.empty(kvh, splits, heads // kvh, 2, **f32)
    _launch(q, k_rows, v_rows, position, acc, acc, ml, acc, ml, position, kvh, splits, splits, block_t, num_warps,
            num_stages, False)
    return acc, ml


def decode_attention_reference(q: torch.Tensor, k_rows: torch.Tensor, v_rows: torch.Tensor, position: int):
    """fp32 softmax(q k^T / sqrt(D)) v over rows 0..position, GQA by repeat_interleave -> [1, heads, D] fp32."""
    heads, d = q.shape[-2:]
    kvh = k_rows.shape[1]
    k = k_rows[:position + 1].float().repeat_interleave(heads // kvh, dim=1)  # [T, heads, D]
    v = v_rows[:position + 1].float().repeat_interleave(heads // kvh, dim=1)
    qf = q.reshape(heads, d).float()
    att = torch.softmax(torch.einsum("hd,thd->ht", qf, k) * d ** -0.5, dim=-1)
    return torch.einsum("ht,thd->hd", att, v)[None]
