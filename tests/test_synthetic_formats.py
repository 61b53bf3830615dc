"""`synthetic:NAME-nvfp4` in nvidia/Qwen3.6-35B-A3B-NVFP4's formats (shared/reference/model-formats.md §3.1):
every weight in its real format, the values those formats compute, the plan's dense bytes as stored, and the
BF16 variant left all BF16. CPU, tiny geometry; the full size by arithmetic only."""
import re

import pytest
import torch

from qwenlocal.engine import Engine
from qwenlocal.engine.checkpoint import Checkpoint
from qwenlocal.engine.choices import stored_dense_bytes
from qwenlocal.engine.config import load_model_config
from qwenlocal.engine.load import dense_shapes, load_weights
from qwenlocal.engine.plan import QWEN36_35B_A3B_NVFP4, ModelFacts
from qwenlocal.engine.quant.convert import quantize_checkpoint
from qwenlocal.engine.quant.formats import dequant_fp8, dequant_nvfp4, quantize_fp8, quantize_nvfp4
from qwenlocal.engine.quant.linear import QuantLinear
from qwenlocal.engine.quant.nvfp4_rows import dequant_expert_rows, nvfp4_expert_row_bytes, quantize_expert_rows
from qwenlocal.engine.quant.synthetic_formats import quantize_nvfp4_blocked
from qwenlocal.engine.registry import synthetic_facts
from qwenlocal.engine.quant.synthetic_formats import stored_dense_bytes_of
from qwenlocal.engine.synthetic import synthetic_config, synthetic_geometry
from qwenlocal.engine.tiny import random_weights

REF = "synthetic:tiny-nvfp4"
NATIVE = {"prefill_chunk": 16, "linear_format": "native", "expert_format": "nvfp4"}
# The real checkpoint's table (model-formats §3.1), written out here rather than taken from the code under test.
REAL_FORMATS = (
    (r"lm_head\.weight", "nvfp4"),
    (r"layers\.\d+\.mlp\.shared_expert\.(gate|up|down)_proj\.weight", "nvfp4"),
    (r"layers\.\d+\.self_attn\.(q|k|v|o)_proj\.weight", "fp8"),
    (r"layers\.\d+\.linear_attn\.(in_proj_qkv|in_proj_z|out_proj)\.weight", "fp8"),
    (r"layers\.\d+\.mlp\.experts\.nvfp4_rows", "nvfp4 rows"),
    (r"embed_tokens\.weight|norm\.weight|layers\.\d+\.(input_layernorm|post_attention_layernorm)\.weight", "bf16"),
    (r"layers\.\d+\.mlp\.(gate|shared_expert_gate)\.weight", "bf16"),
    (r"layers\.\d+\.linear_attn\.(in_proj_a\.weight|in_proj_b\.weight|conv1d\.weight|norm\.weight|A_log|dt_bias)",
     "bf16"),
    (r"layers\.\d+\.self_attn\.(q_norm|k_norm)\.weight", "bf16"),
)


def real_format(name: str) -> str:
    found = [fmt for pattern, fmt in REAL_FORMATS if re.fullmatch(pattern, name)]
    assert len(found) == 1, f"{name}: {found}"
    return found[0]


def is_bf16_value(t: torch.Tensor) -> bool:
    return torch.equal(t, t.to(torch.bfloat16).to(t.dtype))


def format_of(name: str, w, cfg) -> str:
    """The format a weight of the engine is in, checked down to dtypes and shapes."""
    shapes = dense_shapes(cfg)
    if name.endswith("nvfp4_rows"):
        assert w.dtype == torch.uint8
        assert w.shape == (cfg.moe.num_experts, nvfp4_expert_row_bytes(cfg.hidden_size, cfg.moe.intermediate_size))
        return "nvfp4 rows"
    if isinstance(w, QuantLinear):
        out, inp = shapes[name]
        t = w.tensors
        if w.fmt == "nvfp4":
            assert set(t) == {"weight", "weight_scale", "weight_scale_2"}
            assert t["weight"].dtype == torch.uint8 and t["weight"].shape == (out, inp // 2)
            assert t["weight_scale"].dtype == torch.float8_e4m3fn and t["weight_scale"].shape == (out, inp // 16)
        else:
            assert set(t) == {"weight", "weight_scale"}
            assert t["weight"].dtype == torch.float8_e4m3fn and t["weight"].shape == (out, inp)
        last = "weight_scale_2" if w.fmt == "nvfp4" else "weight_scale"
        assert t[last].dtype == torch.float32 and t[last].shape == ()  # one fp32 global scale per tensor
        return w.fmt
    assert isinstance(w, torch.Tensor) and w.shape == shapes[name] and is_bf16_value(w), name
    return "bf16"


@pytest.fixture(scope="module")
def native():
    return Engine.from_pretrained(REF, device="cpu", options=NATIVE)


@pytest.fixture(scope="module")
def dequantized():
    return Engine.from_pretrained(REF, device="cpu", options={"prefill_chunk": 16})


@pytest.fixture(scope="module")
def export(tiny_ckpt, tmp_path_factory):
    """A real ModelOpt-layout export (quant/convert.py) of a BF16 checkpoint of the same geometry and vocab."""
    return quantize_checkpoint(tiny_ckpt, tmp_path_factory.mktemp("tiny-export"))


def test_every_weight_has_the_real_checkpoints_format(native):
    cfg, weights = native.config, native._shared.weights
    assert set(weights) == set(dense_shapes(cfg)) | {f"layers.{i}.mlp.experts.nvfp4_rows" for i in range(cfg.num_layers)}
    for name, w in weights.items():
        assert format_of(name, w, cfg) == real_format(name), name
    for i, kind in enumerate(cfg.layer_types):  # and per layer, the whole set
        mine = {n[len(f"layers.{i}."):]: format_of(n, w, cfg) for n, w in weights.items() if n.startswith(f"layers.{i}.")}
        attn = ({"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                 "self_attn.o_proj.weight"} if kind == "full_attention" else
                {"linear_attn.in_proj_qkv.weight", "linear_attn.in_proj_z.weight", "linear_attn.out_proj.weight"})
        shared = {f"mlp.shared_expert.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")}
        assert {n for n, f in mine.items() if f == "fp8"} == attn
        assert {n for n, f in mine.items() if f == "nvfp4"} == shared
        assert mine["mlp.experts.nvfp4_rows"] == "nvfp4 rows" and mine["mlp.gate.weight"] == "bf16"
    assert not cfg.tie_word_embeddings and format_of("embed_tokens.weight", weights["embed_tokens.weight"], cfg) == "bf16"


def test_formats_are_those_of_a_real_modelopt_export(native, export):
    """The same weights in the same formats, dtypes and shapes as load.py makes of convert.py's checkpoint."""
    cfg = load_model_config(export)
    assert cfg.vocab_size == native.config.vocab_size and cfg.quantization["quant_algo"] == "MIXED_PRECISION"
    real = load_weights(Checkpoint(export), cfg, torch.float32, native_nvfp4=True, native_linears=True)
    mine = native._shared.weights
    assert set(real) == set(mine)
    for name, w in real.items():
        assert type(w) is type(mine[name]), name
        if isinstance(w, QuantLinear):
            assert w.fmt == mine[name].fmt and w.nbytes == mine[name].nbytes, name
            for k, t in w.tensors.items():
                assert (t.dtype, t.shape) == (mine[name].tensors[k].dtype, mine[name].tensors[k].shape), (name, k)
        else:
            assert (w.dtype, w.shape) == (mine[name].dtype, mine[name].shape), name


def test_values_are_dequantize_of_quantize_of_the_bf16_weights(dequantized, native):
    """The CPU path holds exactly what loading the real checkpoint dequantizes: the seeded weights rounded to
    BF16, quantized with ModelOpt's recipe, dequantized to the compute dtype. Native linears dequantize to it too."""
    cfg, got = dequantized.config, dequantized._shared.weights
    _, geometry, _ = synthetic_geometry(REF)
    bf16 = {n: t.to(torch.bfloat16) for n, t in random_weights(geometry, cfg.vocab_size, 0).items()}
    checked = 0
    for name, w in got.items():
        if ".mlp.experts." in name:
            continue
        fmt = real_format(name)
        if fmt == "nvfp4":
            want = dequant_nvfp4(*quantize_nvfp4(bf16[name]), dtype=torch.float32)
        elif fmt == "fp8":
            want = dequant_fp8(*quantize_fp8(bf16[name]), dtype=torch.float32)
        else:
            want = bf16[name].float()
        assert isinstance(w, torch.Tensor) and w.dtype == torch.float32 and torch.equal(w, want), name
        if fmt != "bf16":
            assert torch.equal(native._shared.weights[name].dequantize(), want), name
            assert not torch.equal(want, bf16[name].float())  # quantized: not the BF16 values
        checked += 1
    assert checked == len(dense_shapes(cfg))
    for layer in range(cfg.num_layers):
        p = f"layers.{layer}.mlp.experts."
        gate_up, down = dequant_expert_rows(quantize_expert_rows(bf16[p + "gate_up_proj"], bf16[p + "down_proj"]),
                                            cfg.hidden_size, cfg.moe.intermediate_size, torch.float32)
        assert torch.equal(got[p + "gate_up_proj"], gate_up) and torch.equal(got[p + "down_proj"], down)


def test_engine_runs_score_and_chat_native_and_dequantized_agree(native, dequantized):
    assert native.plan["linears"]["value"] == "native fp8/nvfp4"
    assert dequantized.plan["linears"]["value"] == "dense"  # CPU default: dequantized at load
    ids = torch.randint(0, 600, (21 + 9,), generator=torch.Generator().manual_seed(8))
    logits = native.score(ids, prefill=21)
    assert logits.shape == (30, native.config.vocab_size) and torch.isfinite(logits).all() and logits.std() > 0.1
    assert torch.equal(logits, dequantized.score(ids, prefill=21))
    done = list(native.chat([{"role": "user", "content": "hi"}], {"max_tokens": 5, "seed": 2}))[-1]
    assert type(done).__name__ == "TurnDone" and 1 <= done.completion_tokens <= 5


def test_plan_dense_bytes_are_the_stored_bytes(native, export):
    cfg, weights = native.config, native._shared.weights
    plan = native.engine_config
    assert plan.linears == "native" and not plan.linear_kernels  # kept native; no Triton GEMV on the CPU
    figure = stored_dense_bytes_of(cfg)
    # What the real checkpoint's path passes to machine_plan (choices.stored_dense_bytes of the export) ...
    assert figure == stored_dense_bytes(Checkpoint(export))
    # ... = the bytes the synthetic model holds in those formats (BF16 rest at 2 B, A_log/dt_bias too, as stored),
    # plus the static input_scale (4 B) the export stores per FP8 linear and no BF16-activation kernel reads.
    quant = [w for w in weights.values() if isinstance(w, QuantLinear)]
    bf16 = sum(2 * w.numel() for n, w in weights.items() if isinstance(w, torch.Tensor) and ".mlp.experts." not in n)
    n_fp8 = sum(w.fmt == "fp8" for w in quant)
    assert figure == sum(w.nbytes for w in quant) + bf16 + 4 * n_fp8
    assert native.placement()["quantized_linears"] == sum(w.nbytes for w in quant)
    dequant = Engine.from_pretrained(REF, device="cpu", options={"linear_format": "dequantized"})
    assert dequant.engine_config.linears == "dequantized"
    assert not any(isinstance(w, QuantLinear) for w in dequant._shared.weights.values())


def test_full_size_stored_dense_bytes_are_the_nvfp4_checkpoints():
    """No weights made: the full-size geometry's stored dense bytes against plan.py's NVFP4 figure (§3.4: shared
    experts 70,779,360 + lm_head 286,064,644 + GDN FP8 1,006,633,680 + attention FP8 272,630,080 + BF16 rest
    1,069,409,536), the fit check's sizes, and the BF16 variant's 4.9 GB."""
    cfg = synthetic_config("synthetic:qwen3.6-35b-a3b-nvfp4", 0)
    assert cfg.vocab_size == 248_320 and not cfg.tie_word_embeddings
    stored = stored_dense_bytes_of(cfg)
    assert stored == QWEN36_35B_A3B_NVFP4.dense_bytes == 2_705_517_300
    assert synthetic_facts("synthetic:qwen3.6-35b-a3b-nvfp4").dense_bytes == stored
    bf16 = synthetic_config("synthetic:qwen3.6-35b-a3b", 0)
    assert ModelFacts.from_config(bf16).dense_bytes == synthetic_facts("synthetic:qwen3.6-35b-a3b").dense_bytes \
        == 4_896_711_936


def test_bf16_synthetic_stays_all_bf16():
    engine = Engine.from_pretrained("synthetic:tiny", device="cpu", options={"linear_format": "native"})
    assert engine.plan["linears"]["value"] == "dense" and engine.plan["experts"]["value"] == "dense"
    weights = engine._shared.weights
    assert all(isinstance(w, torch.Tensor) for w in weights.values())
    ref = random_weights(synthetic_geometry("synthetic:tiny")[1], engine.config.vocab_size, 0)
    for name in ("lm_head.weight", "layers.0.linear_attn.in_proj_qkv.weight", "layers.3.self_attn.q_proj.weight"):
        assert torch.equal(weights[name], ref[name])  # the seeded values, not rounded or quantized


@pytest.mark.parametrize("rows, inp, block_bytes", [(37, 48, 48 * 64 * 5), (1, 16, 1), (9, 80, 80 * 64 * 9)])
def test_blocked_nvfp4_quantization_is_byte_equal_to_one_call(rows, inp, block_bytes):
    w = torch.randn(rows, inp, generator=torch.Generator().manual_seed(rows)) * 3
    w[rows // 2, 5] = 40.0  # the global amax in one block only: the others must still use it
    for a, b in zip(quantize_nvfp4_blocked(w, block_bytes), quantize_nvfp4(w)):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a.view(torch.uint8) if a.dtype == torch.float8_e4m3fn else a,
                           b.view(torch.uint8) if b.dtype == torch.float8_e4m3fn else b)
