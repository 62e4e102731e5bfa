"""`draftless probe`: measure this model's verify costs C(k) on this machine and store them."""

from __future__ import annotations

import argparse
from typing import Any

from draftless.cli.common import UsageError, add_model_options, open_model
from draftless.costs import PROBE_KS, measure, store
from draftless.progress import Spinner


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("probe", help="measure this model's verify costs C(k), store them")
    add_model_options(p)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--no-store", action="store_true")
    p.set_defaults(func=cmd_probe)


def cmd_probe(args: argparse.Namespace) -> int:
    if args.reps < 1:
        raise UsageError("--reps must be >= 1")
    if args.context < 1:
        raise UsageError("--context must be >= 1")
    model = open_model(args)
    try:
        with Spinner("measuring verify costs"):
            result = measure(model, ks=PROBE_KS, reps=args.reps, context=args.context)
        print(
            f"verify cost C(k) of {model.name} on {model.backend}, {model.threads} thread(s) "
            f"(plain step {1000 * result.plain_seconds:.2f} ms at {result.context} tokens "
            "of context)"
        )
        print("k\tC(k) plain steps\tbreak-even acceptance ~C(k)/k")
        for k, c in zip(result.table.ks, result.table.costs, strict=True):
            print(f"{k}\t{c:.2f}\t{min(1.0, c / k):.0%}" if k > 1 else f"{k}\t{c:.2f}\t-")
        if not args.no_store:
            path = store(model, result)
            threads = f" at {model.threads} thread(s)" if model.threads else ""
            print(
                f"stored in {path}; the decoder uses it by default for this model and "
                f"backend{threads}, until the backend's build changes"
            )
    finally:
        model.close()
    return 0
