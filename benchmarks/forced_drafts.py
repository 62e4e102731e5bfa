"""What the grammar's forced tokens add as drafts, on the structured benchmark's extractions.

    PYTHONPATH=src python benchmarks/forced_drafts.py --model qwen2.5-coder-1.5b --threads 2 \\
        --seed 2 --tasks 8

Each extraction (benchmarks/structured.py's documents and schemas, by `--seed`) is decoded
twice with the cascade under its JSON schema: as the decoder does, and with the forced
tokens taken out as drafts (`SpeculativeDecoder._forcing` cleared, the rest the same). The
gate prices verifies by the model's cost table alone (`clock=None`: no live timing), so both
runs are deterministic, and each is scored by that table: committed tokens over the cost of
its forwards in plain steps (a plain step 1, a verify of k tokens C(k)), the speedup over
plain decoding that the table predicts. On a shared machine whose timings wander by 20% from
one request to the next (docs/bench/structured), this separates the mechanism from the noise;
the lockstep servers of structured.py measure the time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from structured import tasks

from draftless import SpeculativeDecoder, load_model, table_for
from draftless.grammar import GrammarSpec, compile_grammar
from draftless.sources.cascade import SpeculationIndex


def modeled(stats: Any, cost: Any) -> float:
    """Committed tokens per plain step's worth of forwards, by the cost table."""
    verifies = sum(n * cost(d + 1) for d, n in stats.draft_lengths.items())
    return float(stats.committed / (stats.plain_steps + verifies))


def run(model: Any, ids: list[int], schema: dict[str, Any], forced: bool, n: int) -> Any:
    grammar = compile_grammar(model, GrammarSpec.json_schema(schema), model.eos_token_ids)
    dec = SpeculativeDecoder(
        model, source=SpeculationIndex(model.vocab_size), constraint=grammar, clock=None
    )
    dec.append(ids)
    if not forced:
        dec._forcing = None  # the tokens the grammar forces are not drafted
    return dec.generate(n, stop_ids=model.eos_token_ids)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=400)
    args = ap.parse_args()
    model = load_model(args.model, backend="llamacpp", n_threads=args.threads, n_ctx=8192)
    table = table_for(model)[0]
    print(f"{args.model}, {args.threads} threads, seed {args.seed}; cost table {table.summary()}")
    print(f"{'task':<26}{'tokens':>7}{'with':>8}{'without':>9}{'ratio':>7}  grammar drafts")
    ratios = []
    for task in tasks(args.seed, args.tasks):
        ids = model.tokenizer.apply_chat_template(task["body"]["messages"])
        on, off = (run(model, ids, task["schema"], f, args.max_tokens) for f in (True, False))
        if on.token_ids != off.token_ids:
            raise SystemExit(f"{task['name']}: the two runs differ; they must both be plain's")
        a, b = modeled(on.stats, table.cost), modeled(off.stats, table.cost)
        ratios.append(a / b)
        g = on.stats.members.get("grammar")
        forced = "-" if g is None else f"{g.verifies} verifies, {g.accepted}/{g.drafted} accepted"
        row = f"{task['name'][:25]:<26}{len(on.token_ids):>7}{a:>8.3f}{b:>9.3f}{a / b:>7.3f}"
        print(f"{row}  {forced}")
    print(
        f"modeled speedup over plain, with forced drafts over without: median "
        f"{statistics.median(ratios):.3f}, lowest {min(ratios):.3f}, highest {max(ratios):.3f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
