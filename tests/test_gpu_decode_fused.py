"""GPU tier of the fused decode step (decode_kernels=auto on a GPU): against the unfused step at the bf16 level
(both measured against the CPU fp32 reference), CUDA-graph replay byte-equal to eager over >= 180 steps, on the
real-format synthetic model (NVFP4 experts/shared/lm_head, FP8 projections) and on a BF16 checkpoint."""
import pytest
import torch

from qwenlocal.engine import Engine

pytestmark = pytest.mark.gpu
CHUNK = 50


def build(ref, **options):
    return Engine.from_pretrained(ref, device="cuda", dtype=torch.bfloat16,
                                  options={"prefill_chunk": CHUNK, "overlap": "off", **options})


def _rel(x, ref):
    return float((x - ref).norm() / ref.norm())


@pytest.mark.parametrize("which", ["synthetic:small-nvfp4", "small"])
def test_fused_decode_is_at_the_bf16_level_of_the_unfused_step(small_ckpt, which):
    ref = small_ckpt if which == "small" else which
    fused, unfused = build(ref), build(ref, decode_kernels="reference")
    assert fused.model.kernels.fused_decode and not unfused.model.kernels.fused_decode
    ids = torch.randint(0, 600, (64 + 40,), generator=torch.Generator().manual_seed(31))
    a, b = fused.score(ids, prefill=64), unfused.score(ids, prefill=64)
    cpu = Engine.from_pretrained(ref, device="cpu", options={"prefill_chunk": CHUNK}).score(ids, prefill=64)
    assert torch.isfinite(a).all()
    assert torch.equal(a[:64], b[:64])  # prefill is the same path
    ra, rb = _rel(a[64:], cpu[64:]), _rel(b[64:], cpu[64:])
    assert ra <= max(2e-2, 1.5 * rb), (ra, rb)
    assert (a[64:].argmax(-1) == b[64:].argmax(-1)).float().mean() >= 0.9


@pytest.mark.parametrize("which", ["synthetic:small-nvfp4", "small"])
def test_fused_decode_graph_is_byte_equal_to_eager(small_ckpt, which):
    ref = small_ckpt if which == "small" else which
    graphs, eager = build(ref), build(ref, cuda_graphs=False)
    assert graphs.runner.use_graph and not eager.runner.use_graph and graphs.model.kernels.fused_decode
    ids = torch.randint(0, 600, (64 + 190,), generator=torch.Generator().manual_seed(32))
    a, b = graphs.score(ids, prefill=64), eager.score(ids, prefill=64)
    assert torch.isfinite(a).all() and torch.equal(a, b)


def test_programmatic_launch_is_on_and_gives_the_plain_launch_bytes():
    """decode_kernels=fused-pdl (sm_90+) launches the fused kernels with programmatic dependent launch; the logits
    are byte-equal to the same kernels launched plainly (decode_kernels=fused), through the graph, 190 steps."""
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("programmatic dependent launch needs sm_90+")
    pdl = build("synthetic:small-nvfp4", decode_kernels="fused-pdl")
    plain = build("synthetic:small-nvfp4", decode_kernels="fused")  # not the default: auto is fused-pdl on sm_90
    assert pdl.model.kernels.pdl and pdl.engine_config.decode == "fused-pdl"
    assert not plain.model.kernels.pdl and plain.model.kernels.fused_decode and plain.engine_config.decode == "fused"
    ids = torch.randint(0, 600, (64 + 190,), generator=torch.Generator().manual_seed(33))
    a, b = pdl.score(ids, prefill=64), plain.score(ids, prefill=64)
    assert torch.isfinite(a).all() and torch.equal(a, b)


@pytest.mark.parametrize("switches", [("gemv_multi", "PERSISTENT"), ("gemv_multi", "WEIGHT_PREFETCH"),
                                      ("nvfp4_int_experts", "ROUTE"), ("nvfp4_experts_decode", "PERSISTENT"),
                                      ("router_gemv", "FUSED"), ("nvfp4_int_experts", "DOWN_PREFETCH"),
                                      ("nvfp4_experts_parts", "ROUTE"),
                                      ("nvfp4_experts_parts", "PRELOAD", ["GROUPS", "ROUTE"]),
                                      ("gdn_decode", "EARLY_STATE")])
def test_kernel_switches_that_move_no_byte_give_the_default_bytes(switches, monkeypatch):
    """The A/B switches that change only how the work is spread or prefetched (persistent GEMV programs with the
    rows asked of L2 turns ahead, the weight prefetch before the PDL wait, persistent expert programs, the
    router's top-k in its GEMV's last program, the integer gate/up routing itself, its programs asking L2 for the
    experts' down rows, the down launch routing itself before its PDL wait, the GDN step's state loaded before
    its wait) give the default step's logits byte for byte, through the graph, 190 steps, with programmatic
    launch. Each switch is compared off against on, whichever is its default; a third item names the module's
    switches it works under, on in both (the down launch's rows loaded before the wait: on the group path,
    routing itself)."""
    import importlib

    module, attr, *under = switches
    mod = importlib.import_module(f"qwenlocal.engine.kernels.{module}")
    for name in under[0] if under else []:
        monkeypatch.setattr(mod, name, True)
    ids = torch.randint(0, 600, (64 + 190,), generator=torch.Generator().manual_seed(34))
    monkeypatch.setattr(mod, attr, False)
    default = build("synthetic:small-nvfp4", decode_kernels="fused-pdl").score(ids, prefill=64)
    monkeypatch.setattr(mod, attr, True)
    switched = build("synthetic:small-nvfp4", decode_kernels="fused-pdl").score(ids, prefill=64)
    assert torch.isfinite(switched).all() and torch.equal(switched, default)


@pytest.mark.parametrize("fp8_cvt", [True, False])
def test_both_fp8_paths_are_at_the_bf16_level_of_the_unfused_step(monkeypatch, fp8_cvt):
    """FP8 codes converted by the GPU (gemv_multi.FP8_CVT, the default on sm_89+) and by bit placement (the path
    of older GPUs): exact codes, the sums in other orders, so the fused step stays at the bf16 level of the
    unfused one (as test_fused_decode_is_at_the_bf16_level_... does)."""
    from qwenlocal.engine.kernels import gemv_multi

    ref = "synthetic:small-nvfp4"
    ids = torch.randint(0, 600, (64 + 40,), generator=torch.Generator().manual_seed(35))
    unfused = build(ref, decode_kernels="reference").score(ids, prefill=64)
    cpu = Engine.from_pretrained(ref, device="cpu", options={"prefill_chunk": CHUNK}).score(ids, prefill=64)
    monkeypatch.setattr(gemv_multi, "FP8_CVT", fp8_cvt)
    fused = build(ref).score(ids, prefill=64)
    assert torch.isfinite(fused).all()
    ra, rb = _rel(fused[64:], cpu[64:]), _rel(unfused[64:], cpu[64:])
    assert ra <= max(2e-2, 1.5 * rb), (ra, rb)
    assert (fused[64:].argmax(-1) == unfused[64:].argmax(-1)).float().mean() >= 0.9


TAILS = {"gemvnorm": ("gemv_norm", "FUSED"), "partsnorm": ("parts_norm", "FUSED"),
         "gdntail": ("gdn_decode", "NORM_SHIFT_TAIL"), "router": ("router_gemv", "FUSED"),
         "mixed": ("gemv_mixed", "MIXED"), "attn": ("attention_decode", "TRITON"),
         "routernorm": ("router_norm", "FUSED"),
         "tilesums": ("parts_norm", "TILE_SUMS"), "guint": ("nvfp4_int_experts", "ON"),
         "mixedfew": ("gemv_mixed", "FEWEST_B_TILES"), "attnmerge": ("attention_decode", "MERGE_APART"),
         "gugroups": ("nvfp4_int_experts", "GROUPS"), "dngroups": ("nvfp4_experts_parts", "GROUPS"),
         "fp8mma": ("gemv_multi", "FP8_MMA"), "mmastep": ("gemv_multi", "MMA_STEP_SCALE"),
         "lmimma": ("nvfp4_mma", "LM_HEAD"), "gumma": ("nvfp4_mma_experts", "ON"),
         "gugroups2": ("nvfp4_int_experts", "GROUPS"), "lmimma4": ("nvfp4_mma", "LM_HEAD")}
# Settings a switch needs beside itself: fp8mma's tile threshold lowered to the small model's sizes
ALONGSIDE = {"fp8mma": [("gemv_multi", "MMA_MIN_TILES", 1)], "gugroups2": [("nvfp4_int_experts", "BLOCK_N_GPU", 2)],
             "lmimma4": [("nvfp4_mma", "LM_WARPS", 4)]}


@pytest.mark.parametrize("tails", ["gemvnorm", "partsnorm", "gdntail", "mixed", "attn", "routernorm", "tilesums",
                                   "guint", "mixedfew", "attnmerge", "gugroups", "dngroups", "gugroups+dngroups",
                                   "fp8mma", "fp8mma+mmastep", "lmimma", "gumma", "gugroups2", "lmimma4",
                                   "gemvnorm+partsnorm+gdntail+router+mixed+attn"])
def test_the_norms_in_their_producers_are_graph_stable_and_at_the_bf16_level(tails, monkeypatch):
    """gemv_norm.FUSED (the post-mixer add + RMSNorm in the out_proj / o_proj launch), parts_norm.FUSED (the
    next add + RMSNorm in the MoE down projection's launch), gdn_decode.NORM_SHIFT_TAIL (GDN's gated norm and
    conv shift in its step's launch), gemv_mixed.MIXED (in_proj_b + a in the FP8 in_proj launch): their sums may
    go in another order than the separate kernels'; attention_decode.TRITON (the decode attention in one Triton
    launch instead of FlashInfer's): other kernels altogether. So the gate
    is the bf16 level against the unfused step, and graph replay byte-equal to eager over 190 steps (with
    programmatic launch); all the one-launch tails together too.
    parts_norm.TILE_SUMS (the next layer's input norm from the down launch's tile sums, applied by its first
    GEMV): the same gate. nvfp4_int_experts.ON (the experts' gate/up as integer dots, x in int16 blocks; the
    default since session 19): the same gate. attention_decode.MERGE_APART (the split-KV merge in the output
    gate's launch, attention_merge.py): the same gate. nvfp4_int_experts.GROUPS (the integer gate/up with a
    thread's groups its own, nvfp4_int_groups.py; its sums in the tile's order) and nvfp4_experts_parts.GROUPS
    (the down rows the same way, nvfp4_down_groups.py): the same gate, each alone and both. gemv_multi.FP8_MMA
    (the FP8 projections' tiles on wgmma, fp8_mma.py; sm_90+), its tile threshold lowered: the same gate, and
    with x's split scaled a K step (gemv_multi.MMA_STEP_SCALE). nvfp4_mma.LM_HEAD (the NVFP4 LM head on the
    integer tensor cores, x in int16 blocks) and nvfp4_mma_experts.ON (the experts' gate/up there): the same
    gate, and the LM head's tile at 4 warps (nvfp4_mma.LM_WARPS)."""
    import importlib

    if "fp8mma" in tails and torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the FP8 tensor-core tile is Hopper's (gemv_multi.fp8_mma_capable)")
    ref = "synthetic:small-nvfp4"
    ids = torch.randint(0, 600, (64 + 190,), generator=torch.Generator().manual_seed(36))
    unfused = build(ref, decode_kernels="reference").score(ids[:104], prefill=64)
    cpu = Engine.from_pretrained(ref, device="cpu", options={"prefill_chunk": CHUNK}).score(ids[:104], prefill=64)
    for name in tails.split("+"):
        for module, attr, value in [(*TAILS[name], True)] + ALONGSIDE.get(name, []):
            monkeypatch.setattr(importlib.import_module(f"qwenlocal.engine.kernels.{module}"), attr, value)
    graphs, eager = build(ref, decode_kernels="fused-pdl"), build(ref, decode_kernels="fused-pdl", cuda_graphs=False)
    a, b = graphs.score(ids, prefill=64), eager.score(ids, prefill=64)
    assert torch.isfinite(a).all() and torch.equal(a, b)
    ra, rb = _rel(a[64:104], cpu[64:]), _rel(unfused[64:], cpu[64:])
    assert ra <= max(2e-2, 1.5 * rb), (ra, rb)
    assert (a[64:104].argmax(-1) == unfused[64:].argmax(-1)).float().mean() >= 0.9
