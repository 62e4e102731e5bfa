"""`draftless demo`: plain vs speculative on a copy task, on every installed backend."""

from __future__ import annotations

import argparse
import time
from typing import Any

from draftless.cli.common import MAX_DRAFT, UsageError, add_model_options, open_model
from draftless.costs import table_for
from draftless.decoder import GenerationResult, SpecOptions, generate
from draftless.models.registry import hf_available, llamacpp_available
from draftless.sources.cascade import SpeculationIndex
from draftless.text import encode_prompt

DEMO_PASSAGE = (
    "The Rhine rises in the Swiss Alps and flows for about 1,230 kilometres through "
    "Switzerland, Liechtenstein, Austria, Germany, France and the Netherlands before it "
    "empties into the North Sea. For centuries it has been one of the most important "
    "waterways in Europe, carrying coal, grain and timber between the industrial heartlands "
    "and the sea ports of Rotterdam and Antwerp. Castles line its middle valley, and the "
    "steep vineyards on its banks produce some of the best known white wines in the world."
)


def register(subparsers: Any) -> None:
    d = subparsers.add_parser("demo", help="speculative vs plain on a copy task, default model")
    add_model_options(d)
    d.add_argument("--max-new-tokens", "-n", type=int, default=200)
    d.add_argument("--max-draft", type=int, default=MAX_DRAFT)
    d.add_argument("--reps", type=int, default=3)
    d.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    if args.backend == "auto":
        backends = [
            b for b, ok in (("llamacpp", llamacpp_available()), ("hf", hf_available())) if ok
        ]
    else:
        backends = [args.backend]
    if not backends:
        raise UsageError(
            "no backend installed: pip install 'draftless[llamacpp]' or 'draftless[hf]'"
        )
    if args.reps < 1 or args.max_new_tokens < 1:
        raise UsageError("--reps and --max-new-tokens must be >= 1")
    text = f"Original text:\n{DEMO_PASSAGE}\n\nThe same text, copied exactly:\n"
    print(
        f"task: grounded copy (raw completion), greedy, up to {args.max_new_tokens} new tokens, "
        f"{args.reps} alternating plain/speculative runs per backend; medians",
        flush=True,
    )
    all_identical = True
    for backend in backends:
        args.backend = backend
        all_identical &= demo_backend(args, text)
    return 0 if all_identical else 1


def demo_backend(args: argparse.Namespace, text: str) -> bool:
    t0 = time.perf_counter()
    model = open_model(args)
    load = time.perf_counter() - t0
    table, origin = table_for(model)
    ids = encode_prompt(model, text, chat=False)
    spec = SpecOptions(max_draft=args.max_draft)
    generate(model, ids, 8)  # warm-up
    runs: dict[str, list[GenerationResult]] = {"plain": [], "spec": []}
    for _ in range(args.reps):  # alternate, so drift hits both alike
        runs["plain"].append(generate(model, ids, args.max_new_tokens))
        source = SpeculationIndex(model.vocab_size)
        runs["spec"].append(generate(model, ids, args.max_new_tokens, source=source, options=spec))
    plain, last = runs["plain"][-1], runs["spec"][-1]
    identical = all(r.token_ids == plain.token_ids for r in runs["plain"] + runs["spec"])

    def median(results: list[GenerationResult]) -> float:
        return sorted(r.seconds for r in results)[len(results) // 2]

    tp, ts = median(runs["plain"]), median(runs["spec"])
    n = len(plain.token_ids)
    shown = [t for t in last.token_ids if t not in model.eos_token_ids]
    print(
        f"\n== {model.name} on {model.backend}, {model.threads} thread(s) (loaded in "
        f"{load:.1f} s; verify-cost table: {origin}, C(16) = {table.cost(16):.1f} plain steps)"
    )
    print(model.tokenizer.decode(shown, skip_special=True).strip())
    print(last.stats.summary())
    print(
        f"plain {n} tokens in {tp:.2f} s ({n / tp:.1f} tok/s); "
        f"speculative {ts:.2f} s ({n / ts:.1f} tok/s): speedup {tp / ts:.2f}x; "
        f"identical to plain: {'yes' if identical else 'NO'}",
        flush=True,
    )
    model.close()
    return identical
