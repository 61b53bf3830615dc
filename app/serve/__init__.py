"""`qwenlocal serve`: the embedded engine behind an OpenAI-compatible HTTP API, and a client for such servers.

Modules, each with one job (none imports torch at import time; the engine is imported on the engine thread):
  protocol       request bodies -> validated dataclasses; ApiError in OpenAI's error shape
  stops          stop strings that cut the text, also across token boundaries
  worker         the engine thread: owns the engine, runs one generation at a time, bounded queue
  rawgen         /v1/completions: a raw prompt (no chat template) through Engine.complete
  responses      OpenAI response and SSE chunk bodies
  server         the FastAPI app (routes, auth, errors, streaming, disconnect -> cancel) and a launcher
  remote_client  engine events from any OpenAI-compatible server (for `qwenlocal chat --endpoint`)
  loadtest       a bounded loopback load test with a serial replay check
  webfront       the browser page of `qwenlocal chat --web` (textual-serve: one --endpoint chat per tab)
"""
