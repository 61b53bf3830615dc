"""Tokenizer and chat template of a Qwen3.5/3.6 checkpoint, plus the two streaming helpers the chat loop needs.

The byte-level BPE is run by the `tokenizers` library straight from `tokenizer.json`. The chat template is rendered in
a jinja environment built the way transformers' `apply_chat_template` builds it (utils/chat_template_utils.py), so
prompts are byte-identical to the reference without importing transformers. No torch import here.
"""
from __future__ import annotations

import codecs
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox
import jinja2.utils
from tokenizers import Tokenizer

from .errors import CheckpointError, ConfigError

IM_START, IM_END, ENDOFTEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
THINK_START, THINK_END = "<think>", "</think>"
_SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token")
Messages = Sequence[Mapping[str, Any]]


def _byte_decoder() -> dict[str, int]:
    """The inverse of GPT-2's bytes_to_unicode: byte-level BPE spells each byte as one printable character."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    spelled = {b: b for b in printable}
    for b in range(256):
        if b not in spelled:
            spelled[b] = 256 + len(spelled) - len(printable)
    return {chr(char): b for b, char in spelled.items()}


_BYTE_OF = _byte_decoder()


class _GenerationTag(jinja2.ext.Extension):
    """transformers accepts `{% generation %}...{% endgeneration %}` (it marks assistant tokens for training
    masks); the rendered text is unchanged by it, so parsing it is all that is needed here."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller) -> str:
        return caller()


def _check_namespace_name(name: Any) -> None:
    if isinstance(name, str) and name.startswith("_"):  # underscore attributes would reach CPython internals
        raise jinja2.exceptions.SecurityError(f"chat templates cannot set namespace attribute {name!r}")


class _TemplateNamespace(jinja2.utils.Namespace):
    """transformers' namespace: the same, but refusing underscore names."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - jinja's Namespace signature, so `self=` works
        attrs = dict(*args[1:], **kwargs)
        for name in attrs:
            _check_namespace_name(name)
        jinja2.utils.Namespace.__init__(args[0], attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _check_namespace_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)


class _TemplateDict:
    """transformers' `dict` global: builds dicts without handing templates the dict type itself."""

    __call__ = staticmethod(dict)
    fromkeys = staticmethod(dict.fromkeys)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False):
    # jinja's own tojson HTML-escapes and sorts keys; chat templates expect plain json.dumps.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def compile_chat_template(source: str) -> jinja2.Template:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals.update(
        raise_exception=_raise_exception,
        strftime_now=lambda fmt: datetime.now().strftime(fmt),
        dict=_TemplateDict(),
        namespace=_TemplateNamespace,
    )
    try:
        return env.from_string(source)
    except jinja2.TemplateError as e:
        raise ConfigError(f"The chat template does not compile: {e}. Replace chat_template.jinja.") from e


def _plain(value: Any) -> Any:
    """Rebuild template inputs from plain JSON types, as transformers does; unknown objects become '<Type>'."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    for base, to_base in ((str, str.__str__), (int, int.__int__), (float, float.__float__)):
        if isinstance(value, base):  # a subclass (an enum, say) could carry methods the sandbox does not vet
            return to_base(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return (tuple if isinstance(value, tuple) else list)(_plain(v) for v in value)
    return f"<{type(value).__name__}>"


def _template_messages(messages: Messages) -> list[dict]:
    """transformers drops None-valued keys and copies reasoning under all three names templates read."""
    chat = []
    for message in messages:
        message = {k: _plain(v) for k, v in message.items() if v is not None}
        reasoning = next((message[k] for k in ("reasoning_content", "thinking", "reasoning") if k in message), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        chat.append(message)
    return chat


def _token_content(value: Any) -> str | None:
    """tokenizer_config stores special tokens as a string or as a serialized AddedToken dict."""
    return value.get("content") if isinstance(value, Mapping) else value


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path} cannot be read as JSON ({e}). Re-download the checkpoint.") from e


def _find_template(model_dir: Path, config: Mapping[str, Any]) -> str:
    jinja_file = model_dir / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):  # the multi-template form: [{"name": ..., "template": ...}]
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    if isinstance(template, str):
        return template
    raise CheckpointError(
        f"The checkpoint at {model_dir} has no chat template (no chat_template.jinja, no 'chat_template' in "
        "tokenizer_config.json). Use the instruct checkpoint, or copy its chat_template.jinja into the folder."
    )


class ChatTokenizer:
    """Encodes/decodes text and renders conversations with the checkpoint's chat template."""

    def __init__(self, tokenizer: Tokenizer, config: Mapping[str, Any], chat_template: str) -> None:
        self._tok = tokenizer
        self._template = compile_chat_template(chat_template)
        self._special_strings = {k: _token_content(config[k]) for k in _SPECIAL_TOKEN_KEYS if config.get(k)}
        self._check_added_tokens(config.get("added_tokens_decoder") or {})
        added = tokenizer.get_added_tokens_decoder()
        self._added_ids = frozenset(added)
        self._special_ids = frozenset(i for i, t in added.items() if t.special)

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> ChatTokenizer:
        model_dir = Path(model_dir)
        tok_file = model_dir / "tokenizer.json"
        if not tok_file.is_file():
            raise CheckpointError(
                f"{tok_file} is missing, so the model's text cannot be tokenized. Download the full checkpoint "
                "(tokenizer.json, tokenizer_config.json, chat_template.jinja) into that folder."
            )
        try:
            tokenizer = Tokenizer.from_file(str(tok_file))
        except Exception as e:  # the Rust loader raises a bare Exception on malformed files
            raise CheckpointError(f"{tok_file} is not a valid tokenizers file ({e}). Re-download it.") from e
        config_file = model_dir / "tokenizer_config.json"
        config = _read_json(config_file) if config_file.is_file() else {}
        return cls(tokenizer, config, _find_template(model_dir, config))

    def _check_added_tokens(self, declared: Mapping[str, Any]) -> None:
        """tokenizer_config's added_tokens_decoder must agree with tokenizer.json; a wrong id would silently
        feed the model the wrong embedding row."""
        for id_str, entry in declared.items():
            content = _token_content(entry)
            if self._tok.token_to_id(content) != int(id_str):
                raise CheckpointError(
                    f"tokenizer_config.json gives {content!r} id {id_str} but tokenizer.json gives "
                    f"{self._tok.token_to_id(content)}. The two files come from different checkpoints; re-download."
                )

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (a token may hold part of a UTF-8 character)."""
        token = self._tok.id_to_token(token_id)
        if token is None:
            raise ValueError(f"token id {token_id} is outside the vocabulary ({self.vocab_size})")
        if token_id in self._added_ids:
            return token.encode("utf-8")
        return bytes(_BYTE_OF[ch] for ch in token)

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_ids

    def added_token_id(self, content: str) -> int | None:
        """The id of `content` when it is one of the tokenizer's own added tokens (special or not), else None."""
        token_id = self._tok.token_to_id(content)
        return token_id if token_id in self._added_ids else None

    # Ids of the tokens the chat loop looks for; None where the vocabulary lacks one.
    im_start_id = property(lambda self: self.token_id(IM_START))
    im_end_id = property(lambda self: self.token_id(IM_END))
    endoftext_id = property(lambda self: self.token_id(ENDOFTEXT))
    think_start_id = property(lambda self: self.token_id(THINK_START))
    think_end_id = property(lambda self: self.token_id(THINK_END))

    @property
    def pad_token_id(self) -> int | None:
        pad = self._special_strings.get("pad_token")
        return self.token_id(pad) if pad else None

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        candidates = (self.token_id(t) for t in (self._special_strings.get("eos_token"), IM_END, ENDOFTEXT) if t)
        return tuple(dict.fromkeys(i for i in candidates if i is not None))

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def render(
        self,
        messages: Messages,
        *,
        add_generation_prompt: bool = True,
        enable_thinking: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **extra: Any,
    ) -> str:
        """The prompt text, equal to transformers' apply_chat_template(..., tokenize=False)."""
        # Same inputs as transformers: special-token strings, then the caller's kwargs, all as plain JSON data.
        kwargs = {**self._special_strings, **_plain({"enable_thinking": enable_thinking, **extra})}
        tools = _plain(list(tools)) if tools is not None else None
        try:
            return self._template.render(
                messages=_template_messages(messages),
                tools=tools,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **kwargs,
            )
        except jinja2.TemplateError as e:
            raise ConfigError(f"The chat template refused this conversation: {e}") from e

    def encode_chat(
        self, messages: Messages, *, enable_thinking: bool = True, add_generation_prompt: bool = True
    ) -> list[int]:
        prompt = self.render(messages, enable_thinking=enable_thinking, add_generation_prompt=add_generation_prompt)
        return self.encode(prompt)


class StreamDecoder:
    """Turns sampled token ids into text as they arrive, never splitting a UTF-8 character.

    Works on bytes: each token's bytes go through an incremental UTF-8 decoder, which keeps an unfinished
    character until its last byte comes and replaces invalid sequences the way a full decode does.
    """

    def __init__(self, tokenizer: ChatTokenizer, *, skip_special_tokens: bool = False,
                 keep: frozenset[int] | set[int] = frozenset()) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._keep = frozenset(keep)  # special tokens decoded as text all the same (the think tags)
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        if self._skip_special and token_id not in self._keep and self._tokenizer.is_special(token_id):
            return ""
        return self._utf8.decode(self._tokenizer.token_bytes(token_id))

    def flush(self) -> str:
        """Whatever an unfinished character left behind (as U+FFFD); the decoder is then ready for reuse."""
        return self._utf8.decode(b"", final=True)


class ThinkSplitter:
    """Splits streamed model text into ("reasoning" | "answer", text) pieces at <think> / </think>.

    The tags themselves are dropped, and so are the newlines the template puts around them
    (`<think>\\n` reasoning `\\n</think>\\n\\n` answer). Text that could be the start of a tag, or of a
    newline that belongs to one, is held back until the next push decides it.
    """

    _OPEN, _CLOSE = THINK_START, THINK_END

    def __init__(self, in_thinking: bool, opens: bool = True) -> None:
        """`opens`: whether a <think> in the answer opens a reasoning segment (False: it is answer text)."""
        self._reasoning = in_thinking
        self._opens = opens
        self._buf = ""
        self._separator = 0  # newlines still to drop right after a tag

    def push(self, text: str) -> list[tuple[str, str]]:
        self._buf += text
        out: list[tuple[str, str]] = []
        while self._drop_separator() and (self._reasoning or self._opens):
            tag = self._CLOSE if self._reasoning else self._OPEN
            at = self._buf.find(tag)
            if at < 0:
                break
            before = self._buf[:at]
            if self._reasoning and before.endswith("\n"):
                before = before[:-1]
            self._emit(out, before)
            self._buf = self._buf[at + len(tag) :]
            self._reasoning = not self._reasoning
            self._separator = 1 if self._reasoning else 2
        keep = self._held_back()
        self._emit(out, self._buf[: len(self._buf) - keep])
        self._buf = self._buf[len(self._buf) - keep :]
        return out

    def flush(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        self._emit(out, self._buf)
        self._buf, self._separator = "", 0
        return out

    def _drop_separator(self) -> bool:
        """Eat the newlines owed after a tag; False while the buffer ran out before we know they are done."""
        while self._separator and self._buf:
            if self._buf[0] != "\n":
                self._separator = 0
                break
            self._buf = self._buf[1:]
            self._separator -= 1
        return not (self._separator and not self._buf)

    def _held_back(self) -> int:
        """Length of the longest buffer suffix that may still grow into the tag we are watching for."""
        tails = ("\n" + self._CLOSE, self._CLOSE) if self._reasoning else (self._OPEN,) if self._opens else ()
        if not tails:
            return 0
        for n in range(min(len(self._buf), max(map(len, tails)) - 1), 0, -1):
            if any(t.startswith(self._buf[-n:]) for t in tails):
                return n
        return 0

    def _emit(self, out: list[tuple[str, str]], text: str) -> None:
        kind = "reasoning" if self._reasoning else "answer"
        if text and out and out[-1][0] == kind:
            out[-1] = (kind, out[-1][1] + text)
        elif text:
            out.append((kind, text))
