"""`qwenlocal chat`: the Textual chat app on the embedded engine (or, with --fake, on a scripted backend).

Nothing here imports torch or the engine at import time: the backend loads the engine on its worker thread.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from qwenlocal.app.commands import add_threads_argument, thread_options
from qwenlocal.engine.errors import OptionError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="checkpoint folder, hub id, alias or synthetic:NAME (default: the built-in "
                                        "demo model); with --endpoint, the model id to ask the server for")
    parser.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda when available")
    add_threads_argument(parser)
    parser.add_argument("--endpoint", help="chat with an OpenAI-compatible server instead (vLLM, SGLang, "
                                           "llama-server, qwenlocal serve), e.g. http://127.0.0.1:8000/v1")
    parser.add_argument("--api-key", help="API key for --endpoint (sent as a Bearer token)")
    parser.add_argument("--system", default="", help="system prompt")
    parser.add_argument("--no-think", action="store_true", help="start with thinking off")
    parser.add_argument("--max-tokens", type=int, help="max tokens per reply (default: the model's)")
    parser.add_argument("--temperature", type=float)
    parser.add_argument("--top-p", type=float)
    parser.add_argument("--top-k", type=int)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--theme", choices=["dark", "light"], help="colour theme (F3 toggles)")
    parser.add_argument("--keymap", type=Path,
                        help="JSON {binding id: keys} to remap keys (default: keymap.json in the data folder)")
    parser.add_argument("--yes", action="store_true",
                        help="a known --model that is not downloaded yet: download it without asking")
    parser.add_argument("--force", action="store_true",
                        help="offer that download even if the fit check says the model will not fit")
    parser.add_argument("--fake", action="store_true", help=argparse.SUPPRESS)  # scripted backend, for UI work


def load_keymap(path: Path | None) -> dict[str, str]:
    from qwenlocal.app.paths import data_dir

    target = path or data_dir() / "keymap.json"
    if not target.is_file():
        if path is not None:
            raise OptionError(f"--keymap {path}: no such file")
        return {}
    try:
        raw = json.loads(target.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise OptionError(f"{target}: not a JSON object of binding id -> keys ({exc})") from exc
    if not isinstance(raw, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in raw.items()):
        raise OptionError(f"{target}: expected a JSON object like {{\"chat.new\": \"ctrl+n\"}}")
    from qwenlocal.app.chat.keymap import validate_keymap

    return validate_keymap(raw, str(target))


def run(args: argparse.Namespace) -> int:
    from qwenlocal.app.chat.app import ChatApp

    if args.fake:
        from qwenlocal.app.chat.fake import ScriptedBackend, ScriptedReply

        backend = ScriptedBackend([ScriptedReply(answer="A scripted **reply**:\n\n```python\nprint('hi')\n```\n",
                                                 reasoning="Thinking about how to reply.")], tokens_per_s=30)
    elif args.endpoint:
        from qwenlocal.app.serve.remote_client import RemoteBackend

        backend = RemoteBackend(args.endpoint, api_key=args.api_key, model=args.model)
    else:
        from qwenlocal.app.chat.backend import EngineBackend
        from qwenlocal.app.commands.chat_download import ensure_model_on_disk

        ensure_model_on_disk(args)  # a known model not downloaded yet: offer the download, before the TUI
        backend = EngineBackend(args.model, device=args.device, options=thread_options(args))
    sampling = {"max_tokens": args.max_tokens, "temperature": args.temperature, "top_p": args.top_p,
                "top_k": args.top_k, "seed": args.seed}
    theme = {"dark": "textual-dark", "light": "textual-light"}.get(args.theme or "")
    app = ChatApp(backend, thinking=not args.no_think, sampling=sampling, system=args.system,
                  keymap=load_keymap(args.keymap), theme=theme)
    app.run()
    if app.load_error:
        print(f"qwenlocal chat: {app.load_error}", file=sys.stderr)
    return app.return_code or 0
