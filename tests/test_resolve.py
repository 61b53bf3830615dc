"""resolve -> EngineConfig: one decision per option, with its reason, and the built objects do what it says.

The matrix: options x hardware profiles (faked) x devices. On the CPU the whole engine is built (tiny model)
and its objects are compared with the config; for the fake GPUs the constructors that run without CUDA
(select_kernels without FlashInfer, the slot cache on host tensors, the runner over a stand-in model) are
built from the config and compared.
"""
from __future__ import annotations

import subprocess
import sys
from dataclasses import fields
from types import SimpleNamespace

import pytest
import torch

from qwenlocal.engine import Engine
from qwenlocal.engine.config import load_model_config
from qwenlocal.engine.engine_config import DECISIONS, OPTION_DECISIONS, EngineConfig, Software
from qwenlocal.engine.errors import OptionError, QwenlocalError
from qwenlocal.engine.memory import ModelInfo, nvfp4_row_bytes, nvfp4_row_stride
from qwenlocal.engine.options import EngineOptions
from qwenlocal.engine.probe import fake
from qwenlocal.engine.resolve import resolve
from qwenlocal.engine.synthetic import synthetic_config

TINY = ModelInfo.from_config(synthetic_config("synthetic:tiny", 512), "tiny")  # 4 layers x 16 experts, top-4
SMALL = ModelInfo.from_config(synthetic_config("synthetic:small", 512), "small")  # head_dim 64, 4 x 32 experts
BIG = ModelInfo.from_config(synthetic_config("synthetic:qwen3.6-35b-a3b", 0), "35B")
BIG_NVFP4 = ModelInfo.from_config(synthetic_config("synthetic:qwen3.6-35b-a3b", 0), "35B-nvfp4", expert_format="nvfp4",
                                  quantized_linears=True, stored_dense_bytes=2_705_517_300)
ALL = Software(triton=True, flashinfer=True, fla=True)
NO_FI = Software(triton=True, flashinfer=False, fla=False)
NONE = Software(triton=False, flashinfer=False, fla=False)
# A non-default value of every option, valid on the CPU with the tiny model.
OTHER_VALUES = {"prefill_chunk": 512, "prefill_mode": "chunked", "overlap": "off", "cuda_graphs": False,
                "routing": "uniform", "max_context": 1024, "vram_budget": "16GiB", "expert_slots": 8,
                "prefill_window": 16, "expert_format": "dense", "linear_format": "dequantized",
                "slot_prefill_tokens": 0, "fp8_prefill": "scaled-mm", "decode_kernels": "reference",
                "prefill_kernels": "torch", "gdn_graphs": "off", "attention_pairs": "off", "prefill_attention": "paged",
                "moe_prefill_blocks": "standard", "threads": 1}
OPTIONS = [{}, {"expert_slots": 8}, {"expert_slots": 60}, {"expert_slots": 8, "prefill_mode": "chunked"},
           {"prefill_mode": "layer-major"}, {"expert_slots": 12, "overlap": "copy-side", "slot_prefill_tokens": 0},
           {"cuda_graphs": False, "decode_kernels": "reference"}, {"vram_budget": "16GiB"}]
GPU_PROFILES = {"wsl2-16g": fake.wsl2_rtx5070ti(), "linux-5080": fake.linux_pcie5_x16(), "laptop-8g": fake.laptop_pcie4_x8(),
                "h200": fake.h200(), "h200-one-copy-engine": fake.h200(copy_engines=1)}


def check_reasons(config: EngineConfig) -> None:
    assert set(config.reasons) == set(DECISIONS), set(DECISIONS) ^ set(config.reasons)
    for name in DECISIONS:
        reason = config.reason(name)
        assert reason and "\n" not in reason, (name, reason)
        assert ("overridden by user" in reason) == (name in config.overridden), (name, reason)
    assert list(config.render()) == list(DECISIONS)


def test_every_option_is_a_decision_with_its_reason():
    assert set(OPTION_DECISIONS) == {f.name for f in fields(EngineOptions)}
    assert set(OPTION_DECISIONS.values()) <= set(DECISIONS)
    assert set(OTHER_VALUES) == set(OPTION_DECISIONS)
    base = resolve({}, TINY, None, "cpu", NONE)
    check_reasons(base)
    assert not base.overridden
    for option, value in OTHER_VALUES.items():
        config = resolve({option: value}, TINY, None, "cpu", NONE)
        check_reasons(config)
        assert OPTION_DECISIONS[option] in config.overridden, (option, config.overridden)


@pytest.mark.parametrize("options", OPTIONS, ids=[str(o) for o in OPTIONS])
def test_matrix_same_keys_and_consistent_decisions(options):
    cases = [(options, resolve(options, TINY, None, "cpu", NONE)),
             (options, resolve(options, TINY, fake.fake_cpu_profile(), "cpu", ALL))]
    for model in (TINY, BIG, BIG_NVFP4):
        opts = dict(options)
        if model is not TINY and "expert_slots" in opts:
            opts["expert_slots"] *= 150  # a real slot count for 10,240 experts
        for profile in GPU_PROFILES.values():
            for sw in (ALL, NO_FI, NONE):
                try:
                    cases.append((opts, resolve(opts, model, profile, "cuda", sw)))
                except QwenlocalError as exc:  # a too-small GPU: a ResourceError naming the numbers
                    assert "too small" in str(exc), exc
    assert len(cases) > 20
    for opts, config in cases:
        check_reasons(config)
        assert list(config.to_dict()["reasons"]) == list(config.reasons)
        offloaded = config.slots is not None
        assert (config.bank == "resident") == (not offloaded) and (config.stream_buffers == "none") == (not offloaded)
        if not offloaded or config.device == "cpu":
            assert config.overlap == "off"
        assert config.layer_major == (opts.get("prefill_mode") == "layer-major" or
                                      opts.get("prefill_mode", "auto") == "auto" and offloaded)
        assert config.layer_major_min_tokens == (config.prefill_chunk + 1 if config.layer_major else None)
        assert config.slot_prefill_tokens == (opts.get("slot_prefill_tokens", 64) if offloaded else 0)
        assert config.cuda_graphs == (config.device == "cuda" and opts.get("cuda_graphs", True)
                                      and config.attention == "flashinfer" and config.moe == "triton")
        if config.device == "cuda":
            assert config.vram.fixed + config.vram.slots <= config.vram.budget or "expert_slots" in opts
        if "expert_slots" in opts:
            assert config.slots == opts["expert_slots"]


def test_the_two_old_disagreements_are_what_runs():
    """The CPU with expert_slots=8 (offloaded, layer-major), and a GPU with room for every expert and
    expert_slots=N (offloaded, so the overlap rule and layer-major apply): the config says what the engine does."""
    cpu = resolve({"expert_slots": 8}, TINY, None, "cpu", NONE)
    assert (cpu.slots, cpu.bank, cpu.bank_pinned, cpu.prefill_mode, cpu.overlap) == (8, "host", False, "layer-major", "off")
    assert cpu.render()["slots"]["value"] == 8
    gpu = resolve({"expert_slots": 2000}, BIG_NVFP4, fake.h200(), "cuda", ALL)
    assert gpu.slots == 2000 and gpu.bank == "pin-all" and gpu.bank_pinned and gpu.layer_major
    # The fused decode step keeps the shared expert inside the expert kernels: serial measured faster.
    # auto on sm_90: the fused kernels with programmatic dependent launch; decode_kernels=fused: plain launches.
    assert gpu.decode == "fused-pdl" and gpu.overlap == "off" and "measured slower" in gpu.reason("overlap")
    assert "programmatic" in gpu.reason("decode")
    assert gpu.prefill_kernels == "fused" and "auto: at the torch path's logits level" in gpu.reason("prefill_kernels")
    fused = resolve({"expert_slots": 2000, "prefill_kernels": "fused"}, BIG_NVFP4, fake.h200(), "cuda", ALL)
    assert fused.prefill_kernels == "fused" and "one Triton launch" in fused.reason("prefill_kernels")
    assert "prefill_kernels" in fused.overridden
    torch_ops = resolve({"expert_slots": 2000, "prefill_kernels": "torch"}, BIG_NVFP4, fake.h200(), "cuda", ALL)
    assert torch_ops.prefill_kernels == "torch" and "prefill_kernels=torch" in torch_ops.reason("prefill_kernels")
    assert resolve({"expert_slots": 2000}, BIG_NVFP4, fake.h200(), "cuda", NONE).prefill_kernels == "torch"
    with pytest.raises(OptionError, match="prefill_kernels=fused needs Triton"):
        resolve({"expert_slots": 2000, "prefill_kernels": "fused"}, BIG_NVFP4, fake.h200(), "cuda", NONE)
    plain = resolve({"expert_slots": 2000, "decode_kernels": "fused"}, BIG_NVFP4, fake.h200(), "cuda", ALL)
    assert plain.decode == "fused" and plain.overlap == "off" and "plain launches" in plain.reason("decode")
    ampere = resolve({"expert_slots": 2000}, BIG_NVFP4, fake.fake_gpu_profile(cc="8.6"), "cuda", ALL)
    assert ampere.decode == "fused" and "sm_90" in ampere.reason("decode")
    unfused = resolve({"expert_slots": 2000, "decode_kernels": "reference"}, BIG_NVFP4, fake.h200(), "cuda", ALL)
    assert unfused.overlap == "copy-side" and "3 copy engines" in unfused.reason("overlap")
    assert gpu.stream_buffers == "borrowed" and gpu.vram.slots == 2000 * nvfp4_row_stride(2048, 512)
    few = resolve({"expert_slots": 300}, BIG, fake.h200(), "cuda", ALL)
    assert few.stream_buffers == "dedicated" and few.vram.stream == 2 * 256 * 3 * 2048 * 512 * 2


@pytest.mark.parametrize("profile", list(GPU_PROFILES), ids=list(GPU_PROFILES))
@pytest.mark.parametrize("options", [{}, {"expert_slots": 12}, {"expert_slots": 60, "prefill_mode": "chunked"},
                                     {"overlap": "shared-side", "expert_slots": 8}], ids=str)
def test_fake_gpu_constructors_follow_the_config(profile, options, monkeypatch):
    """What can be built without CUDA: the kernels (no FlashInfer), the slot cache (host tensors), the runner
    (over a stand-in model), the overlap (stand-in streams) -- each does what the config says."""
    from qwenlocal.engine import choices
    from qwenlocal.engine.model.kernels import select_kernels
    from qwenlocal.engine.offload.bank import HostExpertBank
    from qwenlocal.engine.offload.cache import ExpertSlotCache
    from qwenlocal.engine.runtime.runner import Runner

    monkeypatch.setattr(choices, "CudaStreams", lambda device: ("streams", device))
    cfg = synthetic_config("synthetic:tiny", 512)
    config = resolve(options, TINY, GPU_PROFILES[profile], "cuda", NO_FI)
    cuda = torch.device("cuda")
    kernels = select_kernels(cfg, cuda, torch.bfloat16, config.max_context, config=config)
    assert {p: n for p, (n, _) in kernels.choices.items()} == {p: getattr(config, p) for p in ("attention", "gdn", "moe", "decode", "prefill_kernels")}
    assert kernels.fused_decode == (config.decode in ("fused", "fused-pdl")) and kernels.pdl == (config.decode == "fused-pdl") and kernels.graph_safe == config.cuda_graphs is False
    assert kernels.fused_prefill == (config.prefill_kernels == "fused")
    cache = None
    if config.offloaded:
        cache = ExpertSlotCache(cfg, HostExpertBank(cfg, torch.float32, pin=False), config.slots, torch.device("cpu"),
                                fused_ensure=False)
        assert cache.num_slots == config.slots and cache.borrows_stream == (config.stream_buffers == "borrowed")
    runner = Runner(SimpleNamespace(cache=cache, device=cuda, kernels=kernels), config)
    assert runner.layer_major == config.layer_major and runner.use_graph == config.cuda_graphs
    assert runner.slot_prefill_tokens == config.slot_prefill_tokens and runner.max_context == config.max_context
    assert choices.build_overlap(config, cuda).split == config.overlap
    with pytest.raises(ValueError, match="disagree"):  # a model built against another config is refused
        Runner(SimpleNamespace(cache=None if cache is not None else object(), device=cuda, kernels=kernels), config)
    graphs = resolve(options, SMALL, GPU_PROFILES[profile], "cuda", ALL)  # head_dim 64: FlashInfer takes it
    assert graphs.cuda_graphs and Runner(SimpleNamespace(cache=cache, device=cuda, kernels=SimpleNamespace(graph_safe=True)),
                                         graphs).use_graph
    with pytest.raises(ValueError, match="CUDA graphs"):
        Runner(SimpleNamespace(cache=cache, device=cuda, kernels=kernels), graphs)


CPU_ENGINES = [{}, {"expert_slots": 8}, {"expert_slots": 48, "prefill_mode": "chunked", "overlap": "copy-side"},
               {"prefill_mode": "layer-major", "prefill_chunk": 16}, {"expert_slots": 5, "slot_prefill_tokens": 0}]


@pytest.mark.parametrize("options", CPU_ENGINES, ids=str)
def test_cpu_engine_objects_are_what_the_config_says(tiny_ckpt, options):
    eng = Engine.from_pretrained(tiny_ckpt, device="cpu", options=options)
    config, model, runner = eng.engine_config, eng.model, eng.runner
    check_reasons(config)
    assert list(eng.plan) == list(DECISIONS)
    assert config == resolve(options, ModelInfo.from_config(load_model_config(tiny_ckpt), tiny_ckpt.name), None, "cpu",
                             Software(triton=True), device_asked=True)
    assert (model.cache is None) == (config.slots is None)
    if model.cache is not None:
        assert model.cache.num_slots == config.slots and not model.cache.bank.pinned
        assert model.cache.borrows_stream == (config.stream_buffers == "borrowed")
    assert runner.layer_major == config.layer_major and runner.use_graph == config.cuda_graphs is False
    assert runner.prefill_chunk == config.prefill_chunk and runner.slot_prefill_tokens == config.slot_prefill_tokens
    assert all(layer.moe.overlap.split == config.overlap == "off" for layer in model.layers)
    assert {p: n for p, (n, _) in model.kernels.choices.items()} == {"attention": "sdpa", "gdn": "torch", "moe": "torch",
                                                                     "decode": "reference", "prefill_kernels": "torch"}
    assert config.threads is not None and torch.get_num_threads() == config.threads
    assert eng.max_context == config.max_context and str(model.dtype) == "torch." + config.dtype
    assert model.layers[0].moe.experts.fmt == ("nvfp4" if config.experts == "nvfp4" else "dense")
    assert eng.plan["device"]["by"] == "user" and eng.plan["slots"]["by"] == ("user" if "expert_slots" in options else "auto")


def test_bad_combinations_fail_in_resolve_naming_the_option(tiny_ckpt, monkeypatch):
    cases = [({"expert_format": "nvfp4"}, "expert_format"), ({"expert_slots": 2}, "expert_slots"),
             ({"expert_slots": 65}, "expert_slots"), ({"decode_kernels": "fused"}, "decode_kernels"),
             ({"max_context": 10**6}, "max_context")]
    for options, name in cases:
        with pytest.raises(OptionError, match=name):
            resolve(options, TINY, None, "cpu", NONE)
    with pytest.raises(OptionError, match="fp8_prefill"):
        resolve({"fp8_prefill": "scaled-mm"}, BIG_NVFP4, fake.fake_gpu_profile(cc="8.6"), "cuda",
                Software(triton=True, fp8_tensor_cores=False))
    with pytest.raises(OptionError, match="decode_kernels=fused-pdl"):  # programmatic launch needs sm_90+
        resolve({"decode_kernels": "fused-pdl"}, BIG_NVFP4, fake.fake_gpu_profile(cc="8.6"), "cuda", ALL)
    with pytest.raises(OptionError, match="decode_kernels"):
        resolve({"decode_kernels": "fused-pdl"}, TINY, None, "cpu", NONE)
    with pytest.raises(OptionError, match="prefill_kernels=fused"):  # a GPU kernel
        resolve({"prefill_kernels": "fused"}, TINY, None, "cpu", NONE)
    with pytest.raises(OptionError, match="prefill_kernels"):
        resolve({"prefill_kernels": "triton"}, TINY, None, "cpu", NONE)
    with pytest.raises(OptionError, match="dtype"):
        resolve({}, TINY, None, "cpu", NONE, dtype="int8")
    with pytest.raises(OptionError, match="unknown engine option"):
        resolve({"expert_slot": 8}, TINY, None, "cpu", NONE)
    # The engine refuses them before reading a weight.
    from qwenlocal.engine import api

    def no_loading(*a, **k):
        raise AssertionError("weights were read before the options were checked")

    monkeypatch.setattr(api, "load_weights", no_loading)
    for options, name in cases:
        with pytest.raises(OptionError, match=name):
            Engine.from_pretrained(tiny_ckpt, device="cpu", options=options)


def test_resolve_is_pure_and_torch_free():
    a = resolve({"vram_budget": "16GiB"}, BIG_NVFP4, fake.wsl2_rtx5070ti(), "cuda", ALL)
    assert a == resolve({"vram_budget": "16GiB"}, BIG_NVFP4, fake.wsl2_rtx5070ti(), "cuda", ALL)
    assert a.experts == "nvfp4" and a.linears == "native" and a.vram.dense == 2_705_517_300
    code = ("import sys; import qwenlocal.engine.resolve, qwenlocal.engine.memory, qwenlocal.app.fit; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_nvfp4_row_bytes_is_the_banks_row():
    from qwenlocal.engine.quant.nvfp4_rows import nvfp4_expert_row_bytes, nvfp4_expert_row_stride

    for h, i in ((2048, 512), (64, 32), (48, 80)):
        assert nvfp4_row_bytes(h, i) == nvfp4_expert_row_bytes(h, i)
        assert nvfp4_row_stride(h, i) == nvfp4_expert_row_stride(h, i)
        assert nvfp4_row_stride(h, i) % 16 == 0 and 0 <= nvfp4_row_stride(h, i) - nvfp4_row_bytes(h, i) < 16
    assert nvfp4_row_stride(2048, 512) == 1_769_488  # 1,769,484 stored + 4 bytes of padding


def test_probe_and_fit_agree_on_the_gpu_and_the_cpu():
    """`probe` (resolve over the registry's ModelInfo) and the download fit check (ModelFacts) on the same
    machines: the same verdict."""
    from qwenlocal.app.fit import check_fit
    from qwenlocal.engine.registry import QWEN36_35B_A3B_NVFP4_INFO, find_known

    known = find_known("qwen3.6-35b-a3b-nvfp4")
    machines = [("cpu", fake.fake_cpu_profile(ram_total=24.0, ram_available=22.0)),
                ("cpu", fake.fake_cpu_profile(ram_total=256.0, ram_available=250.0)),
                ("cuda", fake.wsl2_rtx5070ti()), ("cuda", fake.fake_gpu_profile(vram_total=4.0, vram_free=3.8)),
                ("cuda", fake.h200()), ("cuda", fake.wsl2_rtx5070ti(ram_total=16.0, ram_available=14.0))]
    for device, profile in machines:
        fit = check_fit(known.facts, profile, device=device, params=known.params)
        try:
            resolve({}, QWEN36_35B_A3B_NVFP4_INFO, profile, device, ALL)
            planned = True
        except QwenlocalError:
            planned = False
        assert fit.ok == planned, (device, fit.message())


def test_complete_goes_through_the_engine_lock(tiny_engine):
    events = list(tiny_engine.complete("hello", {"max_tokens": 3, "temperature": 0}))
    assert type(events[-1]).__name__ == "TurnDone" and events[-1].completion_tokens <= 3
    chat = tiny_engine.chat([{"role": "user", "content": "hi"}], {"max_tokens": 50})
    next(chat)  # generating: the engine's lock is held
    try:
        with pytest.raises(QwenlocalError, match="busy"):
            next(iter(tiny_engine.complete([1, 2, 3], {"max_tokens": 2})))
    finally:
        chat.close()
    with pytest.raises(OptionError, match="token ids"):
        tiny_engine.complete([10**6])


def test_threads_default_leaves_a_core_and_is_capped():
    from qwenlocal.engine.cpu_threads import default_threads, physical_cores

    assert [default_threads(c)[0] for c in (1, 2, 4, 9, 64)] == [1, 1, 3, 8, 8]
    assert 1 <= physical_cores() <= (__import__("os").cpu_count() or 1)
    cpu = resolve({}, TINY, None, "cpu", NONE, cpu_cores=16)
    assert cpu.threads == 8 and "8 of 16 physical cores" in cpu.reason("threads")
    assert resolve({"threads": 3}, TINY, None, "cpu", NONE, cpu_cores=16).threads == 3
    gpu = resolve({"threads": 3}, TINY, fake.h200(), "cuda", ALL)
    assert gpu.threads is None and "threads" in gpu.overridden and "CPU path only" in gpu.reason("threads")
    for bad in (0, -2, "4", True):
        with pytest.raises(OptionError, match="threads"):
            resolve({"threads": bad}, TINY, None, "cpu", NONE)


def test_cpu_engine_sets_torch_threads(tiny_ckpt):
    before = torch.get_num_threads()
    try:
        eng = Engine.from_pretrained(tiny_ckpt, device="cpu", options={"threads": 1})
        assert eng.engine_config.threads == 1 and torch.get_num_threads() == 1
        assert eng.plan["threads"] == {"value": 1, "reason": eng.engine_config.reason("threads"), "by": "user"}
    finally:
        torch.set_num_threads(before)


def test_the_prefill_reads_ragged_rows_and_pairs_only_where_asked_and_possible():
    gpu = resolve({"expert_slots": 2000}, BIG_NVFP4, fake.h200(), "cuda", ALL)
    assert gpu.prefill_attention == "ragged" and not gpu.attention_pairs and gpu.layer_major
    check_reasons(gpu)
    asked = resolve({"expert_slots": 2000, "prefill_attention": "paged", "attention_pairs": "on"}, BIG_NVFP4,
                    fake.h200(), "cuda", ALL)
    assert asked.prefill_attention == "paged" and asked.attention_pairs
    assert {"prefill_attention", "attention_pairs"} <= asked.overridden
    no_fi = resolve({"expert_slots": 2000}, BIG_NVFP4, fake.h200(), "cuda", NO_FI)
    assert no_fi.prefill_attention == "sdpa" and not no_fi.attention_pairs
    with pytest.raises(OptionError, match="attention_pairs=on does not apply"):
        resolve({"expert_slots": 2000, "prefill_mode": "chunked", "attention_pairs": "on"}, BIG_NVFP4, fake.h200(),
                "cuda", ALL)
    with pytest.raises(OptionError, match="attention_pairs"):
        EngineOptions(attention_pairs="yes")
    with pytest.raises(OptionError, match="prefill_attention"):
        EngineOptions(prefill_attention="contiguous")


def test_the_moe_prefill_blocks_are_standard_unless_asked_and_large_needs_the_triton_kernels():
    gpu = resolve({"expert_slots": 2000}, BIG_NVFP4, fake.h200(), "cuda", ALL)
    assert gpu.moe_prefill_blocks == "standard" and "moe_prefill_blocks" not in gpu.overridden
    assert "256-row" in gpu.reason("moe_prefill_blocks")
    large = resolve({"expert_slots": 2000, "moe_prefill_blocks": "large"}, BIG_NVFP4, fake.h200(), "cuda", ALL)
    assert large.moe_prefill_blocks == "large" and "moe_prefill_blocks" in large.overridden
    check_reasons(large)
    with pytest.raises(OptionError, match="moe_prefill_blocks=large applies to the Triton"):
        resolve({"moe_prefill_blocks": "large"}, TINY, None, "cpu", NONE)
    with pytest.raises(OptionError, match="moe_prefill_blocks"):
        EngineOptions(moe_prefill_blocks="huge")


def test_the_large_moe_blocks_reach_both_grouped_prefill_kernels():
    """config.moe_prefill_blocks -> select_kernels: the BF16 and the NVFP4 grouped kernels get the large-block
    rule (the same for chunked and layer-major prefill: one kernels object serves both)."""
    from qwenlocal.engine.kernels.moe_triton import moe_grouped
    from qwenlocal.engine.model.kernels import select_kernels

    cfg = synthetic_config("synthetic:tiny", 512)
    cuda = torch.device("cuda")
    for asked, large in (("auto", False), ("large", True)):
        config = resolve({"moe_prefill_blocks": asked}, TINY, GPU_PROFILES["linux-5080"], "cuda", NO_FI)
        assert config.moe == "triton" and config.moe_prefill_blocks == ("large" if large else "standard")
        kernels = select_kernels(cfg, cuda, torch.bfloat16, config.max_context, config=config)
        assert kernels.experts_prefill_nvfp4.keywords["large_blocks"] is large
        if large:
            assert kernels.experts_prefill.func is moe_grouped and kernels.experts_prefill.keywords == {"large_blocks": True}
        else:
            assert kernels.experts_prefill is moe_grouped
