"""The think splitter by token id (engine/think_split.py): with tokenizers whose <think>/</think> are special
(as transformers-made ones can be) and plain added tokens (Qwen's), and the text fallback without them."""
from __future__ import annotations

import pytest

from qwenlocal.engine import tokenizer_train
from qwenlocal.engine.think_split import ThinkTokenSplitter, _TextSplit, reply_splitter
from qwenlocal.engine.tokenizer import ChatTokenizer, StreamDecoder

USER = [{"role": "user", "content": "hi"}]


def _make(tmp_path_factory, name, added):
    path = tmp_path_factory.mktemp(name)
    mp = pytest.MonkeyPatch()
    mp.setattr(tokenizer_train, "ADDED_TOKENS", added)
    try:
        tokenizer_train.write_tokenizer_files(path, tokenizer_train.train_tokenizer(tokenizer_train.default_corpus(),
                                                                                   400))
    finally:
        mp.undo()
    return ChatTokenizer.from_dir(path)


@pytest.fixture(scope="module", params=["special", "plain"])
def tok(request, tmp_path_factory):
    special = request.param == "special"
    added = tuple((c, special if c in ("<think>", "</think>") else s) for c, s in tokenizer_train.ADDED_TOKENS)
    t = _make(tmp_path_factory, request.param, added)
    assert t.is_special(t.think_start_id) == special and t.is_special(t.think_end_id) == special
    return t


@pytest.fixture(scope="module")
def tok_without_tags(tmp_path_factory):
    added = tuple((c, s) for c, s in tokenizer_train.ADDED_TOKENS if c not in ("<think>", "</think>"))
    return _make(tmp_path_factory, "notags", added)


def split(splitter, ids) -> list[tuple[str, str]]:
    pieces = [p for i in ids for p in splitter.push(i)] + splitter.flush()
    merged: list[tuple[str, str]] = []
    for kind, text in pieces:
        assert text, "no empty pieces"
        if merged and merged[-1][0] == kind:
            merged[-1] = (kind, merged[-1][1] + text)
        else:
            merged.append((kind, text))
    return merged


def prompt(tok, thinking: bool) -> str:
    return tok.render(USER, add_generation_prompt=True, enable_thinking=thinking)


def test_the_template_opens_the_segment_only_with_thinking_on(tok):
    assert prompt(tok, True).endswith("<think>\n") and not prompt(tok, False).rstrip("\n").endswith("<think>")


def test_reasoning_ends_at_the_close_token_even_when_it_is_special(tok):
    ids = tok.encode("Step 1.\n\nStep 2 < 3\n</think>\n\nThe answer.")
    assert tok.think_end_id in ids
    if tok.is_special(tok.think_end_id):  # what the text splitter saw: the tag gone, nothing separated
        assert "</think>" not in tok.decode(ids, skip_special_tokens=True)
    splitter = reply_splitter(tok, prompt(tok, True), thinking=True)
    assert isinstance(splitter, ThinkTokenSplitter)
    assert split(splitter, ids) == [("reasoning", "Step 1.\n\nStep 2 < 3"), ("answer", "The answer.")]


def test_with_thinking_off_a_think_token_mid_answer_stays_answer_text(tok):
    ids = tok.encode("pre <think>x</think>post")
    assert tok.think_start_id in ids and tok.think_end_id in ids
    splitter = reply_splitter(tok, prompt(tok, False), thinking=False)
    assert split(splitter, ids) == [("answer", "pre <think>x</think>post")]


def test_after_the_segment_closes_the_tags_are_answer_text(tok):
    ids = tok.encode("hm</think>\n\nUse <think> and </think> tags.")
    splitter = reply_splitter(tok, prompt(tok, True), thinking=True)
    assert split(splitter, ids) == [("reasoning", "hm"), ("answer", "Use <think> and </think> tags.")]


def test_tag_text_spelled_with_ordinary_tokens_is_not_a_tag(tok):
    # "</think>" written by the model as ordinary tokens (not the added token): reasoning text, not the end.
    spelled = tok.encode("</") + tok.encode("think") + tok.encode(">")
    assert tok.think_end_id not in spelled
    ids = tok.encode("the tag ") + spelled + tok.encode(" ends it\n") + [tok.think_end_id] + tok.encode("\n\nok")
    splitter = reply_splitter(tok, prompt(tok, True), thinking=True)
    assert split(splitter, ids) == [("reasoning", "the tag </think> ends it"), ("answer", "ok")]


def test_a_model_may_open_the_segment_with_its_first_token_when_the_template_did_not(tok):
    ids = [tok.think_start_id] + tok.encode("\nplan\n") + [tok.think_end_id] + tok.encode("\n\nanswer <think>")
    splitter = reply_splitter(tok, "<|im_start|>assistant\n", thinking=True)
    assert split(splitter, ids) == [("reasoning", "plan"), ("answer", "answer <think>")]
    later = tok.encode("answer first ") + [tok.think_start_id] + tok.encode("x")
    assert split(reply_splitter(tok, "<|im_start|>assistant\n", thinking=True), later) == [
        ("answer", "answer first <think>x")]


def test_a_reply_that_ends_inside_its_thinking_keeps_all_of_it(tok):
    ids = tok.encode("still thinking\n\n")
    splitter = reply_splitter(tok, prompt(tok, True), thinking=True)
    assert split(splitter, ids) == [("reasoning", "still thinking\n\n")]


def test_other_special_tokens_are_still_skipped(tok):
    ids = tok.encode("a</think>b<|im_end|>")
    splitter = reply_splitter(tok, prompt(tok, True), thinking=True)
    assert split(splitter, ids) == [("reasoning", "a"), ("answer", "b")]


def test_the_newlines_the_template_puts_around_the_close_tag_are_dropped(tok):
    text = "Let me see.\n\n</think>\n\n\nDone <think>."
    ids = tok.encode(text)
    whole = split(reply_splitter(tok, prompt(tok, True), thinking=True), ids)
    assert whole == [("reasoning", "Let me see.\n"), ("answer", "\nDone <think>.")]


def test_stream_decoder_keeps_the_tags_it_is_told_to(tok):
    ids = tok.encode("<think>x</think>")
    keep = {tok.think_start_id, tok.think_end_id}
    stream = StreamDecoder(tok, skip_special_tokens=True, keep=keep)
    assert "".join(stream.push(i) for i in ids) + stream.flush() == "<think>x</think>"


def test_without_tag_tokens_the_text_splitter_is_used(tok_without_tags):
    tok = tok_without_tags
    assert tok.added_token_id("<think>") is None
    on = reply_splitter(tok, "<|im_start|>assistant\n<think>\n", thinking=True)
    assert isinstance(on, _TextSplit)
    assert split(on, tok.encode("why\n</think>\n\nbecause")) == [("reasoning", "why"), ("answer", "because")]
    off = reply_splitter(tok, "<|im_start|>assistant\n", thinking=False)
    assert split(off, tok.encode("pre <think>x</think>post")) == [("answer", "pre <think>x</think>post")]
