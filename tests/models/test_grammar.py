"""Grammars (llguidance) on real vocabularies: the decoder's constraint obligations
(tests/test_constraint.py) on SmolLM2 through llama.cpp and on a tiny float64 transformers
model: constrained speculation equals constrained plain decoding, the text is a sentence of
the grammar, and the vocabulary is read so that no grammar can write a control token."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

pytest.importorskip("llguidance")

from draftless.decoder import SpecOptions
from draftless.decoder import generate as timed_generate
from draftless.grammar import GrammarError, GrammarSpec, compile_grammar
from draftless.models.base import ModelError
from draftless.sources.cascade import SpeculationIndex
from fakes import garbage_source, random_source


def generate(*args, **kwargs):
    return timed_generate(*args, clock=None, **kwargs)


SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 40},
        "population": {"type": "integer", "minimum": 0},
        "rivers": {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 3},
    },
    "required": ["city", "population", "rivers"],
    "additionalProperties": False,
}
DOC = (
    '{"city": "Lyon", "population": 522250, "rivers": ["Rhone", "Saone"]}\n'
    '{"city": "Basel", "population": 177595, "rivers": ["Rhine", "Birsig"]}\n'
)


@pytest.fixture(scope="module")
def smollm2():
    pytest.importorskip("llama_cpp")
    from draftless.models.registry import load_model

    try:
        return load_model("smollm2", backend="llamacpp", n_ctx=1024)
    except ModelError as err:
        pytest.skip(str(err))


def _prompt(model) -> list[int]:
    from draftless.text import encode_prompt

    ask = "Records:\n" + DOC + "Write the record of Lyon again, as JSON."
    return encode_prompt(model, ask, chat=True)


def _index(model) -> SpeculationIndex:
    return SpeculationIndex(model.vocab_size, references=[model.tokenizer.encode(DOC)])


def _follows(text: str) -> bool:
    value = json.loads(text)
    return (
        set(value) == {"city", "population", "rivers"}
        and isinstance(value["city"], str)
        and isinstance(value["population"], int)
        and value["population"] >= 0
        and all(isinstance(r, str) for r in value["rivers"])
        and len(value["rivers"]) <= 3
    )


@pytest.mark.llamacpp
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_smollm2_constrained_speculation_equals_constrained_plain(smollm2, temperature) -> None:
    from draftless.sampling import SamplingOptions

    model, prompt = smollm2, _prompt(smollm2)
    stops = model.eos_token_ids
    sampling = SamplingOptions(temperature=temperature, seed=5)
    runs = []
    for source in (None, _index(model), garbage_source(model.vocab_size)):
        grammar = compile_grammar(model, GrammarSpec.json_schema(SCHEMA), stops)
        options = SpecOptions(gate=False, min_draft=1)  # verify every draft
        runs.append(
            generate(
                model, prompt, 150, sampling=sampling, source=source, options=options,
                stop_ids=stops, constraint=grammar,
            )
        )  # fmt: skip
    plain, indexed, garbage = runs
    assert indexed.token_ids == plain.token_ids == garbage.token_ids
    assert plain.stop_reason == "stop"
    text = model.tokenizer.decode(plain.token_ids, skip_special=True)
    assert _follows(text), text
    assert indexed.stats.accepted > 0 and garbage.stats.drafted > 0


@pytest.mark.llamacpp
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_smollm2_verifies_the_keys_a_schema_forces(smollm2, temperature) -> None:
    # A source with nothing to say (no match in the stream, no references): the drafts are
    # the schema's forced text, the "grammar" member's, and the answer is still plain's.
    from draftless.sampling import SamplingOptions
    from draftless.text import encode_prompt

    model = smollm2
    prompt = encode_prompt(model, "Write a record of a French city as JSON.", chat=True)
    stops = model.eos_token_ids
    sampling = SamplingOptions(temperature=temperature, seed=5)
    runs = []
    for source in (None, SpeculationIndex(model.vocab_size, recycling=False)):
        grammar = compile_grammar(model, GrammarSpec.json_schema(SCHEMA), stops)
        runs.append(
            generate(
                model, prompt, 150, sampling=sampling, source=source, stop_ids=stops,
                options=SpecOptions(gate=False, min_draft=1), constraint=grammar,
            )
        )  # fmt: skip
    plain, spec = runs
    assert spec.token_ids == plain.token_ids
    forced = spec.stats.members["grammar"]  # the keys, "population", "rivers", at least
    assert forced.verifies >= 3 and forced.accepted > 0, spec.stats.members


@pytest.mark.llamacpp
def test_no_grammar_writes_a_control_token_as_text(smollm2) -> None:
    model = smollm2
    grammar = compile_grammar(model, GrammarSpec("regex", "(.|\\n){0,200}"), {2})
    allowed = grammar.allowed()
    tok = model.tokenizer
    control = [t for t in range(model.vocab_size) if tok.is_special(t)]
    assert control and allowed[2]  # the stop id ends it (the regex accepts the empty text)
    assert not any(allowed[t] for t in control if t != 2)
    assert allowed.sum() > model.vocab_size // 2  # and ordinary tokens are all there


@pytest.mark.llamacpp
def test_a_bad_schema_names_what_is_wrong(smollm2) -> None:
    with pytest.raises(GrammarError, match="bad JSON schema"):
        compile_grammar(smollm2, GrammarSpec.json_schema({"type": "nope"}), {2})
    with pytest.raises(GrammarError, match="not JSON"):
        GrammarSpec.json_schema("{oops")
    with pytest.raises(GrammarError, match="stop id"):
        compile_grammar(smollm2, GrammarSpec.json_object(), set())
    with pytest.raises(GrammarError, match="nothing can be written under it"):
        compile_grammar(smollm2, GrammarSpec.json_schema({"$ref": "#"}), {2})  # no sentence
    with pytest.raises(GrammarError, match=r"^bad JSON schema: regex parse error: \( \^ error"):
        compile_grammar(smollm2, GrammarSpec.json_schema({"pattern": "("}), {2})  # one line


# -- transformers ---------------------------------------------------------------------------


@pytest.mark.hf
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_transformers_model_under_a_regex(temperature) -> None:
    pytest.importorskip("torch")
    from test_hf import byte_tokenizer, tiny_model

    from draftless.models.hf import HFModel
    from draftless.sampling import SamplingOptions

    model = HFModel.from_model(tiny_model("llama"), byte_tokenizer(), name="tiny")
    pattern = "[a-f]{2,6}-[0-9]{1,4}( [a-f]{2,6}-[0-9]{1,4}){0,5}"
    sampling = SamplingOptions(temperature=temperature, seed=3)
    prompt = [256, *b"ab-12 cd-345 ", *b"ab-12 cd-345 "]
    runs = []
    for source in (None, random_source(model.vocab_size, 4)):
        grammar = compile_grammar(model, GrammarSpec("regex", pattern), {257})
        runs.append(
            generate(
                model, prompt, 60, sampling=sampling, source=source,
                options=SpecOptions(gate=False, min_draft=1), stop_ids={257}, constraint=grammar,
            )
        )  # fmt: skip
    assert runs[0].token_ids == runs[1].token_ids
    out = runs[0].token_ids
    body = bytes(t for t in out if t < 256).decode()
    assert re.fullmatch(pattern, body) or (
        runs[0].stop_reason == "length" and re.fullmatch("[a-f0-9 -]*", body)
    ), body
    assert np.all(np.array(out[:-1]) < 256)  # nothing but text before the stop


class _BrokenMatcher:
    """A matcher that has entered llguidance's error state (e.g. a parser limit)."""

    def unsafe_compute_mask_ptr(self, pointer: int, size: int) -> None:
        pass

    def is_error(self) -> bool:
        return True

    def get_error(self) -> str:
        return "Parser Error: ParserTooComplex\n<state>...</state>"

    def consume_token(self, token: int) -> bool:
        return False


def test_a_grammar_that_cannot_go_on_is_a_user_error_in_one_line() -> None:
    from draftless.errors import UserError
    from draftless.grammar import Grammar

    grammar = Grammar(_BrokenMatcher(), 10)
    with pytest.raises(GrammarError, match=r"cannot go on: Parser Error: ParserTooComplex$"):
        grammar.allowed()
    with pytest.raises(UserError, match="refused token 3"):
        grammar.consume(3)


@pytest.mark.llamacpp
@pytest.mark.parametrize(
    ("text", "whole"),
    [
        ('{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}', True),
        (
            '```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Oslo"\n  }\n}'
            "\n```",
            True,
        ),
        ('\n<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call>', True),
        (
            '```\n<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n'
            "</tool_call>\n```",
            True,
        ),
        (
            '<tool_call>\n{"name": "read_file", "arguments": {"path": "a"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "b"}}\n</tool_call>',
            True,
        ),
        (  # one bare call only: the 1.5B, held, would open a second with a stray fence
            '{"name": "read_file", "arguments": {"path": "a"}}\n'
            '{"name": "read_file", "arguments": {"path": "b"}}',
            False,
        ),
        ('{"name": "read_file", "arguments": {"path": "a"}}```', False),
        ('{"name": "read_file", "arguments": {"path": "a"}' + " " * 12 + "}", False),  # spaces
        ('{"name": "delete_file", "arguments": {"path": "a.py"}}', False),  # not offered
        ('{"name": "get_weather", "arguments": {"city": "Paris", "days": 10}}', False),  # > 7
        ('{"name": "get_weather", "arguments": {"town": "Paris"}}', False),  # its schema
        ('{"name": "read_file", "arguments": {"path": "a.py"}} Done.', False),  # calls only
    ],
)
def test_the_auto_call_grammar_takes_every_form_of_a_call_and_only_calls(smollm2, text, whole):
    """What `tools.auto_call_grammar` holds an answer to once the model opens a call: bare,
    fenced or tagged calls of the offered tools, by their schemas, and nothing after them."""
    from draftless.serve.tools import auto_call_grammar

    tools = [
        {"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "required": ["city"],
            "properties": {"city": {"type": "string"}, "days": {"type": "integer", "maximum": 7}},
            "additionalProperties": False,
        }}},
        {"type": "function", "function": {"name": "read_file", "parameters": {
            "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"],
        }}},
    ]  # fmt: skip
    grammar = compile_grammar(
        smollm2,
        GrammarSpec("lark", auto_call_grammar(tools, True, (None, None))),
        smollm2.eos_token_ids,
    )
    ids = smollm2.tokenizer.encode(text)
    taken = grammar.valid_prefix(ids)
    assert (taken == len(ids)) is whole
    if whole:  # and the answer may end there
        for t in ids:
            grammar.consume(t)
        assert grammar.allowed()[sorted(smollm2.eos_token_ids)].all()


@pytest.mark.llamacpp
@pytest.mark.parametrize(
    ("schema", "long_spaces"),
    [(SCHEMA, False), ({**SCHEMA, "x-guidance": {"whitespace_flexible": True}}, True)],
)
def test_a_schema_bounds_the_whitespace_between_its_tokens(smollm2, schema, long_spaces) -> None:
    """A line break and indentation between JSON tokens, not an unbounded run: a model that
    would end before the object is closed must close it rather than write whitespace to the
    token limit (llama.cpp's schema grammars bound it too). A schema that sets llguidance's
    own whitespace options keeps them."""
    pretty = '{\n  "city": "Lyon",\n  "population": 1,\n  "rivers": []\n}'
    spaced = '{"city": "Lyon",' + " " * 30 + '"population": 1, "rivers": []}'
    for spec, spaces in (
        (GrammarSpec.json_schema(schema), long_spaces),
        (GrammarSpec.json_object(), False),
    ):
        for text, whole in ((pretty, True), (spaced, spaces)):
            ids = smollm2.tokenizer.encode(text)
            taken = compile_grammar(smollm2, spec, smollm2.eos_token_ids).valid_prefix(ids)
            assert (taken == len(ids)) is whole, (spec.kind, text)
