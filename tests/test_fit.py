"""Fit-check arithmetic against hand numbers for the real model (shared/reference/model-formats.md §2-5), and
agreement with engine/plan.py's resolve_plan on what fits in VRAM."""
import json
import struct

import pytest

from qwenlocal.app.fit import DISK_MARGIN, check_fit, disk_report, facts_from_checkpoint, vram_minimum
from qwenlocal.engine.errors import ResourceError
from qwenlocal.engine.options import EngineOptions
from qwenlocal.engine.plan import QWEN36_35B_A3B_NVFP4, resolve_plan
from qwenlocal.engine.probe.fake import fake_cpu_profile, fake_gpu_profile, h200, wsl2_rtx5070ti
from qwenlocal.engine.registry import KNOWN_MODELS, QWEN36_35B_A3B_BF16, find_known, smaller_alternatives

GIB = 2**30
NVFP4 = find_known("qwen3.6-35b-a3b-nvfp4")
BF16 = find_known("qwen3.6-35b-a3b")


def test_registry_sizes_are_the_reference_numbers():
    assert QWEN36_35B_A3B_NVFP4.experts_total_bytes == 18_245_222_400  # 40 x 256 x 1,781,760 (bank layout)
    assert QWEN36_35B_A3B_BF16.experts_total_bytes == 64_424_509_440  # 60.0 GiB
    assert QWEN36_35B_A3B_BF16.experts_total_bytes == 60 * GIB
    assert QWEN36_35B_A3B_BF16.dense_bytes == 4_896_711_936 and QWEN36_35B_A3B_NVFP4.dense_bytes == 2_705_517_300
    assert BF16.download_bytes == 71_903_645_408 and NVFP4.download_bytes == 23_407_457_492
    assert {e.expert_format for e in KNOWN_MODELS} == {"bf16", "nvfp4"}
    assert find_known("Qwen/Qwen3.5-35B-A3B").aliases[0] == "qwen3.5-35b-a3b"
    assert smaller_alternatives(BF16) == [NVFP4]


def test_vram_minimum_by_hand():
    opts = EngineOptions()  # no budget: the GPU's 8,192-token chunk; the plan's smallest context 4096
    workspace = 768 * 2**20 + 8192 * 128 * 1024
    kv = 4096 * 20_480
    state = 30 * (32 * 128 * 128 * 4 + 8192 * 3 * 2)
    assert state == 64_389_120
    nvfp4 = vram_minimum(QWEN36_35B_A3B_NVFP4, opts)
    assert nvfp4 == {"dense": 2_705_517_300, "state": state, "workspace": workspace, "kv": kv,
                     "prefill stream buffers": 2 * 256 * 1_781_760, "one layer of slots": 256 * 1_781_760}
    assert sum(nvfp4.values()) == 4_383_664_884 + 912_261_120 + 6144 * 128 * 1024
    assert sum(vram_minimum(QWEN36_35B_A3B_BF16, opts).values()) == 7_729_341_696 + 3_221_225_472 + 6144 * 128 * 1024
    small = vram_minimum(QWEN36_35B_A3B_NVFP4, EngineOptions(prefill_chunk=2048))
    assert small["workspace"] == 768 * 2**20 + 2048 * 128 * 1024  # one layer = 256 x 6 MiB; two stream buffers


def test_bf16_bank_does_not_fit_32_gib_of_ram():
    report = check_fit(QWEN36_35B_A3B_BF16, fake_gpu_profile(ram_total=32.0, ram_available=28.0),
                       alternatives=KNOWN_MODELS)
    ram = next(i for i in report.items if i.what == "host RAM")
    assert not report.ok and ram.status == "fail" and ram.need == 64_424_509_440 and ram.have == 32 * GIB
    msg = report.message()
    assert "60.0 GiB" in msg and "32.0 GiB" in msg and "nvidia/Qwen3.6-35B-A3B-NVFP4" in msg
    with pytest.raises(ResourceError, match="--force"):
        report.raise_if_unfit()
    report.raise_if_unfit(force=True)


def test_nvfp4_on_the_seeds_machine_fits_with_a_pinning_caveat():
    # WSL2 pins about half of 32 GiB: the 17 GiB bank runs, partly pageable.
    report = check_fit(QWEN36_35B_A3B_NVFP4, wsl2_rtx5070ti(ram_total=32.0, ram_available=30.0))
    assert report.ok
    assert [i.what for i in report.warnings] == ["pinned RAM"]
    vram = next(i for i in report.items if i.what == "VRAM")
    # The plan's context: KV may take a third of the 14.6 GiB budget left after the dense part -> 131,072; the
    # GPU's 8,192-token chunk (6,144 tokens of workspace more than 2,048's).
    assert vram.need == 4_383_664_884 + (131_072 - 4096) * 20_480 + 2 * 256 * 1_781_760 + 6144 * 128 * 1024
    assert "131,072 tokens" in vram.detail
    assert "expert slots" in vram.detail
    assert check_fit(QWEN36_35B_A3B_NVFP4, wsl2_rtx5070ti(ram_total=64.0, ram_available=60.0)).warnings == []


def test_small_gpu_lists_every_problem_and_the_ways_out():
    laptop = fake_gpu_profile(vram_total=6.0, vram_free=5.5, ram_total=16.0, ram_available=12.0)
    report = check_fit(QWEN36_35B_A3B_BF16, laptop, alternatives=KNOWN_MODELS)
    assert sorted(i.what for i in report.failures) == ["VRAM", "host RAM"]
    vram = next(i for i in report.failures if i.what == "VRAM")
    assert any("nvidia/Qwen3.6-35B-A3B-NVFP4" in a for a in vram.advice)  # its 4.1 GiB minimum fits 5.3 GiB
    ram = next(i for i in report.failures if i.what == "host RAM")
    assert not any("NVFP4" in a for a in ram.advice)  # its 17 GiB bank does not fit 16 GiB either: not offered
    # A long context that does not fit: the advice names a shorter one.
    tight = check_fit(QWEN36_35B_A3B_NVFP4, h200(), options={"vram_budget": "6GiB", "max_context": 262_144})
    assert not tight.ok and "--max-context 32,768" in tight.message()


def test_busy_gpu_says_close_programs():
    busy = fake_gpu_profile(vram_total=15.9, vram_free=3.0)
    assert "close other programs using the GPU" in check_fit(QWEN36_35B_A3B_NVFP4, busy).message()


def test_cpu_path_needs_all_weights_in_ram():
    report = check_fit(QWEN36_35B_A3B_BF16, fake_cpu_profile(ram_total=32.0), alternatives=KNOWN_MODELS)
    assert report.device == "cpu" and not report.ok and "nvidia/Qwen3.6-35B-A3B-NVFP4" in report.message()


def test_disk_check():
    full = disk_report("x", 23_407_457_492, None, free_disk=10 * 10**9)
    assert not full.ok and "--dir" in full.message()
    ok = check_fit(QWEN36_35B_A3B_NVFP4, h200(), download_bytes=23_407_457_492, free_disk=100 * 10**9)
    disk = ok.items[0]
    assert ok.ok and disk.what == "disk" and disk.need == 23_407_457_492 + DISK_MARGIN


@pytest.mark.parametrize("facts", [QWEN36_35B_A3B_NVFP4, QWEN36_35B_A3B_BF16], ids=["nvfp4", "bf16"])
@pytest.mark.parametrize("context", [None, 32_768, 131_072])
def test_vram_verdict_agrees_with_resolve_plan(facts, context):
    profile = h200()
    for quarter_gib in range(8, 48):
        opts = EngineOptions(vram_budget=quarter_gib * GIB // 4, max_context=context)
        fits = next(i for i in check_fit(facts, profile, options=opts).items if i.what == "VRAM").status == "ok"
        try:
            resolve_plan(profile, facts, opts, device="cuda")
            planned = True
        except ResourceError:
            planned = False
        assert fits == planned, f"budget {quarter_gib / 4} GiB, context {context}"


def test_sizes_read_from_an_nvfp4_checkpoint_match_the_reference(tmp_path):
    """A header-only NVFP4 checkpoint in the real geometry (sparse files, nothing written): expert bytes as
    stored are 1,769,484 per expert, 18,119,516,160 for the bank (model-formats §3.3)."""
    cfg = {"model_type": "qwen3_5_moe", "tie_word_embeddings": False, "text_config": {
        "model_type": "qwen3_5_moe_text", "hidden_size": 2048, "num_hidden_layers": 40, "vocab_size": 248320,
        "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256, "full_attention_interval": 4,
        "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 16,
        "linear_num_value_heads": 32, "linear_value_head_dim": 128, "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512, "num_experts": 256, "num_experts_per_tok": 8,
        "max_position_embeddings": 262144, "rms_norm_eps": 1e-6, "eos_token_id": 248044,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25}}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    header, offset = {}, 0

    def add(name, dtype, shape, nbytes):
        nonlocal offset
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes

    for layer in range(40):
        for e in range(256):
            for proj, (rows, cols) in (("gate_proj", (512, 2048)), ("up_proj", (512, 2048)), ("down_proj", (2048, 512))):
                p = f"model.language_model.layers.{layer}.mlp.experts.{e}.{proj}"
                add(f"{p}.weight", "U8", [rows, cols // 2], rows * cols // 2)
                add(f"{p}.weight_scale", "F8_E4M3", [rows, cols // 16], rows * cols // 16)
                add(f"{p}.weight_scale_2", "F32", [], 4)
    add("model.language_model.embed_tokens.weight", "BF16", [248320, 2048], 248320 * 2048 * 2)
    add("model.visual.pos_embed.weight", "BF16", [2304, 1152], 2304 * 1152 * 2)  # skipped: not text
    raw = json.dumps(header).encode()
    with open(tmp_path / "model.safetensors", "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        fh.truncate(8 + len(raw) + offset)  # sparse: the length the header promises, no data written
    (tmp_path / "tokenizer.json").write_text("{}")
    facts = facts_from_checkpoint(tmp_path)
    assert facts.expert_bytes == 1_769_484
    assert facts.experts_total_bytes == 18_119_516_160
    assert facts.dense_bytes == 1_017_118_720  # embed only; the vision tensor is not counted
    assert facts.kv_bytes_per_token == 20_480 and facts.state_bytes == 64_389_120
