"""The chat app's plain parts: conversation data, the store, status formatting, command parsing, CLI, imports."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from qwenlocal.app.chat.backend import explain_load_error
from qwenlocal.app.chat.commands import SlashError, parse_slash
from qwenlocal.app.chat.conversation import Conversation, ConversationFormatError
from qwenlocal.app.chat.settings import parse_assignments
from qwenlocal.app.chat.status import format_status, hit_rate
from qwenlocal.app.chat.store import ConversationStore, export_transcript
from qwenlocal.app.cli import build_parser
from qwenlocal.app.commands.chat import load_keymap
from qwenlocal.engine.errors import CheckpointError, OptionError, ResourceError


def sample_conv() -> Conversation:
    conv = Conversation(system="Be brief.", model="demo")
    conv.add("user", "What is 2+2?")
    conv.add("assistant", "4", reasoning="Add them.", finish_reason="stop")
    conv.add("user", "And 3+3?")
    conv.add("assistant", "partial", finish_reason="error")
    return conv


def test_engine_messages_skip_failed_replies_and_put_the_system_first():
    assert sample_conv().engine_messages() == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3?"}]


def test_round_trip_and_markdown(tmp_path):
    conv = sample_conv()
    store = ConversationStore(tmp_path)
    store.save(conv)
    assert store.load(conv.id) == conv  # vs the object that was saved
    md = conv.to_markdown()
    assert md.startswith("# What is 2+2?") and "## System\n\nBe brief." in md and "> Add them." in md
    assert "*(error)*" in md
    base = tmp_path / "out" / "t.md"  # a given .md suffix names the pair
    assert export_transcript(conv, base) == (tmp_path / "out" / "t.md", tmp_path / "out" / "t.json")


def test_store_lists_newest_first_and_skips_corrupt_files(tmp_path):
    store = ConversationStore(tmp_path)
    old, new = sample_conv(), sample_conv()
    old.updated, new.updated = 100.0, 200.0
    store.save(old)
    store.save(new)
    (tmp_path / "bad-json.json").write_text("{")
    (tmp_path / "wrong.json").write_text(json.dumps({"format": 99}))
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe\x00")
    (tmp_path / "bad-role.json").write_text(json.dumps({**old.to_json(), "id": "x",
                                                        "messages": [{"role": "robot", "content": "hi"}]}))
    convs, skipped = store.list()
    assert [c.id for c in convs] == [new.id, old.id]
    assert sorted(s.path.name for s in skipped) == ["bad-json.json", "bad-role.json", "binary.json", "wrong.json"]


def test_a_failed_write_leaves_the_old_file_and_no_temp(tmp_path, monkeypatch):
    store = ConversationStore(tmp_path)
    conv = sample_conv()
    store.save(conv)
    before = store.path_for(conv.id).read_text()
    conv.add("user", "more")

    def boom(*args):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        store.save(conv)
    assert store.path_for(conv.id).read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == [f"{conv.id}.json"]


def test_from_json_rejects_other_formats():
    with pytest.raises(ConversationFormatError):
        Conversation.from_json({"format": 1, "id": "x"})


def test_status_line_fits_the_width_and_reads_counters_tolerantly():
    values = {"decode_tok_s": 41.26, "ttft_s": 1.5, "prompt_tokens": 100, "completion_tokens": 20,
              "context_limit": 262144, "hits": 87, "misses": 13, "h2d_gbps": 12.04,
              "vram_allocated": 9.5 * 2**30}
    wide = format_status(values, "ready", True, 200)
    assert wide == ("ready │ think on │ 41.3 tok/s │ TTFT 1.50 s │ ctx 120/262144 │ hit 87% │ PCIe 12.0 GB/s │ "
                    "VRAM 9.5 GiB")
    narrow = format_status(values, "generating", False, 60)
    assert len(narrow) <= 58 and narrow.startswith("generating │ think off │ 41.3 tok/s")
    assert format_status({}, "loading", True, 80) == "loading │ think on"
    assert hit_rate({"expert_hit_rate": 0.5}) == 0.5 and hit_rate({"hits": 0, "misses": 0}) is None


def test_slash_parsing():
    cmd, arg = parse_slash("/set temperature=0.7")
    assert (cmd.action, arg) == ("sampling", "temperature=0.7")
    assert parse_slash("/regenerate")[0].name == "regen"  # alias
    assert parse_slash("hello") is None and parse_slash("//not a command") is None
    with pytest.raises(SlashError, match="unknown command /nope"):
        parse_slash("/nope")


def test_sampling_assignments():
    assert parse_assignments("temp=0 top-p=0.9 topk=20 max=5 seed=default") == {
        "temperature": 0.0, "top_p": 0.9, "top_k": 20, "max_tokens": 5, "seed": None}
    for bad, why in [("temperature", "key=value"), ("colour=red", "unknown setting"), ("top_k=1.5", "whole"),
                     ("max_tokens=0", ">= 1"), ("temperature=-1", ">= 0")]:
        with pytest.raises(ValueError, match=why):
            parse_assignments(bad)


def test_load_errors_say_what_to_do():
    title, message, hint = explain_load_error(CheckpointError("no config.json in /x"))
    assert message == "no config.json in /x" and "--model" in hint
    assert explain_load_error(ResourceError("need 20 GiB"))[0] == "Not enough memory"
    assert "QWENLOCAL_DEBUG=1" in explain_load_error(RuntimeError("boom"))[2]


def test_cli_flags_and_keymap(tmp_path):
    args = build_parser().parse_args(["chat", "--model", "m", "--no-think", "--temperature", "0.2", "--theme",
                                      "light"])
    assert (args.model, args.no_think, args.temperature, args.theme) == ("m", True, 0.2, "light")
    keymap = tmp_path / "keys.json"
    keymap.write_text(json.dumps({"chat.new": "f9"}))
    assert load_keymap(keymap) == {"chat.new": "f9"}
    keymap.write_text("[1]")
    with pytest.raises(OptionError, match="chat.new"):
        load_keymap(keymap)
    with pytest.raises(OptionError, match="no such file"):
        load_keymap(tmp_path / "missing.json")


def test_the_chat_app_does_not_import_torch():
    code = ("import sys; import qwenlocal.app.cli, qwenlocal.app.commands.chat, qwenlocal.app.chat.app, "
            "qwenlocal.app.chat.fake; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_keymap_refuses_unknown_ids_and_keys(tmp_path):
    keymap = tmp_path / "keys.json"
    for entry, expected in (({"chat.new": "ctrl+zz"}, "'zz' is not a key name"),
                            ({"chat.nwe": "f9"}, "did you mean 'chat.new'"),
                            ({"chat.new": "cntrl+n"}, "'cntrl' is not a modifier"),
                            ({"chat.new": "f9,"}, "empty key"), ({"prompt.send": ""}, "no key given")):
        keymap.write_text(json.dumps(entry))
        with pytest.raises(OptionError, match=re.escape(expected)):
            load_keymap(keymap)
    good = {"chat.new": "ctrl+w,f9", "prompt.send": "ctrl+s", "help.close": "question_mark", "chat.stop": "ctrl+shift+k"}
    keymap.write_text(json.dumps(good))
    assert load_keymap(keymap) == good


def test_help_lists_enter_once_and_chat_help_names_the_model_forms():
    from qwenlocal.app.chat.panels import help_markdown

    text = help_markdown([("enter", "Send the prompt", "prompt.send"), ("ctrl+n", "Start a new conversation", "chat.new")])
    assert text.count("`enter`") == 1
    model_help = next(a.help for a in build_parser()._subparsers._group_actions[0].choices["chat"]._actions
                      if "--model" in a.option_strings)
    assert "hub id" in model_help and "--endpoint" in model_help and not model_help.startswith("checkpoint folder (")
