"""What a grammar costs per step, and what it forces: over stored answers of the structured
benchmark, replayed token by token through `draftless.grammar` (no forward is run).

    PYTHONPATH=src python benchmarks/grammar_mask.py --model qwen2.5-coder-1.5b \\
        docs/bench/structured/q15-seed0.json

Reports the time to read the vocabulary into llguidance (once per model and stop set), the
time of one mask (`Grammar.allowed`) at every position of every answer (median, 90th
percentile, max), and the tokens llguidance's fast-forward says the grammar forces at each
position: how many in all, how many the answer then wrote, and the longest forced run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from structured import CODE_SCHEMA, PROSE_SCHEMA

from draftless.grammar import GrammarSpec, compile_grammar
from draftless.models.registry import load_model


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("rows", type=Path, help="a structured.py --json file")
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--server", default="draftless-plain", help="whose answers to replay")
    args = ap.parse_args()
    model = load_model(args.model, backend="llamacpp", n_ctx=256)
    stops = model.eos_token_ids
    t0 = time.perf_counter()
    compile_grammar(model, GrammarSpec.json_object(), stops)  # reads the vocabulary once
    build = time.perf_counter() - t0
    masks: list[float] = []
    offered = matched = longest = answers = tokens = 0
    for row in json.loads(args.rows.read_text())["rows"][args.server]:
        schema = CODE_SCHEMA if row["task"].startswith("code:") else PROSE_SCHEMA
        grammar = compile_grammar(model, GrammarSpec.json_schema(schema), stops)
        ids = model.tokenizer.encode(row["text"])
        answers, tokens = answers + 1, tokens + len(ids)
        for i, token in enumerate(ids):
            t = time.perf_counter()
            grammar.allowed()
            masks.append(time.perf_counter() - t)
            forced = grammar.forced()
            offered += len(forced)
            longest = max(longest, len(forced))
            n = 0
            while n < len(forced) and i + n < len(ids) and ids[i + n] == forced[n]:
                n += 1
            matched += n
            grammar.consume(token)
    us = sorted(m * 1e6 for m in masks)
    print(f"{args.model}, vocabulary {model.vocab_size:,}: read into llguidance in {build:.2f} s")
    print(
        f"one mask over {len(us):,} positions of {answers} answers ({args.rows}): median "
        f"{statistics.median(us):.0f} us, 90th percentile {us[int(0.9 * (len(us) - 1))]:.0f} "
        f"us, max {us[-1]:.0f} us"
    )
    print(
        f"forced tokens offered at those positions: {offered} (the answers then wrote {matched} "
        f"of them), longest forced run {longest} tokens, over {tokens} answer tokens"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
