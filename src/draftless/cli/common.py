"""What every subcommand shares: the option groups, reading text and models, the checks.

User mistakes raise `UsageError` (or any `UserError`); `cli.main` prints them as one line,
`draftless: error: ...`, and exits 2.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from draftless.decoder import SpecOptions
from draftless.errors import UsageError
from draftless.models.base import Model
from draftless.models.registry import BACKENDS, DEFAULT_MODEL, REGISTRY, load_model
from draftless.progress import Spinner
from draftless.sampling import SamplingOptions
from draftless.sources.cascade import CascadeOptions, SpeculationIndex
from draftless.text import unescape

MAX_REFERENCES = CascadeOptions().max_references
MAX_REFERENCE_BYTES = 4 * 1024 * 1024  # a reference file larger than this is refused
MAX_DRAFT = SpecOptions().max_draft
# --dtype's choices: what the transformers backend computes in (float64 is the tests' exact one)
DTYPES = ("float32", "bfloat16", "float16", "float64")

__all__ = ["MAX_REFERENCES", "MAX_REFERENCE_BYTES", "UsageError"]


# -- option groups ---------------------------------------------------------------------------
def add_model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        "-m",
        default=DEFAULT_MODEL,
        help=f"registry name ({', '.join(REGISTRY)}) or a path (default {DEFAULT_MODEL})",
    )
    p.add_argument(
        "--backend",
        choices=BACKENDS,
        default="auto",
        help="auto: llama.cpp for GGUF when installed, else transformers",
    )
    p.add_argument("--device", default=None, help="transformers device (cpu, cuda, cuda:1)")
    add_dtype_option(p)
    p.add_argument("--n-ctx", type=int, default=None, help="context size in tokens")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads for the model (default: the backend's; at most the cores)",
    )


def add_dtype_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dtype",
        choices=DTYPES,
        default=None,
        help="transformers weights and compute (default float32 on CPU, bfloat16 on CUDA; "
        "llama.cpp runs a GGUF in its own types)",
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
    g.add_argument(
        "--max-draft", type=int, default=MAX_DRAFT, help="draft tokens per verify at most"
    )
    g.add_argument(
        "--spec-ref",
        action="append",
        default=[],
        metavar="FILE",
        help=f"reference document to draft from (repeatable, up to {MAX_REFERENCES})",
    )
    g.add_argument("--no-gate", action="store_true", help="verify every draft (for measurement)")
    add_no_edits_option(g)


def add_no_edits_option(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    p.add_argument(
        "--no-edits",
        action="store_true",
        help="do not carry edits learned from the stream (renames) into drafts",
    )


def add_stop_options(p: argparse.ArgumentParser, *, what: str) -> None:
    p.add_argument(
        "--stop",
        action="append",
        default=[],
        metavar="TEXT",
        help=rf"text that ends {what}, left out of it (repeatable; exact with --spec; \n \t "
        "understood)",
    )
    p.add_argument(
        "--stop-id",
        action="append",
        type=int,
        default=[],
        metavar="ID",
        help=f"token id that ends {what} (repeatable; exact with --spec)",
    )


# -- options -> objects ----------------------------------------------------------------------
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


def spec_from(args: argparse.Namespace) -> SpecOptions:
    """SpecOptions from the speculation group, after the checks both generate and chat need."""
    if args.spec_ref and not args.spec:
        raise UsageError("--spec-ref needs --spec")
    if args.no_edits and not args.spec:
        raise UsageError("--no-edits needs --spec")
    if len(args.spec_ref) > MAX_REFERENCES:
        raise UsageError(f"at most {MAX_REFERENCES} references, got {len(args.spec_ref)}")
    if args.max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    return SpecOptions(max_draft=args.max_draft, gate=not args.no_gate)


def stop_texts(args: argparse.Namespace) -> list[str]:
    sequences = [unescape(checked_text(t, "--stop")) for t in args.stop]
    if any(not t for t in sequences):
        raise UsageError("--stop needs non-empty text")
    return sequences


def stop_ids_from(ids: Sequence[int], vocab_size: int) -> list[int]:
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise UsageError(f"--stop-id {bad[0]} is not a token id of this model [0, {vocab_size})")
    return list(ids)


def load_with_notes(args: argparse.Namespace, *, quiet: bool = False) -> tuple[Model, list[str]]:
    """The model the options ask for, and the notes its backend made while loading (what
    was asked for is not what is used: a context raised, threads capped). A command prints
    the notes with `print_notes` once the checks that need the model have passed, so a user
    error stays one line."""
    options: dict[str, Any] = {}
    if args.device:
        options["device"] = args.device
    if args.dtype:
        options["dtype"] = args.dtype
    if args.n_ctx is not None:
        if args.n_ctx < 1:
            raise UsageError(f"--n-ctx must be >= 1, got {args.n_ctx}")
        options["n_ctx"] = args.n_ctx
    if args.threads is not None:
        if args.threads < 1:
            raise UsageError(f"--threads must be >= 1, got {args.threads}")
        options["n_threads"] = args.threads
    spinner = Spinner(f"loading {args.model}", force=False) if not quiet else None
    with warnings.catch_warnings(record=True) as caught, spinner or contextlib.nullcontext():
        warnings.simplefilter("always", UserWarning)
        model = load_model(args.model, backend=args.backend, **options)
    notes = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    for w in caught:  # anything else goes where it would have gone
        if not issubclass(w.category, UserWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    settle_heap()
    return model, notes


def settle_heap() -> None:
    """Collect once, then leave every object alive now (the modules, the loaded model) out
    of the garbage collector's passes. A full pass over a loaded process visits each of them:
    ~70 ms with SmolLM2 on llama.cpp, at whatever step it falls, 3-5% of a short answer's
    decode (the decoder's own objects set it off; docs/bench/avx2/s32/step-tail.txt). After
    this a pass visits what was made since. Frozen objects are still freed when nothing
    refers to them; only cycles among them stay."""
    gc.collect()
    gc.freeze()


def print_notes(notes: Sequence[str]) -> None:
    for note in notes:
        print(f"draftless: note: {note}", file=sys.stderr)


def open_model(args: argparse.Namespace, *, quiet: bool = False) -> Model:
    """`load_with_notes`, printing the notes now."""
    model, notes = load_with_notes(args, quiet=quiet)
    print_notes(notes)
    return model


def edits_summary(source: object) -> str | None:
    """One line of the edit learner's counts, or None without the learner."""
    stats = source.edit_stats() if isinstance(source, SpeculationIndex) else None
    if stats is None:
        return None
    return "edits: learned {learned}, in use {in_use}, held {held}, broken {broken}".format(**stats)


def make_source(model: Model, paths: Sequence[str], *, edits: bool = True) -> SpeculationIndex:
    """The cascade over the conversation and the reference files at `paths`."""
    if len(paths) > MAX_REFERENCES:
        raise UsageError(f"at most {MAX_REFERENCES} references, got {len(paths)}")
    refs = [model.tokenizer.encode(read_text_file(p, "reference")) for p in paths]
    return SpeculationIndex(model.vocab_size, references=refs, edits=edits)


# -- text from the user ----------------------------------------------------------------------
def checked_text(text: str, what: str) -> str:
    """`text` from the command line, refused if it is not UTF-8 (Python keeps undecodable
    argument bytes as lone surrogates, which no tokenizer can encode)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raw = os.fsencode(text)
        raise UsageError(
            f"{what} is not UTF-8 text (byte 0x{raw[err.start]:02x} at position {err.start})"
        ) from None
    return text


def read_text_file(path: str, what: str) -> str:
    """A UTF-8 text file's contents; "-" reads standard input. A path that is not a regular
    file but can be read (a shell's `<(...)` pipe, /dev/stdin) is read as a stream."""
    if path == "-":
        return _decode_text(sys.stdin.buffer.read(), f"{what} on standard input")
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{what} {path} is a directory, not a file")
    if not p.exists():
        raise UsageError(f"{what} not found: {path}")
    limit = MAX_REFERENCE_BYTES if what == "reference" else None
    if limit is not None and p.is_file() and (size := p.stat().st_size) > limit:
        raise UsageError(f"reference {path} is {size} bytes; the limit is {limit}")
    try:
        with p.open("rb") as f:
            data = f.read() if limit is None else f.read(limit + 1)  # a stream has no size
    except OSError as err:
        raise UsageError(f"cannot read {what} {path}: {err.strerror}") from None
    if limit is not None and len(data) > limit:
        raise UsageError(f"reference {path} is more than {limit} bytes; the limit is {limit}")
    return _decode_text(data, f"{what} {path}")


def _decode_text(data: bytes, name: str) -> str:
    if b"\0" in data[:8192]:
        raise UsageError(f"{name} is binary, not text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UsageError(f"{name} is not UTF-8 text (byte {err.start})") from None


def write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()
