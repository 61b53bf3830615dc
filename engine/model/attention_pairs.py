"""Attention batching (seed 003): one FlashInfer prefill call over two adjacent chunks of a layer-major pass, only
where that call gives each chunk exactly the bytes of its own call; otherwise one call per chunk.

Why the bytes can match: a prefill kernel computes each q tile (CTA_TILE_Q rows) over the KV up to the tile's
causal end, and that end depends only on the tile's positions (kv_len - qo_len is the first chunk's start in
both calls). So the pair's call repeats each chunk's own work tile for tile when
- both chunks' own plans and the pair's plan use the same CTA_TILE_Q (it fixes the tiles and the kernel variant),
- no plan splits the KV (a split's partial-softmax merge rounds by its split points, which FA2 chooses from the
  plan's CTA count: a short chunk at a long KV splits, and the pair would split elsewhere),
- the second chunk starts on a q-tile boundary (FA2 packs the GQA group's heads into a tile's rows, so its rows
  are chunk x group; FA3 tiles each head's tokens),
- one request, causal, one page size: the only way this engine calls the prefill wrapper.
FA3 (sm_90) never splits the KV and fixes its tile by the head dim (PrefillSM90Plan in FlashInfer's
scheduler.cuh: 128, 192 for head dim 64); FA2's tile and split come from its plan info ([3] and [14] of
PrefillPlanInfo::ToVector). Other backends are not paired. The facts are keyed by (qo_len, kv_len): everything
else a plan depends on (heads, head dim, page size, dtypes, causal, the device's SM count) is fixed per wrapper
(the seed's fork keyed its cache by rows alone, wrong once the split depends on the KV length).
"""
from __future__ import annotations

from dataclasses import dataclass

PAIRED_BACKENDS = ("fa2", "fa3")
MAX_FACTS = 4096  # cached plan facts (a 120K prompt in 8,192-token chunks needs ~45)


@dataclass(frozen=True)
class PlanFacts:
    backend: str
    cta_tile_q: int
    split_kv: bool
    packs_gqa: bool  # a tile's rows are tokens x the GQA group's heads (FA2), not one head's tokens (FA3)


def plan_facts(wrapper, head_dim: int) -> PlanFacts:
    """What a planned FlashInfer prefill wrapper (ragged or paged) will run with (after its plan())."""
    backend = wrapper._backend
    if backend == "fa3":
        return PlanFacts("fa3", 192 if head_dim == 64 else 128, False, False)
    if backend == "fa2":
        info = wrapper._plan_info
        return PlanFacts("fa2", int(info[3]), bool(info[14]), True)
    return PlanFacts(str(backend), 0, True, False)


def pair_verdict(first: PlanFacts, second: PlanFacts, pair: PlanFacts, first_len: int, group: int) -> str | None:
    """None where one call over both chunks gives each its own call's bytes; else why not (pure)."""
    facts = (first, second, pair)
    if any(f.backend not in PAIRED_BACKENDS for f in facts):
        return f"backend {pair.backend} is not one whose tiles are known"
    if len({f.cta_tile_q for f in facts}) > 1:
        return f"the plans' q tiles differ ({first.cta_tile_q}/{second.cta_tile_q}/{pair.cta_tile_q})"
    if any(f.split_kv for f in facts):
        return "a plan splits the KV"
    rows = first_len * (group if pair.packs_gqa else 1)
    if rows % pair.cta_tile_q:
        return f"the second chunk starts inside a q tile ({rows} rows, tile {pair.cta_tile_q})"
    return None


class AttentionPairs:
    """Which chunks of a window share an attention call, and how often that held and fell back."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.force = False  # the GPU test's negative control: pair even where the verdict says no
        self.pairs = 0  # adjacent chunk pairs run as one call (per window: every attention layer uses them)
        self.fallbacks = 0  # adjacent pairs the verdict kept apart
        self.last_reason: str | None = None
        self._facts: dict[tuple[int, int], PlanFacts] = {}
        self._fixed: PlanFacts | None = None  # FA3: the same facts for every length

    def counters(self) -> dict:
        return {"attention_pairs": self.pairs, "attention_pair_fallbacks": self.fallbacks}

    def _facts_for(self, backend, qo_len: int, kv_len: int) -> PlanFacts:
        if self._fixed is not None:
            return self._fixed
        key = (qo_len, kv_len)
        if key not in self._facts:
            if len(self._facts) >= MAX_FACTS:
                self._facts.clear()
            facts = backend.plan_facts(qo_len, kv_len)
            if facts.backend == "fa3":
                self._fixed = facts
            self._facts[key] = facts
        return self._facts[key]

    def plan(self, backend, start: int, lengths: list[int]) -> list[tuple[int, ...]]:
        """Chunk indices grouped in order: (i, i + 1) where paired, (i,) alone."""
        if not self.enabled or len(lengths) < 2:
            return [(i,) for i in range(len(lengths))]
        group = backend.num_heads // backend.num_kv_heads
        starts = [start + sum(lengths[:i]) for i in range(len(lengths))]
        out, i = [], 0
        while i < len(lengths):
            if i + 1 < len(lengths):
                a, la, lb = starts[i], lengths[i], lengths[i + 1]
                why = pair_verdict(self._facts_for(backend, la, a + la), self._facts_for(backend, lb, a + la + lb),
                                   self._facts_for(backend, la + lb, a + la + lb), la, group)
                if why is None or self.force:
                    out.append((i, i + 1))
                    self.pairs += 1
                    i += 2
                    continue
                self.fallbacks += 1
                self.last_reason = why
            out.append((i,))
            i += 1
        return out
