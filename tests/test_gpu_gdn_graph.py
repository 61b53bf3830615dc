"""GPU tier of gdn_graphs=on (kernels/gdn_graph.py): fla's chunked core replayed from one CUDA graph gives the
plain call's bytes, chunk after chunk with other values, at the real geometry; and a whole prefill (chunked and
layer-major, with a partial last chunk that takes the plain call) gives the same logits, GDN states and KV with
the graphs on and off."""
import pytest
import torch

from qwenlocal.engine import Engine

pytestmark = pytest.mark.gpu
CHUNK = 50  # and a 14-token last chunk: the shapes test_gpu_decode_fused compiles fla for (the kernel cache has them)


def _chunk(t, hk, hv, d, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(t, hk, d, device="cuda", generator=gen).to(torch.bfloat16)
    k = torch.randn(t, hk, d, device="cuda", generator=gen).to(torch.bfloat16)
    v = torch.randn(t, hv, d, device="cuda", generator=gen).to(torch.bfloat16)
    g = -torch.rand(t, hv, device="cuda", generator=gen) * 2
    beta = torch.rand(t, hv, device="cuda", generator=gen)
    state = torch.randn(hv, d, d, device="cuda", generator=gen) * 0.1
    return q, k, v, g, beta, state


def test_the_replayed_core_gives_the_plain_calls_bytes_at_the_real_geometry():
    from qwenlocal.engine.kernels.gdn_fla import gdn_core_fla
    from qwenlocal.engine.kernels.gdn_graph import ChunkGraphs

    graphs = ChunkGraphs(gdn_core_fla, 2048)
    with torch.inference_mode():
        for seed in range(3):
            args = _chunk(2048, 16, 32, 128, seed)
            want = gdn_core_fla(*args, False)
            got = [t.clone() for t in graphs(*args, False)]
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert (graphs.captures, graphs.replays) == (1, 3) and graphs.pool_bytes > 0


@pytest.mark.parametrize("mode", ["chunked", "layer-major"])
def test_a_prefill_with_the_graphs_is_byte_equal_to_one_without(mode):
    ids = torch.randint(0, 600, (3 * CHUNK + 14,), generator=torch.Generator().manual_seed(4))
    out = {}
    for graphs in ("on", "off"):
        eng = Engine.from_pretrained("synthetic:small-nvfp4", device="cuda", dtype=torch.bfloat16, options={
            "prefill_chunk": CHUNK, "gdn_graphs": graphs, "prefill_mode": mode, "expert_slots": 40})
        assert eng.plan["gdn"]["value"] == ("fla-graphs" if graphs == "on" else "fla")
        gdn = eng.model.kernels.gdn
        before = (gdn.captures, gdn.replays, gdn.plain_calls) if graphs == "on" else None
        state = eng.runner.new_state()
        logits = eng.runner.prefill(state, ids.cuda(), all_logits=True)
        torch.cuda.synchronize()
        calls = (gdn.captures - before[0], gdn.replays - before[1], gdn.plain_calls - before[2]) if before else None
        out[graphs] = (logits, state, calls)
    (a, sa, calls), (b, sb, _) = out["on"], out["off"]
    gdn_layers = len(sa.recurrent)
    assert calls == (1, 3 * gdn_layers, gdn_layers)  # 3 full chunks replayed, the 14-token one plain
    assert torch.equal(a, b)
    assert all(torch.equal(sa.recurrent[i], sb.recurrent[i]) for i in sa.recurrent)
    assert all(torch.equal(sa.conv[i], sb.conv[i]) for i in sa.conv)
    assert all(torch.equal(sa.kv[i].k, sb.kv[i].k) and torch.equal(sa.kv[i].v, sb.kv[i].v) for i in sa.kv)
