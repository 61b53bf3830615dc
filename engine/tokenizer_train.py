"""Train tiny tokenizers with Qwen3.5/3.6's exact pipeline, for tests and toy checkpoints. No torch import.

The result differs from the real tokenizer only in its merges: the normalizer, pre-tokenizer, decoder and the
added tokens (same order, same special flags, appended right after the base vocabulary) are Qwen's.
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from importlib import resources
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

# The Qwen3.5 split regex (transformers' Qwen3_5Tokenizer); unlike Qwen2/3 it keeps combining marks (\p{M}) in words.
PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# (content, special) in Qwen's id order, starting at the first id after the base vocabulary (248044 in the real
# one). Special tokens are dropped by decode(skip_special_tokens=True); the tool/think/fim tags are not special in
# Qwen's tokenizer_config, so they always decode as text.
ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)

# transformers rebuilds this class's pipeline from the file's vocab and merges, and that pipeline is the one above;
# "Qwen2Tokenizer" would swap in Qwen2's split regex, which tokenizes combining marks differently.
TOKENIZER_CLASS = "Qwen3_5Tokenizer"
MODEL_MAX_LENGTH = 262144


def _qwen_pipeline() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE(unk_token=None, byte_fallback=False, fuse_unk=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    return tokenizer


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """A byte-level BPE of (at most) `vocab_size` base tokens, followed by Qwen's added tokens."""
    if vocab_size < 256:
        raise ValueError(f"vocab_size {vocab_size} is below the 256 byte tokens every byte-level BPE needs")
    tokenizer = _qwen_pipeline()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    for content, special in ADDED_TOKENS:  # one at a time: ids follow the call order
        token = AddedToken(content, special=special, normalized=False)
        (tokenizer.add_special_tokens if special else tokenizer.add_tokens)([token])
    return tokenizer


def _added_tokens_decoder(tokenizer: Tokenizer) -> dict[str, dict]:
    return {
        str(i): {
            "content": t.content,
            "lstrip": t.lstrip,
            "normalized": t.normalized,
            "rstrip": t.rstrip,
            "single_word": t.single_word,
            "special": t.special,
        }
        for i, t in sorted(tokenizer.get_added_tokens_decoder().items())
    }


def default_chat_template() -> str:
    return resources.files("qwenlocal.assets").joinpath("chat_template.jinja").read_text(encoding="utf-8")


def write_tokenizer_files(out_dir: str | Path, tokenizer: Tokenizer, *, chat_template: str | None = None) -> None:
    """tokenizer.json, tokenizer_config.json and chat_template.jinja, laid out like a Qwen3.6 checkpoint."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    config = {
        "add_prefix_space": False,
        "added_tokens_decoder": _added_tokens_decoder(tokenizer),
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": MODEL_MAX_LENGTH,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": TOKENIZER_CLASS,
        "unk_token": None,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", "utf-8")
    template = default_chat_template() if chat_template is None else chat_template
    (out_dir / "chat_template.jinja").write_text(template, encoding="utf-8")


def default_corpus() -> list[str]:
    """A few KB of English, code, digits and non-ASCII text: enough to train tokenizers for tests."""
    text = resources.files("qwenlocal.assets").joinpath("tokenizer_corpus.txt").read_text(encoding="utf-8")
    return [para for para in text.split("\n\n") if para.strip()]
