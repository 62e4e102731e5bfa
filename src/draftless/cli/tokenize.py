"""`draftless tokenize`: token ids of a text file, one per line; `--compare` is the parity oracle.

    draftless tokenize --model smollm2 notes.md            # 19556\\n905\\n...
    draftless tokenize --model smollm2 notes.md --compare  # identical: 1234 tokens

Reference documents only help speculation if they are encoded exactly as the model encodes
its stream (a pre-tokenizer bug once gave 625 tokens where llama.cpp gave
500, and acceptance fell to zero). The ids printed are what `Conversation.add_reference_text`
and `generate --spec-ref` use: the text encoded with the model's own tokenizer, without BOS
(`--add-special` adds what the model puts first, as a prompt gets). Only the vocabulary is
loaded, never the weights.

`--compare` (GGUF files, both backends installed) encodes the text with llama.cpp's
tokenizer and with the tokenizer transformers converts from the same GGUF, and prints either
`identical: N tokens` (exit 0) or the first position where they differ, with both ids, their
pieces and the text around it (exit 1). Loading a GGUF tokenizer into transformers takes a
while; when the hf backend has already converted this GGUF (its conversion cache), the
tokenizer saved there is used.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from draftless.cli.common import UsageError, read_text_file
from draftless.models.base import ModelSpec
from draftless.models.registry import (
    BACKENDS,
    DEFAULT_MODEL,
    hf_available,
    llamacpp_available,
    pick_backend,
    resolve,
)
from draftless.progress import Spinner

CONTEXT_TOKENS = 4  # pieces shown on each side of a mismatch
CONTEXT_CHARS = 40  # characters of text shown on each side of a mismatch


class _Encoder(Protocol):
    def encode(self, text: str, *, add_special: bool = False) -> list[int]: ...

    def decode(self, token_ids: Sequence[int], *, skip_special: bool = False) -> str: ...


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "tokenize",
        help="print the token ids of a text file, one per line (--compare: the parity oracle)",
    )
    p.add_argument("file", metavar="FILE", help="a UTF-8 text file, or - for stdin")
    p.add_argument(
        "--model",
        "-m",
        default=DEFAULT_MODEL,
        help=f"registry name or a path to a GGUF file or model directory (default {DEFAULT_MODEL})",
    )
    p.add_argument(
        "--backend",
        choices=BACKENDS,
        default="auto",
        help="whose tokenizer: llama.cpp (GGUF) or transformers (default: auto)",
    )
    p.add_argument(
        "--add-special",
        action="store_true",
        help="add what the model puts first (BOS), as a prompt gets",
    )
    p.add_argument(
        "--compare",
        action="store_true",
        help="GGUF only: compare transformers' tokenizer with llama.cpp's and "
        "report the first mismatch (exit 1)",
    )
    p.set_defaults(func=cmd_tokenize)


def cmd_tokenize(args: argparse.Namespace) -> int:
    text = read_text_file(args.file, "file")
    spec = resolve(args.model)
    if args.compare:
        return _compare_backends(spec, text, add_special=args.add_special)
    backend = pick_backend(spec, args.backend)
    tokenizer = _load(spec, backend)
    try:
        ids = tokenizer.encode(text, add_special=args.add_special)
    finally:
        _close(tokenizer)
    if ids:
        sys.stdout.write("\n".join(str(t) for t in ids) + "\n")
    return 0


# -- loading tokenizers (the vocabulary only) ----------------------------------------------
def _load(spec: ModelSpec, backend: str) -> _Encoder:
    if backend == "llamacpp":
        return _llamacpp_tokenizer(spec)
    return _hf_tokenizer(spec)


def _llamacpp_tokenizer(spec: ModelSpec) -> _Encoder:
    from draftless.models.llamacpp import LlamaCppModel

    with Spinner(f"loading the vocabulary of {spec.name}"):
        return LlamaCppModel.tokenizer_only(spec.path)


def _hf_tokenizer(spec: ModelSpec) -> _Encoder:
    with Spinner(f"loading transformers' tokenizer for {spec.name}"):
        from draftless.models.hf import HFModel

        return HFModel.tokenizer_only(spec)


def _close(tokenizer: object) -> None:
    close = getattr(tokenizer, "close", None)
    if close is not None:
        close()


# -- the parity oracle ---------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Comparison:
    identical: bool
    left: list[int]
    right: list[int]
    position: int  # first differing position (== len of both when identical)
    report: str  # what `--compare` prints


def compare(
    text: str,
    left: _Encoder,
    right: _Encoder,
    *,
    names: tuple[str, str] = ("llama.cpp", "transformers"),
    add_special: bool = False,
) -> Comparison:
    """Encode `text` with both tokenizers; locate the first mismatch and describe it.

    Example: left [10, 11, 12], right [10, 13] -> position 1, both ids, their pieces and the
    text around the character where token 1 starts (according to the left tokenizer).
    """
    a = list(left.encode(text, add_special=add_special))
    b = list(right.encode(text, add_special=add_special))
    i = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        i += 1
    if a == b:
        return Comparison(True, a, b, len(a), f"identical: {len(a)} tokens")
    width = max(len(n) for n in names)
    offset = len(left.decode(a[:i]))
    lines = [
        f"mismatch at token {i}: {names[0]} has {len(a)} tokens, {names[1]} has {len(b)}",
    ]
    for name, ids, tok in ((names[0], a, left), (names[1], b, right)):
        here = f"id {ids[i]} {tok.decode([ids[i]])!r}" if i < len(ids) else "(no more tokens)"
        before = " ".join(repr(tok.decode([t])) for t in ids[max(0, i - CONTEXT_TOKENS) : i])
        after = " ".join(repr(tok.decode([t])) for t in ids[i + 1 : i + 1 + CONTEXT_TOKENS])
        lines.append(f"  {name:<{width}}  {here}   [... {before} | >{here}< | {after} ...]")
    lo, hi = max(0, offset - CONTEXT_CHARS), offset + CONTEXT_CHARS
    lines.append(f"  text at character {offset}: {text[lo:offset]!r} | {text[offset:hi]!r}")
    return Comparison(False, a, b, i, "\n".join(lines))


def _compare_backends(spec: ModelSpec, text: str, *, add_special: bool) -> int:
    if not spec.is_gguf:
        raise UsageError(f"--compare needs a GGUF model; {spec.name} is a model directory")
    missing = [
        what
        for what, ok in (
            ("llama-cpp-python", llamacpp_available()),
            ("torch and transformers", hf_available()),
            ("gguf", importlib.util.find_spec("gguf") is not None),
        )
        if not ok
    ]
    if missing:
        raise UsageError(
            f"--compare needs both backends; install {', '.join(missing)} "
            "(pip install 'draftless[llamacpp,hf]')"
        )
    llama = _llamacpp_tokenizer(spec)
    try:
        hf = _hf_tokenizer(spec)
        result = compare(text, llama, hf, add_special=add_special)
    finally:
        _close(llama)
    print(result.report)
    return 0 if result.identical else 1


__all__ = ["Comparison", "cmd_tokenize", "compare", "register"]
