"""`qwenlocal chat --web`: one engine server on loopback, and the chat in the browser, one process per tab.

The engine loads once, in this process, behind the `qwenlocal serve` app (on an ephemeral loopback port). Every
browser tab runs `qwenlocal chat --endpoint` against it, so a second tab never loads a second model. Both
sockets are bound and every option is checked before the model loads; Ctrl+C stops the tabs, then the engine.
"""
from __future__ import annotations

import argparse
import sys
import threading

from qwenlocal.app.commands import thread_options
from qwenlocal.engine.errors import OptionError

DEFAULT_WEB_PORT = 8765
# Chat options each tab's client is started with (the engine-side ones go to the engine server instead).
_CLIENT_FLAGS = {"system": "--system", "max_tokens": "--max-tokens", "temperature": "--temperature",
                 "top_p": "--top-p", "top_k": "--top-k", "seed": "--seed", "theme": "--theme", "keymap": "--keymap"}


def client_args(args: argparse.Namespace) -> list[str]:
    out: list[str] = []
    for name, flag in _CLIENT_FLAGS.items():
        value = getattr(args, name, None)
        if value not in (None, ""):
            out += [flag, str(value)]
    if args.no_think:
        out.append("--no-think")
    return out


def _check_options(args: argparse.Namespace) -> str | None:
    """Reject what cannot work before anything starts; returns the API key (None: no key)."""
    from qwenlocal.app.commands.serve import _api_key
    from qwenlocal.app.serve.launch import is_loopback

    if args.endpoint:
        raise OptionError("--web runs its own engine server; leave out --endpoint (or drop --web to chat with "
                          "that server in the terminal)")
    if args.fake:
        raise OptionError("--web does not take --fake")
    if not 0 <= args.port < 65536:
        raise OptionError(f"--port must be in 0..65535 (0: any free port), got {args.port}")
    api_key = _api_key(args)
    if not is_loopback(args.host) and not api_key:
        raise OptionError(f"--host {args.host} lets other machines open this chat: give --api-key KEY or "
                          "--api-key-file FILE (the browser asks for it as the password), or leave --host out "
                          "to stay on this machine")
    try:
        import textual_serve  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise OptionError(f"qwenlocal chat --web needs textual-serve and uvicorn ({exc.name} is missing): "
                          "pip install 'textual-serve>=1.1' 'uvicorn>=0.29'") from None
    return api_key


def page_url(host: str, port: int) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    return f"http://[{shown}]:{port}/" if ":" in shown else f"http://{shown}:{port}/"


def open_browser(url: str) -> None:
    """Open the default browser without blocking; say so plainly when there is none."""
    import webbrowser

    def attempt() -> None:
        try:
            opened = webbrowser.open(url, new=2)
        except Exception:  # webbrowser raises various errors on broken setups; the message below covers them
            opened = False
        if not opened:
            print(f"qwenlocal chat --web: could not open a browser here; open {url} yourself", file=sys.stderr,
                  flush=True)

    threading.Thread(target=attempt, name="qwenlocal-browser", daemon=True).start()


def run_web(args: argparse.Namespace) -> int:
    api_key = _check_options(args)
    from qwenlocal.app.models import DEMO_NAME, resolve_model

    from ..commands.serve import _model_id
    from ..serve.launch import bind, engine_worker, start_in_thread
    from ..serve.server import create_app
    from ..serve.webfront import make_front_end, run_front_end, tab_command

    # Bind the page's port first: a port in use is reported now, not after loading the model.
    try:
        sock = bind(args.host, args.port)
    except OSError as exc:
        raise OptionError(f"cannot listen on {args.host}:{args.port} ({exc.strerror or exc}): another program "
                          "may be using it; pick another with --port (0: any free port)") from None
    worker = handle = None
    try:
        model = resolve_model(args.model, device=args.device)  # a model that does not fit: ResourceError here
        model_id = _model_id(model, DEMO_NAME)
        print(f"model: {model.label}; loading...", file=sys.stderr, flush=True)
        worker = engine_worker(getattr(model, "target", model.path), device=args.device,
                               options=thread_options(args))
        worker.wait_ready()
        # The engine server: loopback only whatever --host is (so, like `serve` on loopback, no key); its port
        # is the OS's choice. The API key guards the page, the only part other machines can reach.
        handle = start_in_thread(create_app(worker, model_id), "127.0.0.1", 0)
        endpoint = f"{handle.url}/v1"
        chat_args = client_args(args)
        url = page_url(args.host, sock.getsockname()[1])

        def ready() -> None:
            print(f"chat in the browser: {url}  (engine: {model_id} on {endpoint}; "
                  f"{'password: the API key' if api_key else 'this machine only'}; Ctrl+C stops)", flush=True)
            if not args.no_browser:
                open_browser(url)

        front = make_front_end(tab_command(endpoint, model_id, chat_args), f"qwenlocal chat: {model_id}",
                               api_key, ready)
        run_front_end(front, sock)
        print("qwenlocal chat --web: stopped", file=sys.stderr)
    finally:
        if handle is not None:
            handle.stop()
        if worker is not None:
            worker.close()
        sock.close()
    return 0
