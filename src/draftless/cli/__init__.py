"""The `draftless` command line: one module per subcommand, registered here.

User mistakes (any `draftless.errors.UserError`: a missing model, a bad option, an
unreadable reference) print one line, `draftless: error: ...`, and exit 2; no traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from draftless.cli import bench, chat, demo, generate, probe, pull, serve, tokenize
from draftless.errors import UserError

SUBCOMMANDS = (generate, chat, serve, probe, tokenize, demo, bench, pull)


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors as the one line every other user mistake gets."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"draftless: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="draftless",
        description="Lossless speculative decoding with no draft model and no training.",
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for module in SUBCOMMANDS:
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except UserError as err:
        print(f"draftless: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("draftless: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
