"""`draftless serve`: the OpenAI-compatible server on one model.

    draftless serve [--model NAME] [--host 127.0.0.1] [--port 8000] [--no-spec]
                    [--spec-ref FILE]... [--index-budget BYTES] [--threads N] [--n-ctx N]
                    [--api-key KEY] [--cors ORIGIN]...

The web stack (FastAPI, uvicorn, sse-starlette, prometheus_client) is imported only when the
server starts (`pip install 'draftless[serve]'`).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
from typing import Any

from draftless.cli.common import (
    MAX_DRAFT,
    MAX_REFERENCES,
    UsageError,
    add_model_options,
    add_no_edits_option,
    open_model,
    read_text_file,
)
from draftless.decoder import SpecOptions
from draftless.serve.history import DEFAULT_INDEX_BUDGET

API_KEY_ENV = "DRAFTLESS_API_KEY"


def add_serve_options(p: argparse.ArgumentParser) -> None:
    add_model_options(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (8000)")
    p.add_argument("--no-spec", action="store_true", help="plain decoding (no speculation)")
    add_no_edits_option(p)
    p.add_argument(
        "--spec-ref",
        action="append",
        default=[],
        metavar="FILE",
        help=f"reference document every request drafts from (repeatable, up to {MAX_REFERENCES})",
    )
    p.add_argument(
        "--index-budget",
        type=int,
        default=DEFAULT_INDEX_BUDGET,
        metavar="BYTES",
        help="bytes for the draft index over earlier requests; oldest evicted first "
        f"(default {DEFAULT_INDEX_BUDGET}; 0: off)",
    )
    p.add_argument(
        "--max-draft", type=int, default=MAX_DRAFT, help="draft tokens per verify at most"
    )
    p.add_argument(
        "--api-key",
        metavar="KEY",
        help=f"require 'Authorization: Bearer KEY' on /v1/ requests (default: ${API_KEY_ENV} "
        "if set, else none; the variable keeps the key out of the process list)",
    )
    p.add_argument(
        "--cors",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="let web pages from ORIGIN (e.g. http://localhost:3000; '*' for any) call the API "
        "from the browser (repeatable; default: none)",
    )
    p.add_argument("--log-level", default="warning", help="uvicorn's log level (warning)")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serve", help="an OpenAI-compatible HTTP server (lossless speculation)"
    )
    add_serve_options(p)
    p.set_defaults(func=cmd_serve)


def build_app(args: argparse.Namespace) -> Any:
    """The FastAPI app for these options (the model loaded, the worker started)."""
    from draftless.serve.app import create_app
    from draftless.serve.engine import Engine

    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be in [0, 65535], got {args.port}")
    if args.index_budget < 0:
        raise UsageError(f"--index-budget must be >= 0 bytes, got {args.index_budget}")
    if args.no_spec and args.spec_ref:
        raise UsageError("--spec-ref needs speculation (drop --no-spec)")
    if args.no_spec and args.no_edits:
        raise UsageError("--no-edits needs speculation (drop --no-spec)")
    if len(args.spec_ref) > MAX_REFERENCES:
        raise UsageError(f"at most {MAX_REFERENCES} references, got {len(args.spec_ref)}")
    api_key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV)
    if api_key is not None and not api_key.strip():
        raise UsageError(
            f"the API key is empty ({'--api-key' if args.api_key is not None else API_KEY_ENV})"
        )
    for origin in args.cors:
        if origin != "*" and not re.fullmatch(r"https?://[^/\s]+", origin):
            raise UsageError(
                f"--cors takes an origin like http://localhost:3000 (scheme and host, no "
                f"path) or '*', got {origin!r}"
            )
    documents = [read_text_file(path, "reference") for path in args.spec_ref]
    options = SpecOptions(max_draft=args.max_draft)
    model = open_model(args, quiet=True)
    engine = Engine(
        model,
        spec=not args.no_spec,
        references=documents,
        index_budget=args.index_budget,
        options=options,
        edits=not args.no_edits,
    )
    return create_app(engine, api_key=api_key, cors_origins=args.cors)


class _Stopped(Exception):
    pass


def _stopped(signum: int, frame: Any) -> None:
    raise _Stopped


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    app = build_app(args)
    # uvicorn handles SIGINT/SIGTERM: it stops accepting, lets in-flight requests finish
    # (streams end), then the app's lifespan cancels what still waits and joins the worker.
    # Afterwards it raises the signal again for the handler it found; ours ends with status 0.
    previous = signal.signal(signal.SIGTERM, _stopped)
    try:
        uvicorn.run(
            app,
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            timeout_graceful_shutdown=10,
        )
    except (_Stopped, KeyboardInterrupt):
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0
