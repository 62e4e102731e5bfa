"""Grammars over a model's vocabulary: JSON schemas, any JSON object, Lark, regular
expressions, through llguidance (imported here, on first use).

    spec = GrammarSpec.json_schema({"type": "object", ...})
    grammar = compile_grammar(model, spec, stop_ids)     # a `constraint.Constraint`
    generate(model, prompt, n, source=..., constraint=grammar)

llguidance (the engine behind guidance, and one of vLLM's and SGLang's structured-output
backends) keeps an Earley parser over the grammar and computes, per step, the bitmask of the
tokens that can come next (median 11-19 us, 90th percentile 48-64 us over the structured
benchmark's answers on SmolLM2's 49k and Qwen's 152k vocabularies:
docs/bench/structured/grammar-mask.txt, benchmarks/grammar_mask.py); it rolls back, and
checks a run of tokens without consuming them, which is what a speculative decoder needs
(`constraint.py`). Once the grammar is complete it allows only the stop ids, so a constrained
run ends there. A schema or grammar it cannot compile is a `GrammarError` naming what is wrong.

The vocabulary it reads is the model's own: llama.cpp's token pieces (control tokens marked as
special, so no grammar can write them as text) or a transformers fast tokenizer. Building it
takes 0.28 s for SmolLM2's 49k tokens and 0.97 s for Qwen's 152k (the same file), so it is
kept per tokenizer and stop set.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from draftless.errors import UserError
from draftless.models.base import Model

# kind -> its name in messages; "grammar": Lark or llama.cpp's GBNF, told apart by llguidance
# (llama-server's `grammar`)
NAMES = {
    "json_schema": "JSON schema",
    "json_object": "JSON object grammar",
    "grammar": "grammar",
    "lark": "Lark grammar",
    "regex": "regular expression",
}
KINDS = tuple(NAMES)


# Whitespace between JSON tokens under a schema: at most one line break, then indentation, as
# llama.cpp's schema grammars bound it. Unbounded, a model that would end its turn before the
# object is closed is held to writing whitespace until the token limit (the 1.5B did on 4 of
# 10 agentic tool calls: docs/bench/agentic/s29-auto-grammar-ab.txt).
JSON_SPACE = r"[ \t]{0,8}(\r?\n[ \t]{0,40})?"


def bounded_space(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` with JSON_SPACE for its whitespace, unless it sets llguidance's own options."""
    if "x-guidance" in schema:
        return schema
    return {**schema, "x-guidance": {"whitespace_pattern": JSON_SPACE}}


class GrammarError(UserError, ValueError):
    """A grammar or JSON schema that cannot be compiled; the message says why."""


@dataclass(frozen=True, slots=True)
class GrammarSpec:
    kind: str  # one of KINDS
    text: str = ""  # the schema as JSON, the grammar, the regex ("" for json_object)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise GrammarError(f"grammar kind must be one of {', '.join(KINDS)}, got {self.kind!r}")

    @classmethod
    def json_schema(cls, schema: dict[str, Any] | str | bool) -> GrammarSpec:
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as err:
                raise GrammarError(f"the JSON schema is not JSON: {err}") from None
        if not isinstance(schema, dict | bool):
            raise GrammarError(f"a JSON schema is an object, got {type(schema).__name__}")
        return cls("json_schema", json.dumps(schema))

    @classmethod
    def json_object(cls) -> GrammarSpec:
        return cls("json_object")

    def llguidance_grammar(self) -> str:
        """The grammar in llguidance's own form."""
        from llguidance import LLMatcher

        if self.kind == "json_object":  # any JSON object, as OpenAI's json_object mode
            return str(LLMatcher.grammar_from_json_schema(bounded_space({"type": "object"})))
        if self.kind == "json_schema":
            try:
                schema = json.loads(self.text)
                schema = bounded_space(schema) if isinstance(schema, dict) else schema
                return str(LLMatcher.grammar_from_json_schema(schema))
            except ValueError as err:  # (json's errors are ValueErrors too)
                raise GrammarError(f"bad JSON schema: {err}") from None
        if self.kind == "lark":
            return str(LLMatcher.grammar_from_lark(self.text))
        if self.kind == "grammar":
            from llguidance import grammar_from

            try:
                return str(grammar_from("grammar", self.text))
            except ValueError as err:
                raise GrammarError(str(err)) from None
        return str(LLMatcher.grammar_from_regex(self.text))


class Grammar:
    """A compiled grammar as a decoder's `Constraint` (one generation's worth of state)."""

    def __init__(self, matcher: Any, vocab: int) -> None:
        self._matcher = matcher
        self.vocab = vocab
        self._bits = np.zeros((vocab + 31) // 32, dtype=np.int32)

    def allowed(self) -> np.ndarray:
        bits = self._bits
        self._matcher.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
        if self._matcher.is_error():  # e.g. a grammar past llguidance's parser limits
            raise GrammarError(f"the grammar cannot go on: {self._first_line()}")
        return np.unpackbits(bits.view(np.uint8), count=self.vocab, bitorder="little").view(bool)

    def _first_line(self) -> str:  # the rest is llguidance's dump of its parser state
        return str(self._matcher.get_error()).strip().splitlines()[0]

    def consume(self, token: int) -> None:
        if not self._matcher.consume_token(int(token)):
            raise GrammarError(f"the grammar refused token {token}: {self._first_line()}")

    def rollback(self, n: int) -> None:
        if n > 0 and not self._matcher.rollback(n):
            raise RuntimeError(f"the grammar cannot roll back {n} tokens")

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        return int(self._matcher.validate_tokens([int(t) for t in tokens]))

    def forced(self) -> list[int]:
        """Tokens the grammar forces next (e.g. a schema's next key), possibly none."""
        return [int(t) for t in self._matcher.compute_ff_tokens()]


_TOKENIZERS: weakref.WeakKeyDictionary[Any, dict[tuple[int, ...], Any]] = (
    weakref.WeakKeyDictionary()
)


def _lltokenizer(model: Model, stops: tuple[int, ...]) -> Any:
    tok: Any = model.tokenizer  # a backend's: what it offers is asked with getattr
    kept = _TOKENIZERS.setdefault(tok, {})
    if stops in kept:
        return kept[stops]
    pieces = getattr(tok, "grammar_pieces", None)
    hf = getattr(tok, "hf_tokenizer", None)
    if pieces is not None:  # llama.cpp: the GGUF's pieces, tokenized by llama.cpp
        from llguidance import LLTokenizer

        tokens = pieces()
        tokens += [b""] * (model.vocab_size - len(tokens))  # rows past the vocabulary
        made = LLTokenizer.from_llamacpp(  # type: ignore[attr-defined]  # not in its stubs
            tokens=tokens,
            vocab_ptr=tok.vocab_handle(),
            tokenize_fptr=tok.tokenize_address(),
            eos_token=list(stops),
            slices=None,
        )
    elif hf is not None:
        from llguidance.hf import from_tokenizer

        try:
            made = from_tokenizer(hf, n_vocab=model.vocab_size, eos_token=list(stops))
        except (ValueError, TypeError) as err:
            raise GrammarError(f"grammars need a fast tokenizer: {err}") from None
    else:
        raise GrammarError(f"{model.name}: grammars are not supported on this backend")
    kept[stops] = made
    return made


def compile_grammar(model: Model, spec: GrammarSpec, stop_ids: Iterable[int]) -> Grammar:
    """A fresh `Grammar` for one generation on `model`, ending at `stop_ids` (at least one:
    the tokens it allows once complete)."""
    try:
        from llguidance import LLMatcher
    except ImportError:
        raise GrammarError(
            "grammars need llguidance (pip install llguidance); it is in requirements.txt"
        ) from None
    stops = tuple(sorted({int(t) for t in stop_ids}))
    if not stops:
        raise GrammarError("a grammar needs a stop id to end on")
    what = NAMES[spec.kind]
    # the constructor never raises: a grammar it cannot compile leaves it in its error state
    matcher = LLMatcher(_lltokenizer(model, stops), spec.llguidance_grammar(), log_level=0)
    if matcher.is_error():
        raise GrammarError(f"bad {what}: {_one_line(matcher.get_error())}")
    grammar = Grammar(matcher, model.vocab_size)
    try:  # a grammar with no sentence (e.g. {"$ref": "#"}) fails at its first mask
        if not grammar.allowed().any():
            raise GrammarError("no token can start it")
    except GrammarError as err:
        raise GrammarError(f"bad {what}: nothing can be written under it ({err})") from None
    return grammar


def _one_line(message: str) -> str:
    """An error message in one line (llguidance's regex errors draw a caret under the
    pattern over several): a CLI error is one line, and a server's error field one string."""
    return " ".join(str(message).split())
