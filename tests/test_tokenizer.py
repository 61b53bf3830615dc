"""ChatTokenizer, the streaming helpers and the tiny-tokenizer trainer, checked against transformers (CPU, fast)."""
from __future__ import annotations

import json
import time
import unicodedata

import pytest
from tokenizers import Tokenizer

from qwenlocal.engine.errors import CheckpointError, ConfigError
from qwenlocal.engine.tokenizer import ChatTokenizer, StreamDecoder, ThinkSplitter
from qwenlocal.engine.tokenizer_train import (
    ADDED_TOKENS,
    default_chat_template,
    default_corpus,
    train_tokenizer,
    write_tokenizer_files,
)

TEXTS = [
    "def add(a, b):\n    return a + b  # sum\n\nprint(add(2, 40))",
    "Café naïve straße — ½ ≥ 3 “quotes” 你好，世界！ こんにちは 안녕 Привет مرحبا",
    "Emoji 😀🎉🚀 👍🏽 👨‍👩‍👧 and 🇯🇵 mixed with 東京 and tabs\tand\r\nCRLF",
]

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}

CONVERSATIONS = {
    "single_user": [{"role": "user", "content": "What is 2+2?"}],
    "system_multi_turn": [
        {"role": "system", "content": "  You are terse.  "},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!", "reasoning_content": "Greet back."},
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "<think>\nRecall geography.\n</think>\n\nParis."},
        {"role": "user", "content": "And of Japan? 東京?"},
    ],
    "content_parts": [
        {"role": "user", "content": [{"type": "text", "text": "Describe "}, {"type": "image"}, {"text": "this."}]},
    ],
    "tool_round_trip": [
        {"role": "system", "content": "Use tools when useful."},
        {"role": "user", "content": "Weather in Paris and Oslo?"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "reasoning_content": "Two cities, two calls.",
            "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}},
                {"function": {"name": "get_weather", "arguments": {"city": "Oslo", "opts": {"unit": "°C"}}}},
            ],
        },
        {"role": "tool", "content": '{"temp": 18}'},
        {"role": "tool", "content": '{"temp": 4}'},
        {"role": "assistant", "content": "Paris 18°C, Oslo 4°C.", "reasoning_content": "Summarize."},
        {"role": "user", "content": "Thanks"},
    ],
}

RENDER_CASES = [
    ("single_user", {"enable_thinking": True}, None),
    ("single_user", {"enable_thinking": False}, None),
    ("system_multi_turn", {"enable_thinking": True}, None),
    ("system_multi_turn", {"enable_thinking": False}, None),
    ("system_multi_turn", {"enable_thinking": True, "preserve_thinking": True}, None),
    ("system_multi_turn", {"enable_thinking": True, "add_generation_prompt": False}, None),
    ("content_parts", {"enable_thinking": True}, None),
    ("tool_round_trip", {"enable_thinking": True}, [WEATHER_TOOL]),
    ("tool_round_trip", {"enable_thinking": True, "preserve_thinking": True}, [WEATHER_TOOL]),
    ("tool_round_trip", {"enable_thinking": False, "add_generation_prompt": False}, [WEATHER_TOOL]),
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok")
    write_tokenizer_files(path, train_tokenizer(default_corpus(), 600))
    return path


@pytest.fixture(scope="module")
def tok(model_dir):
    return ChatTokenizer.from_dir(model_dir)


@pytest.fixture(scope="module")
def hf(model_dir):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(model_dir))


# --- trainer and files ---------------------------------------------------------------------------------------------


def test_training_is_fast_and_appends_added_tokens_in_qwen_order():
    start = time.perf_counter()
    trained = train_tokenizer(default_corpus(), 600)
    assert time.perf_counter() - start < 2.0
    added = trained.get_added_tokens_decoder()
    base = min(added)
    assert base == 600 and trained.get_vocab_size() == 600 + len(ADDED_TOKENS)
    assert [(added[base + i].content, added[base + i].special) for i in range(len(ADDED_TOKENS))] == list(ADDED_TOKENS)


def test_written_files_look_like_a_qwen_checkpoint(model_dir):
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    assert config["eos_token"] == "<|im_end|>" and config["pad_token"] == "<|endoftext|>"
    think = config["added_tokens_decoder"]["624"]
    assert think["content"] == "<think>" and not think["special"] and not think["normalized"]
    assert config["added_tokens_decoder"]["602"]["special"]
    assert (model_dir / "chat_template.jinja").read_text() == default_chat_template()


def test_default_corpus_is_varied():
    corpus = "\n".join(default_corpus())
    assert 2000 < len(corpus.encode()) < 10000
    assert "def " in corpus and any(c.isdigit() for c in corpus) and "你好" in corpus and "😀" in corpus


def test_transformers_loads_it_as_a_fast_tokenizer(hf, tok):
    assert hf.is_fast and len(hf) == tok.vocab_size


# --- chat template ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "kwargs", "tools"), RENDER_CASES)
def test_render_matches_transformers(tok, hf, name, kwargs, tools):
    messages = CONVERSATIONS[name]
    kwargs = {"add_generation_prompt": True, **kwargs}
    ours = tok.render(messages, tools=tools, **kwargs)
    assert ours == hf.apply_chat_template(messages, tools=tools, tokenize=False, **kwargs)
    assert tok.encode(ours) == hf(ours, add_special_tokens=False)["input_ids"]


def test_encode_chat_matches_transformers(tok, hf):
    messages = CONVERSATIONS["system_multi_turn"]
    for thinking in (True, False):
        expected = hf.apply_chat_template(
            messages, tokenize=True, return_dict=False, add_generation_prompt=True, enable_thinking=thinking
        )
        assert tok.encode_chat(messages, enable_thinking=thinking) == expected


def test_template_behaviour_of_section_4(tok):
    single = CONVERSATIONS["single_user"]
    assert tok.render(single).endswith("<|im_start|>assistant\n<think>\n")
    assert tok.render(single, enable_thinking=False).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    history = tok.render(CONVERSATIONS["system_multi_turn"])
    assert history.startswith("<|im_start|>system\nYou are terse.<|im_end|>\n")
    assert "Greet back." not in history and "Recall geography." not in history  # before the last user query
    assert "<|im_start|>assistant\nParis.<|im_end|>" in history
    preserved = tok.render(CONVERSATIONS["system_multi_turn"], preserve_thinking=True)
    assert "<|im_start|>assistant\n<think>\nRecall geography.\n</think>\n\nParis.<|im_end|>" in preserved


def test_tool_calls_render_as_xml(tok):
    text = tok.render(CONVERSATIONS["tool_round_trip"], tools=[WEATHER_TOOL])
    assert text.startswith("<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n")
    assert json.dumps(WEATHER_TOOL, ensure_ascii=False) in text
    assert "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n" in text
    assert '<parameter=opts>\n{"unit": "°C"}\n</parameter>' in text
    merged = '<|im_start|>user\n<tool_response>\n{"temp": 18}\n</tool_response>\n<tool_response>\n{"temp": 4}\n'
    assert merged in text


ENVIRONMENT_TEMPLATE = (
    "{% set ns = namespace(n=0) %}{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}"
    "{% set ns.n = ns.n + 1 %}{% generation %}{{ m | tojson }}{% endgeneration %}\n{% endfor %}"
    "{{ ns.n }} {{ dict(a=1) | tojson(indent=2) }} {{ strftime_now('%Y') }} {{ eos_token }} {{ extra_flag }}"
)


def test_environment_matches_transformers(model_dir, hf):
    backend = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    messages = [{"role": "user", "content": "é <b>&"}, {"role": "assistant", "content": None}, {"role": "user"}]
    for template in (ENVIRONMENT_TEMPLATE, "{{ messages[0]._secret }}"):
        engine = ChatTokenizer(backend, {"eos_token": "<|im_end|>"}, template)
        ours = engine.render(messages, extra_flag=True, add_generation_prompt=False)
        assert ours == hf.apply_chat_template(messages, chat_template=template, tokenize=False, extra_flag=True)
    with pytest.raises(ConfigError, match="underscore|_x"):
        ChatTokenizer(backend, {}, "{% set ns = namespace() %}{% set ns._x = 1 %}").render([])


def test_template_exceptions_become_config_errors(tok):
    with pytest.raises(ConfigError, match="System message must be at the beginning"):
        tok.render([{"role": "user", "content": "a"}, {"role": "system", "content": "b"}])
    with pytest.raises(ConfigError, match="No user query found"):
        tok.render([{"role": "assistant", "content": "a"}])


def test_custom_template_errors(model_dir, tmp_path):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((model_dir / name).read_bytes())
    (tmp_path / "chat_template.jinja").write_text("{{ raise_exception('custom refusal') }}")
    with pytest.raises(ConfigError, match="custom refusal"):
        ChatTokenizer.from_dir(tmp_path).render([{"role": "user", "content": "x"}])
    (tmp_path / "chat_template.jinja").write_text("{% if %}")
    with pytest.raises(ConfigError, match="does not compile"):
        ChatTokenizer.from_dir(tmp_path)


def test_template_falls_back_to_tokenizer_config_then_fails(model_dir, tmp_path):
    (tmp_path / "tokenizer.json").write_bytes((model_dir / "tokenizer.json").read_bytes())
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": "[{{ messages|length }}]"}))
    assert ChatTokenizer.from_dir(tmp_path).render([{"role": "user", "content": "x"}]) == "[1]"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="no chat template"):
        ChatTokenizer.from_dir(tmp_path)


def test_missing_or_broken_tokenizer_json_is_a_checkpoint_error(tmp_path):
    with pytest.raises(CheckpointError, match="tokenizer.json is missing"):
        ChatTokenizer.from_dir(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not a valid tokenizers file"):
        ChatTokenizer.from_dir(tmp_path)


def test_config_and_tokenizer_json_must_agree(model_dir, tmp_path):
    for name in ("tokenizer.json", "chat_template.jinja"):
        (tmp_path / name).write_bytes((model_dir / name).read_bytes())
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    config["added_tokens_decoder"]["999"] = config["added_tokens_decoder"].pop("624")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="different checkpoints"):
        ChatTokenizer.from_dir(tmp_path)


# --- encode / decode -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", TEXTS)
def test_encode_decode_roundtrip(tok, text):
    assert tok.decode(tok.encode(text)) == unicodedata.normalize("NFC", text)


@pytest.mark.parametrize("text", TEXTS)
def test_encode_matches_transformers(tok, hf, text):
    assert tok.encode(text) == hf(text, add_special_tokens=False)["input_ids"]


def test_special_tokens_are_single_ids(tok):
    for i, (content, _special) in enumerate(ADDED_TOKENS):
        assert tok.encode(content) == [600 + i] and tok.token_id(content) == 600 + i
    assert (tok.endoftext_id, tok.im_start_id, tok.im_end_id) == (600, 601, 602)
    assert (tok.think_start_id, tok.think_end_id) == (624, 625)
    assert tok.eos_token_ids == (602, 600) and tok.pad_token_id == 600 and tok.vocab_size == 626
    assert tok.encode("x<|im_end|>y")[1] == 602
    assert tok.token_id("<|not_a_token|>") is None


def test_decode_skips_only_special_tokens(tok):
    ids = tok.encode("<|im_start|>assistant\n<think>\nhm\n</think>\n\nok<|im_end|>")
    assert tok.decode(ids, skip_special_tokens=True) == "assistant\n<think>\nhm\n</think>\n\nok"


# --- StreamDecoder ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", TEXTS)
def test_stream_decoder_equals_full_decode(tok, text):
    ids = tok.encode(text)
    if "😀" in text:  # the test only means something if some token ends inside a character
        assert any(_is_partial_utf8(tok.token_bytes(i)) for i in ids)
    stream = StreamDecoder(tok)
    pieces = [stream.push(i) for i in ids]
    assert not any("\ufffd" in p for p in pieces)
    assert "".join(pieces) + stream.flush() == tok.decode(ids)


def test_stream_decoder_replaces_broken_bytes_like_decode(tok):
    by_bytes = {tok.token_bytes(i): i for i in range(tok.vocab_size)}
    lead, cont, a = by_bytes[b"\xe4"], by_bytes[b"\xa0"], by_bytes[b"a"]  # a UTF-8 lead byte, a continuation byte
    for ids in ([lead, a], [cont, cont], [a, lead], [lead, cont, a]):
        stream = StreamDecoder(tok)
        assert "".join(stream.push(i) for i in ids) + stream.flush() == tok.decode(ids)


def test_stream_decoder_can_skip_special_tokens(tok):
    ids = tok.encode("<|im_start|>hi<|im_end|>")
    stream = StreamDecoder(tok, skip_special_tokens=True)
    assert "".join(stream.push(i) for i in ids) + stream.flush() == "hi"


def _is_partial_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


# --- ThinkSplitter ---------------------------------------------------------------------------------------------------

SPLIT_CASES = [
    (
        False,
        "<think>\nStep 1.\n\nStep 2 < 3\n</think>\n\nThe answer: a <b>bold</b> </think> claim.\n",
        [("reasoning", "Step 1.\n\nStep 2 < 3"), ("answer", "The answer: a <b>bold</b> </think> claim.\n")],
    ),
    (True, "Let me see.\n\n</think>\n\nDone.", [("reasoning", "Let me see.\n"), ("answer", "Done.")]),
    (True, "\n</think>\n\n\nAnswer", [("answer", "\nAnswer")]),
    (True, "still thinking <thin", [("reasoning", "still thinking <thin")]),
    (False, "plain answer\n\n", [("answer", "plain answer\n\n")]),
    (False, "pre <think>x</think>post", [("answer", "pre "), ("reasoning", "x"), ("answer", "post")]),
]


def _split(in_thinking: bool, chunks: list[str]) -> list[tuple[str, str]]:
    splitter = ThinkSplitter(in_thinking)
    pieces = [p for chunk in chunks for p in splitter.push(chunk)] + splitter.flush()
    merged: list[tuple[str, str]] = []
    for kind, text in pieces:
        assert text, "no empty pieces"
        if merged and merged[-1][0] == kind:
            merged[-1] = (kind, merged[-1][1] + text)
        else:
            merged.append((kind, text))
    return merged


@pytest.mark.parametrize(("in_thinking", "text", "expected"), SPLIT_CASES)
def test_think_splitter_whole_text(in_thinking, text, expected):
    assert _split(in_thinking, [text]) == expected


@pytest.mark.parametrize(("in_thinking", "text", "expected"), SPLIT_CASES)
def test_think_splitter_every_split_point(in_thinking, text, expected):
    assert _split(in_thinking, list(text)) == expected
    for i in range(len(text) + 1):
        for j in range(i, len(text) + 1, 3):
            assert _split(in_thinking, [text[:i], text[i:j], text[j:]]) == expected, (i, j)


def test_think_splitter_holds_back_only_possible_tags():
    splitter = ThinkSplitter(True)
    assert splitter.push("a\n</thi") == [("reasoning", "a")]
    assert splitter.push("nk>\n") == []
    assert splitter.push("\nB <") == [("answer", "B ")]
    assert splitter.push("x") == [("answer", "<x")]
