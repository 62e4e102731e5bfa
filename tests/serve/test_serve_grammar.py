"""Structured output through `draftless serve` (SmolLM2, llama.cpp): `response_format` with a
JSON schema or any JSON object, and llama-server's `grammar` (GBNF or Lark). The answer
follows the schema, the speculating server answers exactly what the plain one does (greedy
and seeded sampling, whole and streamed), speculation still drafts under the grammar, and a
schema or grammar that cannot be compiled is a 400 naming its field."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("llama_cpp")
pytest.importorskip("fastapi")
pytest.importorskip("llguidance")
openai = pytest.importorskip("openai")

from test_serve import (  # noqa: E402
    assert_error,
    complete,
    plain,  # noqa: F401 - fixture
    post,
    spec,  # noqa: F401 - fixture
    still_serving,
    streamed,
    text_of,
)

pytestmark = [pytest.mark.llamacpp, pytest.mark.slow]

RECORD = {
    "sku": "TX-4471",
    "name": "Cast iron skillet, 26 cm",
    "price": 34.5,
    "tags": ["kitchen", "cookware"],
    "in_stock": True,
}
SCHEMA = {
    "type": "object",
    "properties": {
        "sku": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{4}$"},
        "name": {"type": "string"},
        "price": {"type": "number"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "in_stock": {"type": "boolean"},
    },
    "required": ["sku", "name", "price", "tags", "in_stock"],
    "additionalProperties": False,
}
ASK = [
    {
        "role": "user",
        "content": "Give me this product record back as JSON, unchanged:\n"
        + json.dumps(RECORD, indent=2),
    }
]
AS_SCHEMA = {"type": "json_schema", "json_schema": {"name": "product", "schema": SCHEMA}}


def follows_schema(text: str) -> bool:
    """Whether `text` is a JSON object SCHEMA allows (SCHEMA's rules, checked by hand)."""
    try:
        value = json.loads(text)
    except ValueError:
        return False
    types = {"sku": str, "name": str, "price": (int, float), "tags": list, "in_stock": bool}
    return (
        isinstance(value, dict)
        and set(value) == set(types)
        and all(isinstance(value[k], t) for k, t in types.items())
        and all(isinstance(t, str) for t in value["tags"])
        and len(value["sku"]) == 7
        and value["sku"][2] == "-"
        and value["sku"][:2].isupper()
        and value["sku"][3:].isdigit()
    )


@pytest.mark.parametrize(
    "sampling", [{"temperature": 0}, {"temperature": 0.8, "seed": 3}], ids=["greedy", "seeded"]
)
def test_a_json_schema_answer_follows_it_and_equals_plain(spec, plain, sampling) -> None:  # noqa: F811
    body = {"messages": ASK, "max_tokens": 120, "response_format": AS_SCHEMA, **sampling}
    got, want = complete(spec, body), complete(plain, body)
    assert text_of(got) == text_of(want)
    assert got["usage"] == want["usage"]
    assert follows_schema(text_of(got)), text_of(got)
    assert got["choices"][0]["finish_reason"] == "stop"
    stats = got["draftless"]
    assert stats["accepted"] > 0  # speculation drafted the copy under the grammar
    assert streamed(spec, body)[0] == text_of(got)


def test_json_object_mode_answers_a_json_object(spec, plain) -> None:  # noqa: F811
    body = {
        "messages": [{"role": "user", "content": "Describe a cat."}],
        "max_tokens": 200,
        "temperature": 0,
        "response_format": {"type": "json_object"},
    }
    got = complete(spec, body)
    assert text_of(got) == text_of(complete(plain, body))
    if got["choices"][0]["finish_reason"] == "stop":
        assert isinstance(json.loads(text_of(got)), dict)
    else:  # cut by max_tokens: what there is starts an object
        assert text_of(got).lstrip().startswith("{")
    free = text_of(complete(plain, {k: v for k, v in body.items() if k != "response_format"}))
    assert not free.lstrip().startswith("{")  # without it the model writes prose


@pytest.mark.parametrize(
    "grammar",
    ['root ::= "yes" | "no"', 'start: "yes" | "no"'],
    ids=["gbnf", "lark"],
)
def test_a_grammar_limits_the_answer_to_its_sentences(spec, grammar) -> None:  # noqa: F811
    body = {
        "messages": [{"role": "user", "content": "Is the sky green?"}],
        "max_tokens": 10,
        "temperature": 0,
        "grammar": grammar,
    }
    got = complete(spec, body)
    assert text_of(got) in ("yes", "no")
    assert got["choices"][0]["finish_reason"] == "stop"


def test_text_completions_take_a_response_format_too(spec, plain) -> None:  # noqa: F811
    body = {
        "prompt": "Product record:\n" + json.dumps(RECORD) + "\nThe same record as JSON:\n",
        "max_tokens": 120,
        "temperature": 0,
        "response_format": AS_SCHEMA,
    }
    got = complete(spec, body)
    assert text_of(got) == text_of(complete(plain, body))
    assert follows_schema(text_of(got)), text_of(got)


def test_max_tokens_cuts_a_constrained_answer_where_plain_does(spec, plain) -> None:  # noqa: F811
    body = {"messages": ASK, "temperature": 0, "response_format": AS_SCHEMA}
    whole = text_of(complete(plain, {**body, "max_tokens": 120}))
    cut = complete(spec, {**body, "max_tokens": 9})
    assert cut["choices"][0]["finish_reason"] == "length"
    assert whole.startswith(text_of(cut)) and text_of(cut) != whole


def test_each_of_n_choices_follows_the_schema(spec) -> None:  # noqa: F811
    body = {
        "messages": ASK,
        "max_tokens": 120,
        "temperature": 1.0,
        "seed": 11,
        "n": 3,
        "response_format": AS_SCHEMA,
    }
    got = complete(spec, body)
    finished = [c for c in got["choices"] if c["finish_reason"] == "stop"]
    assert finished and all(follows_schema(c["message"]["content"]) for c in finished)


@pytest.mark.parametrize(
    ("extra", "param", "says"),
    [
        ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": 5}}}},
         "response_format", "bad JSON schema"),
        ({"response_format": {"type": "json_object", "schema": {"minimum": "x"}}},
         "response_format", "bad JSON schema"),
        ({"grammar": "root ::= undefined_rule"}, "grammar", "grammar"),
        ({"grammar": "start: /[/"}, "grammar", "grammar"),
    ],
)  # fmt: skip
def test_a_schema_or_grammar_that_does_not_compile_is_a_400(spec, extra, param, says) -> None:  # noqa: F811
    r = post(spec, "/v1/chat/completions", {"messages": ASK, "max_tokens": 4, **extra})
    err = assert_error(r)
    assert err["param"] == param and says in err["message"]
    still_serving(spec)


def test_the_openai_client_gets_parsed_structured_output(spec) -> None:  # noqa: F811
    client = openai.OpenAI(base_url=spec.url + "/v1", api_key="none", max_retries=0)
    r = client.chat.completions.create(
        model="smollm2", messages=ASK, max_tokens=120, temperature=0, response_format=AS_SCHEMA
    )
    assert follows_schema(r.choices[0].message.content or "")


# Any schema-shaped value: a 200 or a 400 naming response_format, never a 5xx, and the server
# keeps serving (llguidance is native code; a schema it cannot take must not reach the worker
# as anything but a GrammarError).
_SCALAR = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 10**13), st.text("ab(){}[]*+?|^$.\\-0", max_size=6)
)
_KEYS = st.sampled_from(
    ["type", "pattern", "minLength", "maxLength", "minimum", "maximum", "enum", "const",
     "items", "properties", "required", "minItems", "maxItems", "anyOf", "$ref", "format",
     "additionalProperties", "multipleOf"]
)  # fmt: skip
_SCHEMA = st.recursive(
    st.one_of(_SCALAR, st.sampled_from(["string", "integer", "object", "array", "number"])),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_KEYS, inner, max_size=4)),
    max_leaves=10,
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(schema=_SCHEMA)
def test_any_schema_gets_an_answer_or_a_400_never_a_5xx(spec, schema) -> None:  # noqa: F811
    body = {
        "messages": ASK,
        "max_tokens": 3,
        "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"schema": schema}},
    }
    r = post(spec, "/v1/chat/completions", body)
    assert r.status_code in (200, 400), r.text
    if r.status_code == 400:
        assert r.json()["error"]["param"].startswith("response_format")
    still_serving(spec)
