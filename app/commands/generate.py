"""`qwenlocal generate PROMPT`: one prompt, one streamed reply on stdout (no TUI; scripts and smoke tests)."""
from __future__ import annotations

import argparse
import sys

from qwenlocal.app.commands import add_threads_argument, thread_options
from qwenlocal.engine.errors import ContextLimitError
from qwenlocal.engine.events import EngineError, ReasoningDelta, TokenDelta, TurnDone


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompt", help="the user message")
    parser.add_argument("--model", help="checkpoint folder, hub id, alias or synthetic:NAME "
                                        "(default: the built-in demo model)")
    parser.add_argument("--system", help="system prompt")
    parser.add_argument("--no-think", action="store_true", help="turn thinking off")
    parser.add_argument("--hide-thinking", action="store_true", help="do not print the reasoning part")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float)
    parser.add_argument("--top-p", type=float)
    parser.add_argument("--top-k", type=int)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda when available")
    add_threads_argument(parser)


def run(args: argparse.Namespace) -> int:
    from qwenlocal.app.models import resolve_model  # looked up per run: a module-level name would pin what it was at import

    model = resolve_model(args.model, device=args.device)
    print(f"model: {model.label}", file=sys.stderr)
    from qwenlocal.engine import Engine

    engine = Engine.from_pretrained(model.target, device=args.device, options=thread_options(args))
    messages = ([{"role": "system", "content": args.system}] if args.system else [])
    messages.append({"role": "user", "content": args.prompt})
    sampling = {"max_tokens": args.max_tokens, "temperature": args.temperature, "top_p": args.top_p,
                "top_k": args.top_k, "seed": args.seed}
    try:
        events = engine.chat(messages, sampling, enable_thinking=not args.no_think)
    except ContextLimitError as exc:  # one prompt, no history: the advice is about the prompt
        raise ContextLimitError(f"the prompt does not fit: {str(exc).split(':')[0]}; shorten the prompt"
                                + (" or the system prompt" if args.system else "")) from None
    in_reasoning = False
    for event in events:
        if isinstance(event, ReasoningDelta) and not args.hide_thinking:
            if not in_reasoning:
                sys.stdout.write("<think>\n")
                in_reasoning = True
            sys.stdout.write(event.text)
        elif isinstance(event, TokenDelta):
            if in_reasoning:
                sys.stdout.write("\n</think>\n\n")
                in_reasoning = False
            sys.stdout.write(event.text)
        elif isinstance(event, EngineError):
            print(f"\nerror: {event.message}", file=sys.stderr)
            return 1
        elif isinstance(event, TurnDone):
            s = event.stats
            print(f"\n[{event.finish_reason}: {event.completion_tokens} tokens, TTFT {s['ttft_s']:.3f} s, "
                  f"decode {s['decode_tok_s']:.1f} tok/s]", file=sys.stderr)
        sys.stdout.flush()
    return 0
