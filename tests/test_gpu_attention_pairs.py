"""GPU tier of attention batching (model/attention_pairs.py): one FlashInfer prefill call over two adjacent
chunks gives each chunk the bytes of its own call wherever the verdict pairs them (FA3, the H200's backend, and
FA2, a consumer card's, at the model's attention geometry); a case that must fall back (FA2 splitting the KV of
short chunks at a long KV) does, and forcing the pair there changes the bytes (the negative control); and a
whole layer-major prefill with pairs gives the logits, KV and GDN states of one call per chunk."""
import pytest
import torch

from qwenlocal.engine import Engine
from qwenlocal.engine.model.attention_backends import FlashInferAttention, sdpa_causal

pytestmark = pytest.mark.gpu
HEADS, KV_HEADS, HEAD_DIM = 16, 2, 256  # Qwen3.6-35B-A3B's full attention


def _rows(n, heads, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(n, heads, HEAD_DIM, device="cuda", generator=gen).to(torch.bfloat16)


def _attend(backend: str, prefix: int, lengths: list[int], pair_them: bool, force: bool = False,
            prefill_kv: str = "ragged"):
    """Each chunk's attention output over a cache holding `prefix` earlier rows, one call per chunk or in the
    pairs the backend's pair_plan gives (force: pairs regardless of the verdict). -> (outputs, groups, pairs)."""
    total = prefix + sum(lengths)
    fi = FlashInferAttention(HEADS, KV_HEADS, HEAD_DIM, torch.bfloat16, torch.device("cuda"), total,
                             pairs=pair_them, backend=backend, prefill_kv=prefill_kv)
    fi.pairs.force = force
    kv = fi.new_kv(torch.bfloat16, torch.device("cuda"), total)
    if prefix:
        fi.write(kv, _rows(prefix, KV_HEADS, 1), _rows(prefix, KV_HEADS, 2), torch.arange(prefix, device="cuda"), 0)
    starts = [prefix + sum(lengths[:i]) for i in range(len(lengths))]
    qs = [_rows(n, HEADS, 10 + i) for i, n in enumerate(lengths)]
    groups = fi.pair_plan(prefix, lengths)
    outs = []
    for group in groups:
        for i in group:  # each chunk's k/v written before its call (the pair: both, as layer-major does)
            pos = torch.arange(starts[i], starts[i] + lengths[i], device="cuda")
            fi.write(kv, _rows(lengths[i], KV_HEADS, 100 + i), _rows(lengths[i], KV_HEADS, 200 + i), pos, starts[i])
        rows = [lengths[i] for i in group]
        fi.prepare(starts[group[0]], sum(rows), decode=False)
        out = fi.attend_rows(kv, torch.cat([qs[i] for i in group]), starts[group[0]], False)
        outs.extend(t.clone() for t in out.split(rows))
    torch.cuda.synchronize()
    return outs, groups, fi.pairs


# FA2 gets chunks long enough that its plans fill the SMs without splitting the KV (the engine's are 8,192).
@pytest.mark.parametrize("backend,prefix,lengths", [("auto", 0, [1024, 1024, 1024, 300]), ("auto", 8192, [2048, 2048, 777]),
                                                    ("fa2", 0, [4096, 4096, 4096, 777]), ("fa2", 8192, [4096, 4096, 777])])
def test_a_pair_call_gives_each_chunk_its_own_calls_bytes(backend, prefix, lengths):
    alone, groups_alone, _ = _attend(backend, prefix, lengths, pair_them=False)
    paired, groups, pairs = _attend(backend, prefix, lengths, pair_them=True)
    assert groups_alone == [(i,) for i in range(len(lengths))]
    assert any(len(g) == 2 for g in groups), pairs.last_reason  # the verdict paired them: the case is tested
    assert pairs.counters()["attention_pairs"] == sum(len(g) == 2 for g in groups)
    for a, b in zip(alone, paired):
        assert torch.equal(a, b)


def test_fa2_keeps_short_chunks_at_a_long_kv_apart_and_forcing_them_changes_the_bytes():
    prefix, lengths = 16384, [64, 64]  # 512 packed rows a chunk: a few CTAs, so FA2 splits the KV
    alone, _, _ = _attend("fa2", prefix, lengths, pair_them=False)
    kept, groups, pairs = _attend("fa2", prefix, lengths, pair_them=True)
    assert groups == [(0,), (1,)] and pairs.counters() == {"attention_pairs": 0, "attention_pair_fallbacks": 1}
    assert "splits" in pairs.last_reason
    assert all(torch.equal(a, b) for a, b in zip(alone, kept))
    forced, groups, _ = _attend("fa2", prefix, lengths, pair_them=True, force=True)
    assert groups == [(0, 1)]
    assert not all(torch.equal(a, b) for a, b in zip(alone, forced))  # the verdict's condition is real


def test_a_layer_major_prefill_with_pairs_is_byte_equal_to_one_call_per_chunk():
    # 384: two FA3 tiles of 192 rows at the small model's head dim 64; and a 100-token last chunk. One window:
    # at 40 slots the parked activations hold 5 chunks (a 6-chunk prompt ran as windows of 5 + 1, whose lone
    # chunks make no pair decision: session 13's call 3), so 3 chunks + 100 tokens.
    chunk = 384
    ids = torch.randint(0, 600, (3 * chunk + 100,), generator=torch.Generator().manual_seed(7))
    out = {}
    for pairs in ("on", "off"):
        eng = Engine.from_pretrained("synthetic:small-nvfp4", device="cuda", dtype=torch.bfloat16, options={
            "prefill_chunk": chunk, "prefill_mode": "layer-major", "expert_slots": 40, "attention_pairs": pairs})
        assert eng.plan["attention_pairs"]["value"] == ("pairs of chunks where byte-identical" if pairs == "on"
                                                        else "one call per chunk")
        state = eng.runner.new_state()
        logits = eng.runner.prefill(state, ids.cuda(), all_logits=True)
        torch.cuda.synchronize()
        out[pairs] = (logits, state, eng.stats())
    (a, sa, stats), (b, sb, _) = out["on"], out["off"]
    # (0,1) pair; (2,3) with its 100-token chunk pairs where its plan has the others' tile (FA3), else not
    assert stats["layer_major_windows"] == 1
    assert stats["attention_pairs"] >= 1 and stats["attention_pairs"] + stats["attention_pair_fallbacks"] == 2
    assert torch.equal(a, b)
    assert all(torch.equal(sa.recurrent[i], sb.recurrent[i]) for i in sa.recurrent)
    assert all(torch.equal(sa.conv[i], sb.conv[i]) for i in sa.conv)
    assert all(torch.equal(sa.kv[i].k, sb.kv[i].k) and torch.equal(sa.kv[i].v, sb.kv[i].v) for i in sa.kv)


# The last case: FA2 splits the KV of 64-token chunks at a 16K KV (its partials in the sized workspace).
@pytest.mark.parametrize("backend,prefix,lengths", [("auto", 4096, [2048, 999]), ("fa2", 4096, [2048, 999]),
                                                    ("fa2", 16384, [64, 64])])
def test_the_ragged_and_paged_readings_match_the_fp32_reference(backend, prefix, lengths):
    """The prefill reads the pages as rows (ragged, the default) or through the page table: other kernels, so
    other roundings, both at the bf16 level of torch's fp32 attention over the same cache."""
    outs = {kv: _attend(backend, prefix, lengths, pair_them=False, prefill_kv=kv)[0] for kv in ("ragged", "paged")}
    total = prefix + sum(lengths)
    k = torch.cat([_rows(prefix, KV_HEADS, 1)] + [_rows(n, KV_HEADS, 100 + i) for i, n in enumerate(lengths)])
    v = torch.cat([_rows(prefix, KV_HEADS, 2)] + [_rows(n, KV_HEADS, 200 + i) for i, n in enumerate(lengths)])
    at = prefix
    for i, n in enumerate(lengths):
        ref = sdpa_causal(_rows(n, HEADS, 10 + i).float(), k[: at + n].float(), v[: at + n].float(), at,
                          HEAD_DIM ** -0.5)
        for kv in ("ragged", "paged"):
            err = ((outs[kv][i].float() - ref).norm() / ref.norm()).item()
            assert err < 1e-2, (kv, i, err)
        at += n
    assert at == total
