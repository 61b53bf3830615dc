"""Soak part A: chat turns through the chat app's backend layer (EngineBackend, Conversation, fit_to_context,
ConversationStore), the way app/chat/app.py and actions.py drive them, on the built-in demo model on the CPU.

Each turn is one seeded action: a new message, a long message (the conversation outgrows the context and the
oldest turns are left out of what is sent), regenerate, edit-and-rerun, cancel mid-reply, a message too long for
the context by itself (refused), or a new chat. Sampling is seeded per turn, so every reply is checked against a replay of
the exact prompt that was sent on a second engine with fresh state (no session, no snapshots): a reply from the
wrong request, or a snapshot restored wrongly by regenerate/edit, differs. Every turn's conversation is saved and
read back, and at the end every saved conversation must equal the one in memory.
"""
from __future__ import annotations

import os
import random
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from soak_rss import PythonHeap, RssSampler, latency, now

ACTIONS = (("new", 38), ("long", 16), ("regen", 14), ("edit", 14), ("cancel", 12), ("huge", 3), ("newchat", 3))
WORDS = ("apple river stone cloud engine violet harbor seven orbit lantern copper meadow signal pepper quartz "
         "falcon winter ember tundra cedar").split()
CANCEL_AFTER = 2  # token deltas: the cancel lands mid-reply


@dataclass
class ChatFigures:
    turns: int = 0
    actions: dict = field(default_factory=dict)
    replies_ok: int = 0
    cancels_ok: int = 0
    cancel_early: int = 0  # cancel turns whose reply ended by itself (EOS) before the cancel was due
    refused_ok: int = 0
    trimmed_turns: int = 0  # turns whose sent history left the oldest turns out (context overflow)
    lost: list = field(default_factory=list)  # (turn, what): no TurnDone, or an engine error
    mismatched: list = field(default_factory=list)  # (turn, action): the reply differs from its replay
    store_bad: list = field(default_factory=list)  # (turn or "end", what)
    conversations: int = 0
    latencies: list = field(default_factory=list)
    texts: set = field(default_factory=set)  # distinct replies: the replay check can tell requests apart
    ttfts: list = field(default_factory=list)


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _choose(rng: random.Random) -> str:
    names, weights = zip(*ACTIONS)
    return rng.choices(names, weights)[0]


def _run_turn(backend, messages, sampling, thinking, reuse_prefix, cancel_mid):
    """(TurnDone or None, the streamed text, an error string, ttft): as app._generate iterates the backend."""
    from qwenlocal.engine.events import EngineError, ReasoningDelta, TokenDelta, TurnDone

    cancel = threading.Event()
    deltas, streamed, ttft, t0 = 0, [], None, now()
    for ev in backend.start_turn(messages, sampling, thinking, cancel, reuse_prefix):
        if isinstance(ev, (TokenDelta, ReasoningDelta)):
            ttft = now() - t0 if ttft is None else ttft
            deltas += 1
            if isinstance(ev, TokenDelta):
                streamed.append(ev.text)
            if cancel_mid and deltas == CANCEL_AFTER:
                cancel.set()  # the event the app's Esc sets; the engine checks it before every decode step
        elif isinstance(ev, TurnDone):
            return ev, "".join(streamed), "", ttft, cancel.is_set()
        elif isinstance(ev, EngineError):
            return None, "".join(streamed), f"{ev.kind}: {ev.message}", ttft, cancel.is_set()
    return None, "".join(streamed), "the stream ended without TurnDone", ttft, cancel.is_set()


def _replay(engine, messages, sampling, thinking):
    from qwenlocal.engine.events import TurnDone

    done = [ev for ev in engine.chat(messages, sampling, enable_thinking=thinking) if isinstance(ev, TurnDone)]
    return done[0] if done else None


def run_chat(turns: int, seed: int = 0, max_tokens: int = 12, max_context: int = 1024, every_s: float = 2.0,
             warmup: int = 20, log=print, trace_python: bool = False) -> dict:
    """`warmup` turns run (and are checked) before RSS sampling starts: the allocator's first growth is not a leak.
    trace_python: tracemalloc over the sampled turns too, to tell Python objects that stay (a leak, or what the
    soak itself keeps) from the allocator's behaviour (slower: every Python allocation is traced)."""
    from qwenlocal.app.chat.backend import EngineBackend
    from qwenlocal.app.chat.context import ContextTooLong, fit_to_context
    from qwenlocal.app.chat.conversation import Conversation
    from qwenlocal.app.chat.store import ConversationStore
    from qwenlocal.app.models import resolve_model
    from qwenlocal.engine import Engine

    opts = {"max_context": max_context}  # a small context, so that long messages overflow it within a few turns
    backend = EngineBackend(device="cpu", options=opts)
    backend.load(lambda *a: None)
    replayer = Engine.from_pretrained(resolve_model(None).path, device="cpu", options=opts)
    store = ConversationStore(Path(tempfile.mkdtemp(prefix="qwenlocal-soak-convs-")))
    limit = backend.context_limit
    rng = random.Random(seed)
    fig = ChatFigures()
    convs: dict[str, Conversation] = {}
    sampler = RssSampler(os.getpid(), every_s)
    t_start = now()

    def new_conv() -> Conversation:
        conv = Conversation(model=backend.label, system="You are a soak test." if rng.random() < 0.5 else "")
        convs[conv.id] = conv
        fig.conversations += 1
        return conv

    conv = new_conv()
    thinking, last_seed = False, 0
    for turn in range(turns):
        if turn == min(warmup, turns - 1):
            sampler.start()
            if trace_python:
                traced = PythonHeap().start()
        action = _choose(rng)
        last_user = conv.last_index("user")
        if action in ("regen", "edit") and last_user is None:
            action = "new"
        fig.actions[action] = fig.actions.get(action, 0) + 1
        fig.turns += 1
        if action == "newchat":
            conv, thinking = new_conv(), rng.random() < 0.5
            continue
        previous = conv.messages[last_user + 1] if action == "regen" and last_user + 1 < len(conv.messages) else None
        if action == "regen":
            del conv.messages[last_user + 1:]  # actions._rewind(idx + 1)
            reuse = len(conv.engine_messages())
        elif action == "edit":
            old = conv.messages[last_user].content
            del conv.messages[last_user:]  # actions._rewind(idx), then the edited message
            conv.add("user", f"{old.split(':')[0]} edited at turn {turn}: {_words(rng, 6)}")
            reuse = len(conv.engine_messages()) - 1
        else:
            # A word of WORDS is about 3.7 tokens: a long message is 15-30% of the context, a huge one ~7x it.
            n = {"long": rng.randint(max_context // 24, max_context // 12), "huge": max_context * 2}.get(
                action, rng.randint(3, 12))
            conv.add("user", f"turn {turn}: {_words(rng, n)}")
            reuse = len(conv.engine_messages()) - 1
        # Seeded sampling over the whole vocabulary: the seed decides the reply (greedy replies of the random demo
        # weights hardly depend on the prompt), so a reply from another request differs from this one's replay.
        # Regenerate keeps the seed of the reply it replaces, so it must reproduce that reply exactly.
        seed = last_seed if action == "regen" else 1000 + turn
        last_seed = seed
        sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "seed": seed, "max_tokens": max_tokens}
        messages = conv.engine_messages()
        # app._fit: the oldest turns are left out of what is sent when the prompt would not fit
        count = lambda m: backend.count_tokens(m, thinking)  # noqa: E731
        try:
            fitted = fit_to_context(messages, count, limit, tokens=count(messages))
        except ContextTooLong as exc:
            conv.add("assistant", "", finish_reason="refused")
            if action == "huge" or len(conv.messages[-2].content.split()) > limit:  # a regen of such a message
                fig.refused_ok += 1
            else:
                fig.lost.append((turn, f"{action} refused: {exc}"))
            _check_saved(store, conv, turn, fig)
            continue
        if fitted.dropped_turns:
            fig.trimmed_turns += 1
            reuse = 0
        if action == "huge":
            fig.lost.append((turn, "a message twice the context was not refused"))
        t0 = now()
        done, streamed, error, ttft, cancelled = _run_turn(backend, fitted.messages, sampling, thinking, reuse,
                                                cancel_mid=action == "cancel")
        if done is None:
            fig.lost.append((turn, f"{action}: {error}"))
            conv.add("assistant", streamed, finish_reason="error")
            _check_saved(store, conv, turn, fig)
            continue
        fig.latencies.append(now() - t0)
        if ttft is not None:
            fig.ttfts.append(ttft)
        conv.add("assistant", done.text, reasoning=done.reasoning, finish_reason=done.finish_reason)
        fig.texts.add((done.text, done.reasoning))
        _check_saved(store, conv, turn, fig)
        ref = _replay(replayer, fitted.messages, sampling, thinking)
        fig.cancel_early += action == "cancel" and not cancelled
        if streamed != done.text:
            fig.mismatched.append((turn, action, "the streamed deltas differ from TurnDone's text"))
        elif cancelled:  # (a reply that ended by itself before the cancel was due is checked like any other)
            # Stopped mid-reply: fewer tokens than asked, and what came is the start of the full reply.
            cut = lambda t: t.rstrip("\ufffd")  # noqa: E731  (a character cut in half at the stop)
            if (done.finish_reason == "cancelled" and done.completion_tokens < max_tokens and ref is not None
                    and ref.text.startswith(cut(done.text)) and ref.reasoning.startswith(cut(done.reasoning))):
                fig.cancels_ok += 1
            else:
                fig.mismatched.append((turn, action, f"cancel: {done.finish_reason}, {done.completion_tokens} tok"))
        elif ref is None or (done.text, done.reasoning, done.finish_reason) != (ref.text, ref.reasoning,
                                                                                ref.finish_reason):
            fig.mismatched.append((turn, action, "differs from a fresh replay of the same prompt"))
        elif (previous is not None and previous.finish_reason in ("stop", "length") and not fitted.dropped_turns
              and (previous.content, previous.reasoning) != (done.text, done.reasoning)):
            fig.mismatched.append((turn, action, "regenerate (same seed) differs from the reply it replaced"))
        else:
            fig.replies_ok += 1
        if (turn + 1) % 50 == 0:
            log(f"  chat: {turn + 1}/{turns} turns, {now() - t_start:.0f} s")
    wall = now() - t_start
    rss = sampler.stop()
    if trace_python:
        rss["python_heap"] = traced.stop()
    _check_store_end(store, convs, fig)
    backend.close()
    return {"turns": fig.turns, "actions": fig.actions, "replies_ok": fig.replies_ok, "cancels_ok": fig.cancels_ok,
            "cancel_early": fig.cancel_early,
            "refused_ok": fig.refused_ok, "trimmed_turns": fig.trimmed_turns, "lost": fig.lost,
            "mismatched": fig.mismatched, "store_bad": fig.store_bad, "conversations": fig.conversations,
            "distinct_replies": len(fig.texts),
            "wall_s": wall, "latency_s": latency(fig.latencies), "ttft_s": latency(fig.ttfts), "rss": rss,
            "max_tokens": max_tokens, "max_context": limit, "warmup_turns": min(warmup, turns - 1)}


def _check_saved(store, conv, turn, fig) -> None:
    try:
        store.save(conv)
        if store.load(conv.id).to_json() != conv.to_json():
            fig.store_bad.append((turn, "the saved conversation differs from the one in memory"))
    except Exception as exc:
        fig.store_bad.append((turn, f"{type(exc).__name__}: {exc}"))


def _check_store_end(store, convs, fig) -> None:
    saved, skipped = store.list()
    if skipped:
        fig.store_bad.append(("end", f"{len(skipped)} saved conversations could not be read"))
    by_id = {c.id: c for c in saved}
    for cid, conv in convs.items():
        if conv.messages and (cid not in by_id or by_id[cid].to_json() != conv.to_json()):
            fig.store_bad.append(("end", f"conversation {cid} missing or different on disk"))
