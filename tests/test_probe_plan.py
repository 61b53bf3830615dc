"""The plan policy on faked hardware profiles: each machine gives the expected choices, each with a reason."""
from __future__ import annotations

import json

import pytest

from qwenlocal.engine.config import parse_model_config
from qwenlocal.engine.errors import FeatureUnavailableError, OptionError, ResourceError
from qwenlocal.engine.options import EngineOptions
from qwenlocal.engine.plan import QWEN36_35B_A3B_NVFP4 as MODEL
from qwenlocal.engine.plan import ModelFacts, Plan, resolve_plan
from qwenlocal.engine.probe import fake
from qwenlocal.engine.probe.profile import measured

GIB = 2**30


def check_reasons(plan: Plan) -> None:
    """Every decision has a non-trivial one-line reason; user-set ones say so, auto ones do not."""
    for name, value, reason, overridden in plan.rows():
        assert reason and len(reason) > 10 and "\n" not in reason, (name, reason)
        assert ("overridden by user" in reason) == overridden, (name, reason)
    json.dumps(plan.to_dict())  # plain data all the way down


def test_wsl2_one_copy_engine_42gbps() -> None:
    plan = resolve_plan(fake.wsl2_rtx5070ti(), MODEL)
    assert plan.device == "cuda"
    assert plan.overlap == "shared-side"
    assert "one copy engine" in plan.reason("overlap") and "WDDM" in plan.reason("overlap")
    # a 16 GB card takes the GPU's 8,192-token chunk: its workspace costs 9 % of the slots, no context
    assert plan.layer_major and plan.layer_major_min_tokens == 8193
    assert "42 GB/s" in plan.reason("layer_major")
    assert plan.prefill_chunk == 8192 and "larger batches per expert" in plan.reason("prefill_chunk")
    assert plan.cuda_graphs
    assert plan.bank == "pin-all" and plan.pinned_bytes == MODEL.experts_total_bytes
    assert not plan.all_resident and MODEL.num_experts <= plan.slots < MODEL.total_experts
    assert plan.context_tokens == 131072  # a 16 GB card gets the seeds' context
    assert plan.vram.fixed + plan.vram.slots <= plan.vram_budget
    assert plan.overridden == frozenset()
    check_reasons(plan)


def test_wsl2_pins_what_fits_under_the_cap() -> None:
    plan = resolve_plan(fake.wsl2_rtx5070ti(ram_total=32.0, ram_available=30.0), MODEL)
    assert plan.bank == "pin-partial"
    assert 0 < plan.pinned_bytes <= 16 * GIB < MODEL.experts_total_bytes
    assert plan.pinned_bytes % MODEL.expert_bytes == 0
    assert "WSL2/Windows cap" in plan.reason("bank") and "pageable" in plan.reason("bank")
    check_reasons(plan)


def test_native_linux_pcie5_x16_two_engines() -> None:
    plan = resolve_plan(fake.linux_pcie5_x16(), MODEL)
    assert plan.device == "cuda"
    assert plan.overlap == "copy-side"
    assert "2 copy engines" in plan.reason("overlap")
    assert plan.layer_major and plan.layer_major_min_tokens == 8193
    assert plan.bank == "pin-all"
    assert plan.cuda_graphs
    check_reasons(plan)


def test_h200_with_a_16gib_budget_plans_like_a_16gb_card() -> None:
    plan = resolve_plan(fake.h200(), MODEL, {"vram_budget": "16GiB"})
    assert plan.vram_budget == 16 * GIB and "vram_budget" in plan.overridden
    assert plan.overlap == "copy-side"  # 3 copy engines, native driver
    assert plan.layer_major
    assert not plan.all_resident
    check_reasons(plan)


def test_h200_unbudgeted_keeps_every_expert_resident() -> None:
    plan = resolve_plan(fake.h200(), MODEL)
    assert plan.all_resident and plan.slots == MODEL.total_experts
    assert plan.overlap == "off" and "resident" in plan.reason("overlap")
    assert not plan.layer_major and plan.layer_major_min_tokens is None
    assert plan.bank == "resident" and plan.pinned_bytes == 0
    assert plan.context_tokens == MODEL.max_context
    check_reasons(plan)


def test_laptop_pcie4_x8_12gbps() -> None:
    plan = resolve_plan(fake.laptop_pcie4_x8(), MODEL)
    assert plan.device == "cuda"
    assert plan.overlap == "copy-side"  # native Linux, two copy engines
    # 8,192-token chunks would halve an 8 GB card's context (65,536 -> 32,768): the small chunk
    assert plan.prefill_chunk == 2048 and "would cost context" in plan.reason("prefill_chunk")
    assert plan.layer_major and plan.layer_major_min_tokens == 2049
    assert "12 GB/s" in plan.reason("layer_major")
    assert plan.context_tokens < 131072  # an 8 GB card trades context for slots
    assert MODEL.num_experts <= plan.slots < 0.3 * MODEL.total_experts
    assert plan.bank == "pin-all"
    check_reasons(plan)


def test_windows_laptop_on_wddm_prefers_shared_side() -> None:
    plan = resolve_plan(fake.laptop_pcie4_x8(os_name="Windows"), MODEL)
    assert plan.overlap == "shared-side" and "WDDM" in plan.reason("overlap")
    check_reasons(plan)


def test_no_cuda_runs_on_the_cpu_with_everything_off() -> None:
    plan = resolve_plan(fake.fake_cpu_profile("no CUDA GPU found: torch is a CPU-only build"), MODEL)
    assert plan.device == "cpu"
    assert "CPU-only build" in plan.reason("device")
    assert plan.overlap == "off" and not plan.layer_major and not plan.cuda_graphs
    assert plan.slots == 0 and plan.bank == "host" and plan.vram is None
    for name in ("overlap", "layer_major", "cuda_graphs", "slots", "bank"):
        assert "CPU" in plan.reason(name) or "CUDA" in plan.reason(name)
    check_reasons(plan)


def test_no_cuda_but_cuda_asked_is_a_clear_error() -> None:
    with pytest.raises(FeatureUnavailableError, match="device='cpu'"):
        resolve_plan(fake.fake_cpu_profile(), MODEL, device="cuda")


def test_gpu_too_small_says_how_much_and_what_to_do() -> None:
    with pytest.raises(ResourceError) as info:
        resolve_plan(fake.fake_gpu_profile(vram_total=4.0, vram_free=3.8), MODEL)
    msg = str(info.value)
    assert "too small" in msg and "needs" in msg and "budget is 3.5 GiB" in msg
    assert "dense weights 2.5 GiB" in msg and "one layer of expert slots" in msg
    assert "CPU" in msg


def test_context_too_long_for_the_card_suggests_a_max_context() -> None:
    with pytest.raises(ResourceError, match=r"set max_context to 32,768 tokens or less"):
        resolve_plan(fake.fake_gpu_profile(vram_total=6.0, vram_free=5.8), MODEL, {"max_context": 262144})


def test_host_ram_too_small_for_the_bank() -> None:
    with pytest.raises(ResourceError, match="host RAM"):
        resolve_plan(fake.wsl2_rtx5070ti(ram_total=16.0, ram_available=14.0), MODEL)


def test_user_overrides_are_kept_and_shown() -> None:
    opts = EngineOptions(overlap="copy-side", prefill_mode="chunked", cuda_graphs=False, prefill_chunk=4096,
                         max_context=32768, vram_budget="12GiB")
    plan = resolve_plan(fake.wsl2_rtx5070ti(), MODEL, opts)
    assert plan.overlap == "copy-side"
    assert "overridden by user (overlap=copy-side)" in plan.reason("overlap")
    assert "auto would pick shared-side" in plan.reason("overlap")
    assert not plan.layer_major and plan.layer_major_min_tokens is None
    assert "auto would pick on" in plan.reason("layer_major")
    assert not plan.cuda_graphs and plan.prefill_chunk == 4096 and plan.context_tokens == 32768
    assert plan.vram_budget == 12 * GIB
    assert plan.overridden == {"overlap", "layer_major", "cuda_graphs", "prefill_chunk", "context_tokens",
                               "vram_budget"}
    assert {name for name, _, _, user in plan.rows() if user} == plan.overridden
    check_reasons(plan)


def test_forced_layer_major_and_overlap_where_auto_says_off() -> None:
    plan = resolve_plan(fake.h200(), MODEL, {"prefill_mode": "layer-major", "overlap": "shared-side"})
    assert plan.layer_major and plan.layer_major_min_tokens == 8193  # all resident: the GPU's chunk
    assert plan.overlap == "shared-side" and "no misses to hide" in plan.reason("overlap")
    check_reasons(plan)


def test_overlap_asked_on_the_cpu_cannot_apply() -> None:
    plan = resolve_plan(fake.fake_cpu_profile(), MODEL, {"overlap": "copy-side"})
    assert plan.overlap == "off" and "overridden by user" in plan.reason("overlap")
    assert "no streams" in plan.reason("overlap")


def test_microbench_result_beats_the_rules() -> None:
    faster_shared = {"off": 100.0, "copy-side": 97.0, "shared-side": 92.0}
    plan = resolve_plan(fake.linux_pcie5_x16(microbench=faster_shared), MODEL)
    assert plan.overlap == "shared-side" and "micro-bench" in plan.reason("overlap")
    no_gain = {"off": 100.0, "copy-side": 99.7, "shared-side": 100.4}
    plan = resolve_plan(fake.wsl2_rtx5070ti(microbench=no_gain), MODEL)
    assert plan.overlap == "off" and "micro-bench" in plan.reason("overlap")


def test_overlap_off_when_copies_do_not_overlap_compute() -> None:
    plan = resolve_plan(fake.linux_pcie5_x16(overlaps_compute=False), MODEL)
    assert plan.overlap == "off" and "does not overlap" in plan.reason("overlap")
    plan = resolve_plan(fake.linux_pcie5_x16(copy_engines=0), MODEL)
    assert plan.overlap == "off" and "no copy engine" in plan.reason("overlap")


def test_unknown_copy_engines_pick_the_split_that_needs_one() -> None:
    plan = resolve_plan(fake.linux_pcie5_x16(copy_engines=None, h2d_gbps=None), MODEL)
    assert plan.overlap == "shared-side" and "unknown" in plan.reason("overlap")
    assert plan.layer_major  # still on; the reason just has no timing
    check_reasons(plan)


def test_profile_without_pinnable_estimate_still_plans() -> None:
    profile = fake.wsl2_rtx5070ti().with_facts(h2d_pinned_gbps=measured(41.5))
    profile = profile.with_facts(pinnable_bytes=type(profile.pinnable_bytes)(None, "unavailable", "unknown"))
    plan = resolve_plan(profile, MODEL)
    assert plan.bank == "pin-all" and "unknown" in plan.reason("bank")


def test_bad_options_are_option_errors() -> None:
    with pytest.raises(OptionError):
        resolve_plan(fake.wsl2_rtx5070ti(), MODEL, {"overlap": "sideways"})
    with pytest.raises(OptionError, match="exceeds"):
        resolve_plan(fake.wsl2_rtx5070ti(), MODEL, {"max_context": 10**7})
    with pytest.raises(OptionError):
        resolve_plan(fake.wsl2_rtx5070ti(), MODEL, device="tpu")


def test_resolve_plan_is_pure() -> None:
    profile = fake.wsl2_rtx5070ti()
    assert resolve_plan(profile, MODEL).to_dict() == resolve_plan(profile, MODEL).to_dict()


QWEN36_TEXT = {
    "model_type": "qwen3_5_moe",
    "tie_word_embeddings": False,
    "text_config": {
        "model_type": "qwen3_5_moe_text", "dtype": "bfloat16", "attn_output_gate": True, "full_attention_interval": 4,
        "head_dim": 256, "hidden_act": "silu", "hidden_size": 2048, "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
        "linear_value_head_dim": 128, "max_position_embeddings": 262144, "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512, "num_experts": 256, "num_experts_per_tok": 8,
        "num_attention_heads": 16, "num_hidden_layers": 40, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
        "rope_parameters": {"partial_rotary_factor": 0.25, "rope_theta": 10000000, "rope_type": "default"},
        "tie_word_embeddings": False, "vocab_size": 248320,
    },
}


def test_model_facts_from_config_match_the_reference_arithmetic() -> None:
    cfg = parse_model_config(QWEN36_TEXT)
    bf16 = ModelFacts.from_config(cfg)
    # shared/reference/model-formats.md §5: BF16 dense 4,896,711,936 B, 6 MiB per expert, 20,480 B KV per token
    assert bf16.dense_bytes == 4_896_711_936
    assert bf16.expert_bytes == 6 * 2**20 and bf16.experts_total_bytes == 64_424_509_440
    assert bf16.kv_bytes_per_token == 20_480
    assert bf16.state_bytes == 60 * 2**20 + 1_474_560
    nvfp4 = ModelFacts.from_config(cfg, expert_dtype_bytes=0.5, block_scale_group=16, dense_bytes=2_705_517_300,
                                   name=MODEL.name)
    assert nvfp4 == MODEL
    assert MODEL.experts_total_bytes == 18_245_222_400  # the seeds' 18.245 GB bank


def test_bf16_experts_on_a_16gb_card() -> None:
    bf16 = ModelFacts.from_config(parse_model_config(QWEN36_TEXT), name="Qwen3.6-35B-A3B BF16")
    plan = resolve_plan(fake.linux_pcie5_x16(ram_total=128.0, ram_available=120.0), bf16)
    assert plan.bank == "pin-all" and not plan.all_resident and plan.slots >= bf16.num_experts
    with pytest.raises(ResourceError, match="host RAM"):
        resolve_plan(fake.linux_pcie5_x16(ram_total=48.0, ram_available=40.0), bf16)


def test_the_prefill_chunk_rule() -> None:
    """memory.prefill_chunk_for: the chunk asked; the CPU's small one; on a GPU the large one unless it does not
    fit, costs context, or costs more than LARGE_CHUNK_SLOT_SHARE of the slots (all resident: no cost)."""
    from qwenlocal.engine.memory import (GPU_PREFILL_CHUNK as LARGE, LARGE_CHUNK_SLOT_SHARE as SHARE,
                                         SMALL_PREFILL_CHUNK as SMALL, prefill_chunk_for)

    def at(large, small):
        return lambda chunk: large if chunk == LARGE else small
    assert prefill_chunk_for("cuda", 512, at(None, None)) == 512
    assert prefill_chunk_for("cpu", None) == SMALL
    assert prefill_chunk_for("cuda", None) == LARGE
    assert prefill_chunk_for("cuda", None, at(None, (1000, False, 4096))) == SMALL
    assert prefill_chunk_for("cuda", None, at((950, False, 65536), (1000, False, 65536))) == LARGE
    lost = int(1000 * (1 - SHARE)) - 1
    assert prefill_chunk_for("cuda", None, at((lost, False, 65536), (1000, False, 65536))) == SMALL
    assert prefill_chunk_for("cuda", None, at((990, False, 32768), (1000, False, 65536))) == SMALL
    assert prefill_chunk_for("cuda", None, at((10240, True, 262144), (10240, True, 262144))) == LARGE


def test_an_asked_chunk_is_the_users_and_the_cpu_keeps_the_small_one() -> None:
    plan = resolve_plan(fake.wsl2_rtx5070ti(), MODEL, {"prefill_chunk": 2048})
    assert plan.prefill_chunk == 2048 and "overridden by user" in plan.reason("prefill_chunk")
    assert "8,192" in plan.reason("prefill_chunk")  # what auto would have taken
    laptop = resolve_plan(fake.laptop_pcie4_x8(), MODEL, {"prefill_chunk": 4096})
    assert laptop.prefill_chunk == 4096 and "2,048" in laptop.reason("prefill_chunk")  # auto there: the small one
    cpu = resolve_plan(fake.wsl2_rtx5070ti(), MODEL, device="cpu")
    assert cpu.prefill_chunk == 2048 and "CPU" in cpu.reason("prefill_chunk")
    check_reasons(plan)
