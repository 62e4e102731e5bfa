"""`draftless generate`: one generation, plain or speculative, as text or one JSON object.

`--json-schema FILE`, `--json-object` and `--grammar FILE` hold the output to a JSON schema,
any JSON object or a grammar (draftless.grammar), plain and speculative alike.

Reaching the end of the context ends the run (stop reason "context", a note on stderr); the
output and the statistics are printed as usual.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from draftless.cli.common import (
    UsageError,
    add_model_options,
    add_sampling_options,
    add_spec_options,
    add_stop_options,
    checked_text,
    edits_summary,
    load_with_notes,
    make_source,
    print_notes,
    read_text_file,
    sampling_from,
    spec_from,
    stop_ids_from,
    stop_texts,
    write,
)
from draftless.decoder import SpeculativeDecoder
from draftless.grammar import GrammarSpec, compile_grammar
from draftless.logprobs import MAX_TOP, LogprobRecorder
from draftless.text import encode_prompt, generate_text


def register(subparsers: Any) -> None:
    g = subparsers.add_parser("generate", help="generate text (plain, or --spec to speculate)")
    add_model_options(g)
    g.add_argument("--prompt", "-p")
    g.add_argument("--prompt-file", help="read the prompt from this file (-: standard input)")
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    g.add_argument("--system", help="system message (with --chat)")
    g.add_argument("--max-new-tokens", "-n", type=int, default=128)
    g.add_argument("--json", action="store_true", help="print one JSON object")
    g.add_argument(
        "--logprobs",
        type=int,
        metavar="N",
        help="with --json: each new token's log probability and the N likeliest alternatives "
        f"(0-{MAX_TOP}; the model's raw distribution, the same with --spec as without)",
    )
    held = g.add_mutually_exclusive_group()
    held.add_argument(
        "--json-schema",
        metavar="FILE",
        help="hold the output to the JSON schema in FILE (-: standard input)",
    )
    held.add_argument("--json-object", action="store_true", help="hold the output to a JSON object")
    held.add_argument(
        "--grammar", metavar="FILE", help="hold the output to the grammar in FILE (GBNF or Lark)"
    )
    add_stop_options(g, what="the output")
    add_sampling_options(g)
    add_spec_options(g)
    g.set_defaults(func=cmd_generate)


def grammar_spec(args: argparse.Namespace) -> GrammarSpec | None:
    """What --json-schema, --json-object or --grammar hold the output to (None: nothing)."""
    if args.prompt_file == "-" and "-" in (args.json_schema, args.grammar):
        raise UsageError("the prompt and the schema (or grammar) cannot both be standard input")
    if args.json_object:
        return GrammarSpec.json_object()
    if args.json_schema is not None:
        what = "JSON schema" if args.json_schema == "-" else "JSON schema file"
        return GrammarSpec.json_schema(read_text_file(args.json_schema, what))
    if args.grammar is not None:
        what = "grammar" if args.grammar == "-" else "grammar file"
        return GrammarSpec("grammar", read_text_file(args.grammar, what))
    return None


def cmd_generate(args: argparse.Namespace) -> int:
    if (args.prompt is None) == (args.prompt_file is None):
        raise UsageError("give exactly one of --prompt or --prompt-file")
    spec = spec_from(args)
    if args.prompt is not None:
        text = checked_text(args.prompt, "--prompt")
    else:
        what = "prompt" if args.prompt_file == "-" else "prompt file"
        text = read_text_file(args.prompt_file, what)
    if not text.strip():
        raise UsageError("the prompt is empty")
    if args.logprobs is not None and not (args.json and 0 <= args.logprobs <= MAX_TOP):
        raise UsageError(f"--logprobs needs --json and a count in [0, {MAX_TOP}]")
    system = checked_text(args.system, "--system") if args.system is not None else None
    held = grammar_spec(args)
    sampling = sampling_from(args)
    sequences = stop_texts(args)
    model, notes = load_with_notes(args)
    try:
        stops = model.eos_token_ids | frozenset(stop_ids_from(args.stop_id, model.vocab_size))
        ids = encode_prompt(model, text, chat=args.chat, system=system)
        constraint = None if held is None else compile_grammar(model, held, stops)
        source = make_source(model, args.spec_ref, edits=not args.no_edits) if args.spec else None
        dec = SpeculativeDecoder(
            model, sampling=sampling, source=source, options=spec, constraint=constraint
        )
        dec.append(ids)
        recorder = None if args.logprobs is None else LogprobRecorder(dec, args.logprobs)
        print_notes(notes)  # the checks that needed the model passed
        emit = None if args.json else write
        run = generate_text(dec, args.max_new_tokens, stops, sequences, emit)
        if emit is not None:
            write("\n")
        out, seconds = run.token_ids, run.seconds
        if run.stop_reason == "context":
            print(
                f"draftless: note: the context ({model.n_ctx} tokens) is full; "
                f"the output ends there ({len(out)} new tokens)",
                file=sys.stderr,
            )
        if args.json:
            payload: dict[str, Any] = {
                "text": run.text,
                "token_ids": out,
                "prompt_tokens": len(ids),
                "new_tokens": len(out),
                "seconds": round(seconds, 4),
                "tokens_per_second": round(len(out) / seconds, 3) if seconds > 0 else None,
                "stop_reason": run.stop_reason,
                "seed": dec.seed,
                "model": model.name,
                "backend": model.backend,
                "n_ctx": model.n_ctx,
                "threads": model.threads,
                "dtype": getattr(model, "dtype", None),  # transformers'; None on llama.cpp
            }
            if source is not None:
                payload["spec"] = dec.stats.to_json()
                payload["spec"]["edits"] = source.edit_stats()
            if recorder is not None:
                piece = model.tokenizer.decode
                payload["logprobs"] = [
                    {
                        "token_id": e.token_id,
                        "token": piece([e.token_id]),
                        "logprob": e.logprob,
                        "top": [[i, piece([i]), lp] for i, lp in e.top],
                    }
                    for e in recorder.entries(len(ids), len(ids) + len(out))
                ]
            print(json.dumps(payload, ensure_ascii=False))
        else:
            rate = len(out) / seconds if seconds > 0 else float("nan")
            print(f"{len(out)} tokens in {seconds:.2f} s ({rate:.1f} tok/s)", file=sys.stderr)
            if args.spec:
                print(dec.stats.summary(), file=sys.stderr)
                line = edits_summary(source)
                if line is not None:
                    print(line, file=sys.stderr)
    finally:
        model.close()
    return 0
