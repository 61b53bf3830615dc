"""/v1/completions: a raw prompt continued by the engine, with no chat template and no thinking split.

The Engine API has only `chat` (templated); a raw continuation needs the runner directly. This adapter reads
the engine's public-ish attributes (tokenizer, runner, eos_ids, sampling_defaults, max_context) and its
generation loop, and does not edit the engine. It runs only on the engine thread (worker.py), which is the
engine's sole caller, so it needs no lock of its own. Like `Engine.chat`, bad input raises before any work and
the returned iterator yields the same event types.
"""
from __future__ import annotations

import threading
from typing import Any, Iterator, Mapping, Sequence

from qwenlocal.engine.errors import ContextLimitError, OptionError, QwenlocalError
from qwenlocal.engine.events import EngineError, Event, TokenDelta, TurnDone


def raw_completion(engine: Any, prompt: str | Sequence[int], sampling: Mapping[str, Any] | None,
                   cancel: threading.Event | None = None) -> Iterator[Event]:
    params = engine.sampling_defaults.updated(dict(sampling or {}))
    ids = engine.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
    if not ids:
        raise OptionError("the prompt encodes to no tokens")
    limit = engine.tokenizer.vocab_size
    if not isinstance(prompt, str) and any(not 0 <= t < limit for t in ids):
        raise OptionError(f"prompt token ids must be in [0, {limit})")
    if len(ids) + 1 > engine.max_context:
        raise ContextLimitError(f"the prompt is {len(ids)} tokens and the context limit is {engine.max_context}")
    return _stream(engine, ids, params, cancel)


def _stream(engine: Any, ids: list[int], params: Any, cancel: threading.Event | None) -> Iterator[Event]:
    from qwenlocal.engine.runtime.generate import GenerationStats, generate_tokens  # torch: engine thread only
    from qwenlocal.engine.tokenizer import StreamDecoder

    stats = GenerationStats()
    decoder = StreamDecoder(engine.tokenizer, skip_special_tokens=True)
    text: list[str] = []
    try:
        state = engine.runner.new_state()
        for token in generate_tokens(engine.runner, state, ids, params, engine.eos_ids, stats, cancel,
                                     vocab_limit=engine.tokenizer.vocab_size):
            if token in engine.eos_ids:
                continue
            piece = decoder.push(token)
            if piece:
                text.append(piece)
                yield TokenDelta(piece)
        tail = decoder.flush()
        if tail:
            text.append(tail)
            yield TokenDelta(tail)
    except QwenlocalError as exc:
        yield EngineError(str(exc), type(exc).__name__)
        return
    except Exception as exc:  # a bug or a device fault: an event, not a dead stream (as Engine.chat does)
        yield EngineError(f"generation failed: {exc!r}", type(exc).__name__)
        return
    yield TurnDone(stats.finish_reason, stats.prompt_tokens, stats.completion_tokens, "".join(text), "",
                   stats.as_dict())
