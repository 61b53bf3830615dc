"""GPU tier: decode overlap on vs off is byte-equal (logits, slot map, slot contents) in eager mode and in two
captured graphs replayed over >= 180 steps with changing routes; removing the join must break it; the side
stream is never the current stream, also after an engine rebuild."""
import pytest
import torch

from qwenlocal.engine import Engine

pytestmark = pytest.mark.gpu
SLOTS = 24  # small: most decode steps miss


def build(ckpt, split, graphs=True):
    return Engine.from_pretrained(str(ckpt), device="cuda", dtype=torch.bfloat16,
                                  options={"expert_slots": SLOTS, "overlap": split, "cuda_graphs": graphs,
                                           "prefill_chunk": 50})


def run(engine, ids, prefill):
    logits = engine.score(ids, prefill=prefill)
    cache = engine.model.cache
    return logits, cache.slot_map.clone(), cache.rows[:-1].clone()


@pytest.mark.parametrize("graphs", [True, False])
@pytest.mark.parametrize("split", ["copy-side", "shared-side"])
def test_overlap_is_byte_equal_to_serial(small_ckpt, split, graphs):
    ids = torch.randint(0, 600, (64 + 190,), generator=torch.Generator().manual_seed(11))
    serial = run(build(small_ckpt, "off", graphs), ids, 64)
    overlapped_engine = build(small_ckpt, split, graphs)
    assert overlapped_engine.plan["overlap"]["value"] == split
    overlapped = run(overlapped_engine, ids, 64)
    assert overlapped_engine.stats()["expert_misses"] > 180  # routes changed and copies happened
    for a, b in zip(serial, overlapped):
        assert torch.equal(a, b)
    # A second graph replay over the same engine (state reset in place) repeats the bytes.
    assert torch.equal(run(overlapped_engine, ids, 64)[0], overlapped[0])


@pytest.mark.parametrize("split", ["copy-side", "shared-side"])
def test_overlap_over_nvfp4_rows_is_byte_equal_to_serial(split):
    ref = "synthetic:small-nvfp4"  # 4-bit expert rows: the miss copy moves packed bytes
    ids = torch.randint(0, 600, (64 + 190,), generator=torch.Generator().manual_seed(13))
    serial = run(build(ref, "off"), ids, 64)
    overlapped_engine = build(ref, split)
    assert overlapped_engine.model.cache.rows.dtype == torch.uint8
    for a, b in zip(serial, run(overlapped_engine, ids, 64)):
        assert torch.equal(a, b)


def test_removing_the_join_breaks_byte_equality(small_ckpt):
    ids = torch.randint(0, 600, (64 + 190,), generator=torch.Generator().manual_seed(12))
    serial = run(build(small_ckpt, "off"), ids, 64)[0]
    broken = build(small_ckpt, "copy-side", graphs=False)
    broken.model.overlap.join = False
    broken.model.overlap.side_delay = lambda: torch.cuda._sleep(2_000_000)  # the copy lands late
    assert not torch.equal(run(broken, ids, 64)[0], serial)


def test_side_stream_is_never_the_current_stream(small_ckpt):
    for _ in range(2):  # also after a rebuild
        engine = build(small_ckpt, "shared-side")
        side = engine.model.overlap.streams.side
        assert side.cuda_stream != torch.cuda.current_stream().cuda_stream
        assert side.cuda_stream != torch.cuda.default_stream().cuda_stream
