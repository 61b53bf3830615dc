"""Attention batching's decision (model/attention_pairs.py) and its orchestration in layer-major prefill.

The verdict is a pure function of the plans' facts: tested on each condition. The layer-major loop's pair path
(each chunk's q/k/v and KV write, one attention call over both chunks, then each chunk's gate, projection and
MoE in order) is tested on the CPU with a backend whose pair call is, by construction, each chunk's own call:
the prefill must then be byte-equal to the one-call-per-chunk prefill (logits, KV, GDN states, slots), which
holds the orchestration (write order, routing rows, parking) to the bytes. The kernel's side (FlashInfer's call
over two chunks = two calls) is tests/test_gpu_attention_pairs.py's."""
import pytest
import torch

from qwenlocal.engine import Engine
from qwenlocal.engine.model.attention_backends import SdpaAttention, sdpa_causal
from qwenlocal.engine.model.attention_pairs import AttentionPairs, PlanFacts, pair_verdict

FA3 = PlanFacts("fa3", 128, False, False)
CHUNK = 64


def fa2(tile=128, split=False):
    return PlanFacts("fa2", tile, split, True)


def test_the_verdict_pairs_only_what_is_byte_identical():
    assert pair_verdict(FA3, FA3, FA3, 8192, 8) is None
    assert pair_verdict(fa2(), fa2(), fa2(), 8192, 8) is None
    assert "splits" in pair_verdict(fa2(), fa2(split=True), fa2(), 8192, 8)
    assert "tiles differ" in pair_verdict(fa2(64), fa2(), fa2(), 8192, 8)
    # FA3 tiles each head's tokens: 100 tokens start the second chunk inside a 128-row tile
    assert "inside a q tile" in pair_verdict(FA3, FA3, FA3, 100, 8)
    # FA2 packs the group: 16 tokens x 8 heads = 128 rows is a whole tile, 12 x 8 = 96 is not
    assert pair_verdict(fa2(), fa2(), fa2(), 16, 8) is None
    assert "inside a q tile" in pair_verdict(fa2(), fa2(), fa2(), 12, 8)
    assert "backend" in pair_verdict(PlanFacts("cudnn", 0, True, False), FA3, FA3, 8192, 8)


class FactsBackend:
    """plan_facts from a rule; counts the probes."""

    num_heads, num_kv_heads = 16, 2

    def __init__(self, rule):
        self.rule, self.probes = rule, []

    def plan_facts(self, qo_len, kv_len):
        self.probes.append((qo_len, kv_len))
        return self.rule(qo_len, kv_len)


def test_the_plan_groups_adjacent_pairs_and_counts_the_fallbacks():
    # FA2 splits the KV of a short chunk at a long KV: chunk 2 (64 rows at kv 8,256) splits, so it runs alone
    rule = lambda qo, kv: fa2(split=qo < 100 and kv > 4000)  # noqa: E731
    pairs = AttentionPairs(enabled=True)
    backend = FactsBackend(rule)
    groups = pairs.plan(backend, 0, [4096, 4096, 64, 4096, 4096])
    assert groups == [(0, 1), (2,), (3, 4)]
    assert pairs.counters() == {"attention_pairs": 2, "attention_pair_fallbacks": 1}
    assert "splits" in pairs.last_reason
    probes = len(backend.probes)
    pairs.plan(backend, 0, [4096, 4096, 64, 4096, 4096])  # the same window again: every fact cached
    assert len(backend.probes) == probes
    pairs.force = True  # the negative control's switch: pair regardless
    assert pairs.plan(backend, 0, [4096, 4096, 64, 4096, 4096]) == [(0, 1), (2, 3), (4,)]


def test_fa3_is_probed_once_and_a_disabled_plan_is_all_singles():
    backend = FactsBackend(lambda qo, kv: FA3)
    pairs = AttentionPairs(enabled=True)
    assert pairs.plan(backend, 0, [8192] * 5 + [1000]) == [(0, 1), (2, 3), (4, 5)]
    assert len(backend.probes) == 1  # FA3's facts do not depend on the lengths
    off = AttentionPairs(enabled=False)
    assert off.plan(backend, 0, [8192] * 4) == [(0,), (1,), (2,), (3,)]


class PairedSdpa(SdpaAttention):
    """SDPA whose prefill pairs every two chunks; a pair's call attends each chunk on its own (so the bytes are
    those of one call per chunk by construction: what FlashInfer's verdict guarantees on the GPU)."""

    def __init__(self, *args):
        super().__init__(*args)
        self.pairs = AttentionPairs(enabled=True)
        self.pair_calls = 0
        self._prepared = None

    def pair_plan(self, start, lengths):
        groups = [tuple(range(i, min(i + 2, len(lengths)))) for i in range(0, len(lengths), 2)]
        self.lengths = dict(zip(range(len(lengths)), lengths))
        self.pairs.pairs += sum(len(g) == 2 for g in groups)
        return groups

    def prepare(self, start, t, decode):
        self._prepared = (start, t)

    def attend_rows(self, kv, q, start, decode):
        assert decode or self._prepared == (start, q.shape[0])  # the plan made for exactly this call
        if decode or q.shape[0] <= CHUNK:
            return super().attend_rows(kv, q, start, decode)
        self.pair_calls += 1
        outs, at = [], start
        for part in q.split(CHUNK):
            k_all, v_all = kv.read(at + part.shape[0])
            outs.append(sdpa_causal(part, k_all, v_all, at, self.head_dim ** -0.5))
            at += part.shape[0]
        return torch.cat(outs)


@pytest.mark.parametrize("length,extra", [(CHUNK * 4, {}), (CHUNK * 5 + 13, {}),
                                          (CHUNK * 5 + 13, {"prefill_window": 2 * CHUNK}),
                                          (CHUNK * 4, {"routing": {"seed": 3, "skew": 1.0, "reuse": 0.5, "window": 4, "length": 1000}})])
def test_the_pair_path_of_layer_major_is_byte_equal_to_one_call_per_chunk(tiny_ckpt, length, extra):
    """Also in windows (pairs are planned per window) and with a benchmark's routing trace (whose rows each
    chunk's MoE must advance to, in the pair path too)."""
    base = {"prefill_chunk": CHUNK, "expert_slots": 20, "prefill_mode": "layer-major", **extra}
    plain = Engine.from_pretrained(tiny_ckpt, device="cpu", options=base)
    paired = Engine.from_pretrained(tiny_ckpt, device="cpu", options=base)
    a = paired.model.cfg.attention
    backend = PairedSdpa(a.num_heads, a.num_kv_heads, a.head_dim)
    object.__setattr__(paired.model.kernels, "attention", backend)
    for layer in paired.model.layers:
        if layer.is_attention:
            layer.mixer.backend = backend
    ids = torch.randint(0, 600, (length,), generator=torch.Generator().manual_seed(length))
    sa, sb = plain.runner.new_state(), paired.runner.new_state()
    la = plain.runner.prefill(sa, ids, all_logits=True)
    lb = paired.runner.prefill(sb, ids, all_logits=True)
    window = extra.get("prefill_window", length)
    pairs = sum(-(-min(window, length - w0) // CHUNK) // 2 for w0 in range(0, length, window))
    attention_layers = sum(layer.is_attention for layer in paired.model.layers)
    assert pairs >= 1 and backend.pair_calls == attention_layers * pairs  # the pair path ran, every attention layer
    assert torch.equal(la, lb)
    for i in sa.kv:
        assert torch.equal(sa.kv[i].k[:length], sb.kv[i].k[:length])
        assert torch.equal(sa.kv[i].v[:length], sb.kv[i].v[:length])
    assert all(torch.equal(sa.recurrent[i], sb.recurrent[i]) for i in sa.recurrent)
    assert all(torch.equal(sa.conv[i], sb.conv[i]) for i in sa.conv)
    ca, cb = plain.model.cache, paired.model.cache
    assert torch.equal(ca.slot_key, cb.slot_key) and torch.equal(ca.rows, cb.rows)
    for tok in (5, 9):  # decode right after resumes identically
        assert torch.equal(plain.runner.decode(sa, torch.tensor([tok])), paired.runner.decode(sb, torch.tensor([tok])))


def test_the_fa2_prefill_workspace_holds_the_largest_split():
    from qwenlocal.engine.model.attention_backends import prefill_workspace_bytes

    mib = 2**20
    assert prefill_workspace_bytes("fa3", 16, 2, 256, 132) == 128 * mib  # FA3 never splits the KV
    # The plan that failed on the H200 (FA2, 64-token chunks at 16K): tmp_v 128 MiB + tmp_s 512 KiB did not fit
    h200 = prefill_workspace_bytes("fa2", 16, 2, 256, 132)
    assert h200 >= 16 * 132 * 128 * 256 * 4 * (1 + 1 / 256) > 128 * mib + 512 * 1024
    assert prefill_workspace_bytes("fa2", 16, 2, 256, 70) >= 16 * 70 * 128 * 256 * 4  # a 70-SM card: 147 MB
    assert prefill_workspace_bytes("fa2", 4, 2, 64, 20) == 128 * mib  # small geometries keep the default
