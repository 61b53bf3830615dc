"""The sampler's draw in two launches: runtime/sampler.sample_tensor's inverse CDF over the top-k (or over the whole
vocabulary, no cut), from the fp32 logits of one token.

Why: sample_tensor is ~8 small torch launches a token over 248,320 logits (topk or a scan, softmax, two cumsums,
searchsorted, ...): 92 us a token on the H200's path between two decode steps (docs/RESULTS.md session 21), ~5 %
of the rate a chat user sees. Here:
  1. candidates: one program a chunk of CHUNK logits; with top-k, the chunk's k best as int64 keys (the fp32
     score's order-preserving bits above the index, so that one integer max a round finds the largest score and,
     among equal ones, the lowest id); without a cut, the chunk's max and sum of exp(score - max);
  2. pick (one program): the k best of all chunks' keys (k rounds of a max), softmax, top-p's cut, the CDF and
     the pick at u * its total; without a cut, the chunk where the mass reaches u * total, then the id in it.
The uniform u is sample_tensor's (one draw of its CPU generator), so a seed draws the same token as the torch
path, up to the order of the float sums (softmax's total, the CDF) where u falls within an ulp of a boundary.
top_k in 1..MAX_K, or no cut at all; top_p < 1 without top_k (a full sort) stays on the torch path (handles()).
On by default for CUDA logits (the switch sampler.FUSED_DRAW) since its GPU A/B (bench_chat_loop.py's arm
"fused", docs/RESULTS.md session 22: the chat loop 1.041-1.056x). Reference: runtime/sampler.draw, the torch path
itself with a given u.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

CHUNK = 2048  # logits a program of the candidates' launch: 122 programs for Qwen3.6's 248,320
MAX_K = 64  # top-k beyond this stays on the torch path (the pick's rounds are one max each)
NONE = tl.constexpr(-9223372036854775807 - 1)  # below every key


@triton.jit
def _keys(scores, ids):
    """int64 keys ordered as (score, -id): the fp32 bits made monotone as a signed int32, above 2^31 - 1 - id (so
    that the lower id wins a tie)."""
    bits = scores.to(tl.int32, bitcast=True)
    mono = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    return (mono.to(tl.int64) << 32) + (2147483647 - ids).to(tl.int64)


@triton.jit
def _score(key):
    mono = (key >> 32).to(tl.int32)
    return tl.where(mono >= 0, mono, mono ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)


@triton.jit
def _id(key):
    return (2147483647 - (key & 0xFFFFFFFF)).to(tl.int32)


@triton.jit
def _top_keys(keys, TOP_K: tl.constexpr, KP: tl.constexpr):
    """[KP] the TOP_K largest keys in descending order (NONE after them): one max a round, the found one removed."""
    rank = tl.arange(0, KP)
    top = tl.full([KP], NONE, tl.int64)
    for r in tl.static_range(TOP_K):
        best = tl.max(keys, axis=0)
        top = tl.where(rank == r, best, top)
        keys = tl.where(keys == best, NONE, keys)
    return top


@triton.jit
def candidates_kernel(logits_ptr, cand_ptr, V, temperature, TOP_K: tl.constexpr, KP: tl.constexpr,
                      CHUNK: tl.constexpr):
    """Program p: logits p * CHUNK ...; TOP_K > 0: their k best keys at cand[p * KP ...] (NONE past k or past the
    chunk's logits); TOP_K 0: (max, sum of exp(score - max)) at cand[2p], cand[2p + 1] as fp32 bits."""
    p = tl.program_id(0)
    ids = p * CHUNK + tl.arange(0, CHUNK)
    valid = ids < V
    scores = tl.math.div_rn(tl.load(logits_ptr + ids, mask=valid, other=0.0).to(tl.float32), temperature)
    if TOP_K > 0:
        best = _top_keys(tl.where(valid, _keys(scores, ids), NONE), TOP_K, KP)
        tl.store(cand_ptr + p * KP + tl.arange(0, KP), best)
    else:
        scores = tl.where(valid, scores, float("-inf"))
        m = tl.max(scores, axis=0)
        s = tl.where(m == float("-inf"), 0.0, tl.sum(tl.exp(scores - m), axis=0))  # a chunk of -inf: no mass
        tl.store(cand_ptr + 2 * p, m.to(tl.int32, bitcast=True).to(tl.int64))
        tl.store(cand_ptr + 2 * p + 1, s.to(tl.int32, bitcast=True).to(tl.int64))


@triton.jit
def pick_kernel(logits_ptr, cand_ptr, out_ptr, V, temperature, top_p, u, P, TOP_K: tl.constexpr, KP: tl.constexpr,
                BLOCK: tl.constexpr, CHUNK: tl.constexpr, CUT_P: tl.constexpr):
    """One program: the drawn id at out[0] (int64). BLOCK: a power of 2 >= P * KP (TOP_K > 0) or >= P."""
    at = tl.arange(0, BLOCK)
    if TOP_K > 0:
        top = _top_keys(tl.load(cand_ptr + at, mask=at < P * KP, other=NONE), TOP_K, KP)
        rank = tl.arange(0, KP)
        kept = rank < TOP_K
        scores = tl.where(kept, _score(top), float("-inf"))
        e = tl.exp(scores - tl.max(scores, axis=0))
        probs = e / tl.sum(e, axis=0)
        if CUT_P:  # the smallest prefix whose mass reaches top_p (the first always kept)
            probs = tl.where(tl.cumsum(probs, axis=0) - probs >= top_p, 0.0, probs)
        cdf = tl.cumsum(probs, axis=0)
        target = tl.sum(tl.where(rank == TOP_K - 1, cdf, 0.0), axis=0) * u
        pick = tl.minimum(tl.sum((kept & (cdf <= target)).to(tl.int32), axis=0), TOP_K - 1)
        tl.store(out_ptr, tl.sum(tl.where(rank == pick, _id(top), 0), axis=0).to(tl.int64))
    else:
        chunk = at < P
        m = tl.load(cand_ptr + 2 * at, mask=chunk, other=0).to(tl.int32).to(tl.float32, bitcast=True)
        s = tl.load(cand_ptr + 2 * at + 1, mask=chunk, other=0).to(tl.int32).to(tl.float32, bitcast=True)
        m = tl.where(chunk, m, float("-inf"))
        top = tl.max(m, axis=0)
        w = tl.where(chunk, s * tl.exp(m - top), 0.0)
        cum = tl.cumsum(w, axis=0)
        target = tl.sum(w, axis=0) * u
        c = tl.minimum(tl.sum((chunk & (cum <= target)).to(tl.int32), axis=0), P - 1)
        before = tl.sum(tl.where(at < c, w, 0.0), axis=0)
        ids = c * CHUNK + tl.arange(0, CHUNK)
        valid = ids < V
        x = tl.math.div_rn(tl.load(logits_ptr + ids, mask=valid, other=0.0).to(tl.float32), temperature)
        e = tl.where(valid, tl.exp(x - top), 0.0)
        inside = tl.sum((valid & (before + tl.cumsum(e, axis=0) <= target)).to(tl.int32), axis=0)
        tl.store(out_ptr, tl.minimum(c * CHUNK + inside, V - 1).to(tl.int64))


def handles(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> bool:
    """Whether sample() draws this case: a sampled (not greedy) draw over 1-D contiguous logits with top-k in
    1..MAX_K (below the vocabulary) or no cut at all."""
    if temperature <= 0 or logits.dim() != 1 or not logits.is_contiguous():
        return False
    if top_k and top_k < logits.shape[0]:
        return top_k <= MAX_K
    return top_p >= 1.0


def sample(logits: torch.Tensor, temperature: float, top_k: int, top_p: float, u: float) -> torch.Tensor:
    """The id sample_tensor draws with uniform u, as a [1] int64 tensor on the logits' device; two launches, no
    host sync. The case must be one handles() accepts."""
    if not handles(logits, temperature, top_k, top_p):
        raise ValueError(f"sample_fused draws top-k 1..{MAX_K} or no cut over 1-D contiguous logits with "
                         f"temperature > 0; got {tuple(logits.shape)}, T={temperature}, top_k={top_k}, top_p={top_p}")
    v = logits.shape[0]
    k = top_k if top_k and top_k < v else 0
    kp = triton.next_power_of_2(max(k, 1))
    programs = triton.cdiv(v, CHUNK)
    cand = torch.empty(programs * (kp if k else 2), device=logits.device, dtype=torch.int64)
    out = torch.empty(1, device=logits.device, dtype=torch.int64)
    candidates_kernel[(programs,)](logits, cand, v, float(temperature), TOP_K=k, KP=kp, CHUNK=CHUNK, num_warps=4)
    block = triton.next_power_of_2(programs * kp if k else programs)
    pick_kernel[(1,)](logits, cand, out, v, float(temperature), float(top_p), float(u), programs, TOP_K=k, KP=kp,
                      BLOCK=block, CHUNK=CHUNK, CUT_P=bool(k) and top_p < 1.0, num_warps=8)
    return out
