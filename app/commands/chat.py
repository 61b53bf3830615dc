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
    parser.add_argument("--api-key", help="API key for --endpoint (sent as a Bearer token); with --web, the "
                                          "page's password")
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
    web = parser.add_argument_group("in the browser (--web)")
    web.add_argument("--web", action="store_true",
                     help="open the chat in the browser: one engine server, every tab a client of it")
    web.add_argument("--host", default="127.0.0.1",
                     help="address the page listens on (default 127.0.0.1: this machine only; any other needs "
                          "--api-key or --api-key-file, which the browser asks for as the password)")
    web.add_argument("--port", type=int, default=None, help="the page's port (default 8765; 0: any free port)")
    web.add_argument("--api-key-file", help="read the page's API key from this file (keeps it out of `ps`)")
    web.add_argument("--no-browser", action="store_true", help="print the page's address, do not open a browser")
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
    if args.web:
        from qwenlocal.app.commands.chat_web import DEFAULT_WEB_PORT, run_web

        args.port = DEFAULT_WEB_PORT if args.port is None else args.port
        return run_web(args)
    for flag, value in (("--port", args.port), ("--no-browser", args.no_browser or None),
                        ("--api-key-file", args.api_key_file), ("--host", None if args.host == "127.0.0.1" else 1)):
        if value is not None:
            raise OptionError(f"{flag} is for --web (the chat in the browser); add --web or leave it out")
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
