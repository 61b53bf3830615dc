"""`qwenlocal serve`: the engine behind an OpenAI-compatible API (chat completions, completions, models, health)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from qwenlocal.app.commands import add_threads_argument, thread_options
from qwenlocal.engine.errors import OptionError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="checkpoint folder (default: the built-in demo model)")
    parser.add_argument("--model-name", help="the id clients send as 'model' (default: the folder's name)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on /v1/*")
    parser.add_argument("--api-key-file", help="read the API key from this file (keeps it out of `ps`)")
    parser.add_argument("--queue", type=int, default=8,
                        help="requests that may wait behind the running one; more get HTTP 429 (default 8)")
    parser.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda when available")
    add_threads_argument(parser)
    parser.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])


def _api_key(args: argparse.Namespace) -> str | None:
    if args.api_key and args.api_key_file:
        raise OptionError("give --api-key or --api-key-file, not both")
    if args.api_key_file:
        try:
            key = Path(args.api_key_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise OptionError(f"--api-key-file: cannot read {args.api_key_file}: {exc.strerror}") from None
        if not key:
            raise OptionError(f"--api-key-file: {args.api_key_file} is empty")
        return key
    if args.api_key is not None and not args.api_key.strip():
        raise OptionError("--api-key is empty; give a key or leave the flag out")
    return args.api_key


def _model_id(model, demo_name: str) -> str:
    """The id clients send: a hub repo id as vLLM would serve it, else the folder's name."""
    if model.is_demo:
        return demo_name
    if getattr(model, "repo_id", None):
        return model.repo_id
    if model.path is not None:
        return model.path.resolve().name
    return str(getattr(model, "ref", "") or model.label)


def run(args: argparse.Namespace) -> int:
    if args.queue < 0:
        raise OptionError(f"--queue must be 0 or more, got {args.queue}")
    if not 0 < args.port < 65536:
        raise OptionError(f"--port must be in 1..65535, got {args.port}")
    api_key = _api_key(args)
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise OptionError(f"qwenlocal serve needs FastAPI and uvicorn ({exc.name} is missing): "
                          "pip install 'fastapi>=0.110' 'uvicorn>=0.29'") from None

    from qwenlocal.app.models import DEMO_NAME, resolve_model

    from ..serve.launch import bind, engine_worker, exposure_warning, serve_foreground
    from ..serve.server import create_app

    warning = exposure_warning(args.host, api_key)
    if warning:
        print(warning, file=sys.stderr)
    model = resolve_model(args.model)
    model_id = args.model_name or _model_id(model, DEMO_NAME)
    # Bind before loading: a port in use is reported at once, not after minutes of loading weights.
    try:
        sock = bind(args.host, args.port)
    except OSError as exc:
        raise OptionError(f"cannot listen on {args.host}:{args.port} ({exc.strerror or exc}): another server may "
                          "be using it; pick another with --port, or check --host") from None
    print(f"model: {model.label} (served as {model_id!r}); loading...", file=sys.stderr)
    # `target` (a folder, or a synthetic:NAME reference) where models.py has it; a folder otherwise.
    worker = engine_worker(getattr(model, "target", model.path), device=args.device, max_waiting=args.queue,
                           options=thread_options(args))
    try:
        worker.wait_ready()
        print(f"serving on http://{args.host}:{args.port}/v1  (auth: {'API key' if api_key else 'none'}, "
              f"queue: {args.queue}, context: {worker.info.get('max_context')} tokens)", file=sys.stderr)
        if warning:
            print(warning, file=sys.stderr)  # again, after the loading logs, where it is seen
        serve_foreground(create_app(worker, model_id, api_key), sock, args.log_level)
        # uvicorn returns after a graceful stop, or (below) re-raises the Ctrl-C that stopped it, depending on
        # when the signal came (seen once in CI, session 10): both are the normal stop, said once either way.
        print("qwenlocal serve: stopped", file=sys.stderr)
    except KeyboardInterrupt:  # uvicorn has shut down gracefully and re-raised Ctrl-C: a normal stop
        print("qwenlocal serve: stopped", file=sys.stderr)
    finally:
        worker.close()
        sock.close()
    return 0
