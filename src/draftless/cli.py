"""The `draftless` command line: generate, chat, probe, tokenize, bench, demo.

User mistakes (a missing model, a bad option, an unreadable reference) print one line,
`draftless: error: ...`, and exit 2; no traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from draftless.decoder import DecoderOptionsError, GenerationResult, SpecOptions, SpeculativeDecoder
from draftless.gate import GateOptionsError
from draftless.models.base import Model, ModelError, StreamDecoder
from draftless.models.registry import BACKENDS, DEFAULT_MODEL, load_model
from draftless.progress import Spinner
from draftless.sampling import OptionsError, SamplingOptions
from draftless.stops import TextStops, unescape

MAX_REFERENCES = 8
MAX_REFERENCE_BYTES = 4 * 1024 * 1024  # a reference file larger than this is refused


class UsageError(Exception):
    """A user mistake: printed as one line, exit status 2."""


USER_ERRORS = (UsageError, ModelError, OptionsError, GateOptionsError, DecoderOptionsError)


# -- shared options ------------------------------------------------------------------------
def add_model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        "-m",
        default=DEFAULT_MODEL,
        help=f"registry name (smollm2, gemma3-270m) or a path (default {DEFAULT_MODEL})",
    )
    p.add_argument(
        "--backend",
        choices=BACKENDS,
        default="auto",
        help="auto: llama.cpp for GGUF when installed, else transformers",
    )
    p.add_argument("--device", default=None, help="transformers device (cpu, cuda, cuda:1)")
    p.add_argument("--n-ctx", type=int, default=None, help="llama.cpp context size")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads for the model (llama.cpp default 1: with more, its "
        "attention rounds differently per batch shape and speculative output "
        "can differ from plain at near-ties; transformers default: torch's)",
    )


def add_sampling_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--temperature", type=float, default=0.0, help="<= 0: greedy (default)")
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--min-p", type=float, default=0.0)
    g.add_argument("--repeat-penalty", type=float, default=1.0)
    g.add_argument("--frequency-penalty", type=float, default=0.0)
    g.add_argument("--presence-penalty", type=float, default=0.0)
    g.add_argument("--penalty-last-n", type=int, default=64)
    g.add_argument("--seed", type=int, default=None)


def add_spec_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("speculation")
    g.add_argument("--spec", action="store_true", help="speculate (lossless)")
    g.add_argument("--max-draft", type=int, default=16, help="draft tokens per verify at most")
    g.add_argument(
        "--spec-ref",
        action="append",
        default=[],
        metavar="FILE",
        help=f"reference document to draft from (repeatable, up to {MAX_REFERENCES})",
    )
    g.add_argument("--no-gate", action="store_true", help="verify every draft (for measurement)")


def sampling_from(args: argparse.Namespace) -> SamplingOptions:
    return SamplingOptions(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        repeat_penalty=args.repeat_penalty,
        frequency_penalty=args.frequency_penalty,
        presence_penalty=args.presence_penalty,
        penalty_last_n=args.penalty_last_n,
        seed=args.seed,
    )


def open_model(args: argparse.Namespace, *, quiet: bool = False) -> Model:
    options: dict[str, Any] = {}
    if getattr(args, "device", None):
        options["device"] = args.device
    if getattr(args, "n_ctx", None):
        options["n_ctx"] = args.n_ctx
    threads = getattr(args, "threads", None)
    if threads is not None:
        if threads < 1:
            raise UsageError(f"--threads must be >= 1, got {threads}")
        options["n_threads"] = threads
    with Spinner(f"loading {args.model}", force=False) if not quiet else _null():
        return load_model(args.model, backend=args.backend, **options)


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def read_text_file(path: str, what: str) -> str:
    """A UTF-8 text file's contents; "-" reads standard input."""
    if path == "-":
        return _decode_text(sys.stdin.buffer.read(), f"{what} on standard input")
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{what} not found: {path}")
    size = p.stat().st_size
    if what == "reference" and size > MAX_REFERENCE_BYTES:
        raise UsageError(f"reference {path} is {size} bytes; the limit is {MAX_REFERENCE_BYTES}")
    return _decode_text(p.read_bytes(), f"{what} {path}")


def _decode_text(data: bytes, name: str) -> str:
    if b"\0" in data[:8192]:
        raise UsageError(f"{name} is binary, not text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UsageError(f"{name} is not UTF-8 text (byte {err.start})") from None


def load_references(model: Model, paths: Sequence[str]) -> list[list[int]]:
    if len(paths) > MAX_REFERENCES:
        raise UsageError(f"at most {MAX_REFERENCES} references, got {len(paths)}")
    return [model.tokenizer.encode(read_text_file(p, "reference")) for p in paths]


def make_source(model: Model, references: Sequence[Sequence[int]]) -> Any:
    from draftless.sources import SpeculationIndex

    index = SpeculationIndex(model.vocab_size)
    for ref in references:
        index.add_reference(ref)
    return index


def prompt_ids(model: Model, text: str, *, chat: bool, system: str | None) -> list[int]:
    if not text.strip():
        raise UsageError("the prompt is empty")
    if chat:
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": text}
        ]
        return model.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    return model.tokenizer.encode(text, add_special=True)


def spec_summary(result: GenerationResult, source: Any) -> str:
    s = result.stats
    line = (
        f"spec: steps={s.steps} committed={s.committed} ({s.tokens_per_step:.2f} tok/step) "
        f"drafted={s.drafted} accepted={s.accepted} ({100 * s.acceptance:.0f}% acc) "
        f"gate off={s.gate_off} on={s.gate_on} probes={s.gate_probes} shadow={s.shadow_checks}"
    )
    if source is not None and hasattr(source, "stats"):
        parts = [
            f"{st.name} {st.accepted}/{st.drafted}" + (" muted" if st.muted else "")
            for st in source.stats()
        ]
        line += " | sources: " + ", ".join(parts)
    return line


def stats_json(result: GenerationResult, source: Any) -> dict[str, Any]:
    s = result.stats
    out: dict[str, Any] = asdict(s)
    out.update(tokens_per_step=round(s.tokens_per_step, 4), acceptance=round(s.acceptance, 4))
    if source is not None and hasattr(source, "stats"):
        out["sources"] = [
            {"name": st.name, "accepted": st.accepted, "drafted": st.drafted, "muted": st.muted}
            for st in source.stats()
        ]
    return out


def add_stop_options(p: argparse.ArgumentParser, *, what: str, spec_safe: bool) -> None:
    how = "exact with --spec too" if spec_safe else "plain decoding only"
    p.add_argument(
        "--stop",
        action="append",
        default=[],
        metavar="TEXT",
        help=rf"text that ends {what}, left out of it (repeatable; {how}; \n \t understood)",
    )
    p.add_argument(
        "--stop-id",
        action="append",
        type=int,
        default=[],
        metavar="ID",
        help=f"token id that ends {what} (repeatable; exact with --spec)",
    )


def stop_ids_from(ids: Sequence[int], vocab_size: int) -> list[int]:
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise UsageError(f"--stop-id {bad[0]} is not a token id of this model [0, {vocab_size})")
    return list(ids)


@dataclass
class TextRun:
    token_ids: list[int]  # up to the token that ended the run (a stop id, or the one
    #                       that completed a stop sequence), included
    text: str  # stop ids and a stop sequence (and what follows it) left out
    stop_reason: str  # "stop", "stop_sequence" or "length"
    seconds: float


def generate_text(
    dec: SpeculativeDecoder,
    max_new_tokens: int,
    stop_ids: frozenset[int],
    stop_sequences: Sequence[str] = (),
    emit: Callable[[str], None] | None = None,
) -> TextRun:
    """Decode, detokenize and stop at a stop id or a text stop sequence; `emit` gets the text
    as it becomes safe to show (never the start of a stop sequence).

    Text stops are checked token by token, so the run ends at the token where plain decoding
    ends, also when a verify accepted tokens past it: those are left out of the output. (The
    RNG drew for them: harmless in a run that ends here; a chat, which goes on, refuses text
    stops with speculation for that reason.)
    """
    detok = StreamDecoder(dec.model.tokenizer, skip_special=True)
    stops = TextStops(stop_sequences)
    out: list[int] = []
    reason = "length"
    t0 = time.perf_counter()

    def show(piece: str) -> None:
        if piece and emit is not None:
            emit(piece)

    for chunk in dec.stream(max_new_tokens, stop_ids):
        for t in chunk:
            out.append(t)
            if t in stop_ids:
                reason = "stop"
                break
            show(stops.push(detok.push(t)))
            if stops.cut is not None:
                reason = "stop_sequence"
                break
        if reason != "length":
            break
    if stops.cut is None:
        show(stops.push(detok.flush()))
        if stops.cut is not None:
            reason = "stop_sequence"
        show(stops.finish())
    return TextRun(out, stops.text, reason, time.perf_counter() - t0)


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


# -- generate ------------------------------------------------------------------------------
def cmd_generate(args: argparse.Namespace) -> int:
    if args.max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if (args.prompt is None) == (args.prompt_file is None):
        raise UsageError("give exactly one of --prompt or --prompt-file")
    what = "prompt" if args.prompt_file == "-" else "prompt file"
    text = args.prompt if args.prompt is not None else read_text_file(args.prompt_file, what)
    if not text.strip():
        raise UsageError("the prompt is empty")
    sampling = sampling_from(args)
    spec = SpecOptions(max_draft=args.max_draft, gate=not args.no_gate)
    if args.spec_ref and not args.spec:
        raise UsageError("--spec-ref needs --spec")
    if len(args.spec_ref) > MAX_REFERENCES:
        raise UsageError(f"at most {MAX_REFERENCES} references, got {len(args.spec_ref)}")
    sequences = [unescape(t) for t in args.stop]
    if any(not t for t in sequences):
        raise UsageError("--stop needs non-empty text")
    model = open_model(args)
    stops = model.eos_token_ids | frozenset(stop_ids_from(args.stop_id, model.vocab_size))
    ids = prompt_ids(model, text, chat=args.chat, system=args.system)
    source = make_source(model, load_references(model, args.spec_ref)) if args.spec else None
    from draftless.probe import cost_table_for

    table, _origin = cost_table_for(model)
    dec = SpeculativeDecoder(
        model, sampling=sampling, source=source, options=spec, cost_table=table
    )
    dec.append(ids)
    emit = None if args.json else _write
    run = generate_text(dec, args.max_new_tokens, stops, sequences, emit)
    if emit is not None:
        _write("\n")
    out, seconds = run.token_ids, run.seconds
    result = GenerationResult(out, run.stop_reason, seconds, dec.stats, dec.seed)
    if args.json:
        payload: dict[str, Any] = {
            "text": run.text,
            "token_ids": out,
            "prompt_tokens": len(ids),
            "new_tokens": len(out),
            "seconds": round(seconds, 4),
            "tokens_per_second": round(len(out) / seconds, 3) if seconds > 0 else None,
            "stop_reason": result.stop_reason,
            "seed": result.seed,
            "model": model.name,
            "backend": model.backend,
        }
        if args.spec:
            payload["spec"] = stats_json(result, source)
        print(json.dumps(payload, ensure_ascii=False))
    else:
        rate = len(out) / seconds if seconds > 0 else float("nan")
        print(f"{len(out)} tokens in {seconds:.2f} s ({rate:.1f} tok/s)", file=sys.stderr)
        if args.spec:
            print(spec_summary(result, source), file=sys.stderr)
    model.close()
    return 0


# -- probe ---------------------------------------------------------------------------------
def cmd_probe(args: argparse.Namespace) -> int:
    from draftless.probe import PROBE_KS, measure, store

    if args.reps < 1:
        raise UsageError("--reps must be >= 1")
    model = open_model(args)
    with Spinner("measuring verify costs"):
        result = measure(model, ks=PROBE_KS, reps=args.reps, context=args.context)
    print(
        f"verify cost C(k) of {model.name} on {model.backend} "
        f"(plain step {1000 * result.plain_seconds:.2f} ms at {result.context} tokens of context)"
    )
    print("k\tC(k) plain steps\tbreak-even acceptance ~C(k)/k")
    for k, c in zip(result.table.ks, result.table.costs, strict=True):
        print(f"{k}\t{c:.2f}\t{min(1.0, c / k):.0%}" if k > 1 else f"{k}\t{c:.2f}\t-")
    if not args.no_store:
        path = store(model, result)
        print(f"stored in {path}; the decoder uses it by default for this model and backend")
    model.close()
    return 0


# -- demo ----------------------------------------------------------------------------------
DEMO_PASSAGE = (
    "The Rhine rises in the Swiss Alps and flows for about 1,230 kilometres through "
    "Switzerland, Liechtenstein, Austria, Germany, France and the Netherlands before it "
    "empties into the North Sea. For centuries it has been one of the most important "
    "waterways in Europe, carrying coal, grain and timber between the industrial heartlands "
    "and the sea ports of Rotterdam and Antwerp. Castles line its middle valley, and the "
    "steep vineyards on its banks produce some of the best known white wines in the world."
)


def cmd_demo(args: argparse.Namespace) -> int:
    """Plain vs speculative on a copy task, on every installed backend (or --backend)."""
    from draftless.models.registry import hf_available, llamacpp_available

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
    from draftless.decoder import generate
    from draftless.probe import cost_table_for

    t0 = time.perf_counter()
    model = open_model(args)
    load = time.perf_counter() - t0
    table, origin = cost_table_for(model)
    ids = prompt_ids(model, text, chat=False, system=None)
    spec = SpecOptions(max_draft=args.max_draft)
    generate(model, ids, 8)  # warm-up
    runs: dict[str, list[GenerationResult]] = {"plain": [], "spec": []}
    source = None
    for _ in range(args.reps):  # alternate, so drift hits both alike
        runs["plain"].append(generate(model, ids, args.max_new_tokens, cost_table=table))
        source = make_source(model, [])
        runs["spec"].append(
            generate(model, ids, args.max_new_tokens, source=source, options=spec, cost_table=table)
        )
    plain, last = runs["plain"][-1], runs["spec"][-1]
    identical = all(r.token_ids == plain.token_ids for r in runs["plain"] + runs["spec"])

    def median(results: list[GenerationResult]) -> float:
        return sorted(r.seconds for r in results)[len(results) // 2]

    tp, ts = median(runs["plain"]), median(runs["spec"])
    n = len(plain.token_ids)
    shown = [t for t in last.token_ids if t not in model.eos_token_ids]
    print(
        f"\n== {model.name} on {model.backend} (loaded in {load:.1f} s; "
        f"verify-cost table: {origin}, C(16) = {table.cost(16):.1f} plain steps)"
    )
    print(model.tokenizer.decode(shown, skip_special=True).strip())
    print(spec_summary(last, source))
    print(
        f"plain {n} tokens in {tp:.2f} s ({n / tp:.1f} tok/s); "
        f"speculative {ts:.2f} s ({n / ts:.1f} tok/s): speedup {tp / ts:.2f}x; "
        f"identical to plain: {'yes' if identical else 'NO'}",
        flush=True,
    )
    model.close()
    return identical


# -- entry point ---------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="draftless",
        description="Lossless speculative decoding with no draft model and no training.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="generate text (plain, or --spec to speculate)")
    add_model_options(g)
    g.add_argument("--prompt", "-p")
    g.add_argument("--prompt-file", help="read the prompt from this file (-: standard input)")
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    g.add_argument("--system", help="system message (with --chat)")
    g.add_argument("--max-new-tokens", "-n", type=int, default=128)
    g.add_argument("--json", action="store_true", help="print one JSON object")
    add_stop_options(g, what="the output", spec_safe=True)
    add_sampling_options(g)
    add_spec_options(g)
    g.set_defaults(func=cmd_generate)

    p = sub.add_parser("probe", help="measure this model's verify costs C(k) and store them")
    add_model_options(p)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--no-store", action="store_true")
    p.set_defaults(func=cmd_probe)

    d = sub.add_parser("demo", help="speculative vs plain on a copy task, on the default model")
    add_model_options(d)
    d.add_argument("--max-new-tokens", "-n", type=int, default=200)
    d.add_argument("--max-draft", type=int, default=16)
    d.add_argument("--reps", type=int, default=3)
    d.set_defaults(func=cmd_demo)

    _add_optional_commands(sub)
    return parser


def _add_optional_commands(sub: Any) -> None:
    """Subcommands whose modules register themselves (chat, tokenize, bench)."""
    for module_name in ("draftless.repl", "draftless.tokenize_cli", "draftless.bench.cli"):
        try:
            module = __import__(module_name, fromlist=["register"])
        except ModuleNotFoundError as err:
            if err.name is None or not module_name.startswith(err.name):
                raise  # a missing dependency inside the module, not the module itself
            continue
        module.register(sub)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except USER_ERRORS as err:
        print(f"draftless: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("draftless: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
