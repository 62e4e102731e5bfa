"""Tool calls out of generated text (serve/tools.py): every format the parser takes, what it
must leave as content, and the stream against the whole text under any split."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftless.serve.tools import (
    AutoCallStream,
    ToolCallStream,
    auto_call_grammar,
    call_grammar,
    opens_call,
    parse,
)

NAMES = ("get_weather", "read_file")
PARIS = {"city": "Paris"}


def calls_of(text: str) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in parse(text, NAMES).calls]


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        '<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>',
        # what Qwen2.5-Coder-0.5B writes instead of the tags
        '```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Paris"\n  }\n}\n```',
        '```\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        "</tool_call>\n```",
        '{"name": "get_weather", "arguments": {"city": "Paris"}}',
        '<function_call>{"name": "get_weather", "parameters": {"city": "Paris"}}</function_call>',
        # the turn ended before the last braces (Qwen2.5-Coder-1.5B does this)
        '{"name": "get_weather", "arguments": {"city": "Paris"}',
        '{"name": "get_weather", "arguments": {"city": "Paris"\n',
        '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}\n```',
        '<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}\n'
        "</tool_call>",
    ],
)
def test_a_call_in_each_format_is_a_call_and_no_content(text: str) -> None:
    parsed = parse(text, NAMES)
    assert calls_of(text) == [("get_weather", PARIS)]
    assert parsed.content is None


def test_text_around_calls_is_content_and_calls_keep_their_order() -> None:
    text = (
        "Let me look.\n<tool_call>\n"
        '{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
        "Done."
    )
    parsed = parse(text, NAMES)
    assert parsed.content == "Let me look.Done."
    assert calls_of(text) == [("read_file", {"path": "a.py"}), ("get_weather", {"city": "Oslo"})]
    assert len({c.id for c in parsed.calls}) == 2
    wire = parsed.calls[0].to_wire(0)
    assert wire["type"] == "function" and wire["index"] == 0
    assert wire["id"].startswith("call_")


@pytest.mark.parametrize(
    "text",
    [
        "A plain answer with no call in it.",
        # a call the request did not offer, an object with no name, a broken object
        '<tool_call>\n{"name": "delete_everything", "arguments": {}}\n</tool_call>',
        '{"title": "get_weather", "arguments": {"city": "Paris"}}',
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par\n</tool_call>',
        # arguments that are not an object
        '<tool_call>{"name": "get_weather", "arguments": [1, 2]}</tool_call>',
        '<tool_call>{"name": "get_weather", "arguments": "not json"}</tool_call>',
        # code with braces, tags and fences of its own
        'Use ```python\nd = {"name": 3}\n``` or <tool> tags, or {"name" : 1}.',
        # cut off by the token limit, inside a string or not at the end
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa',
        '{"name": "get_weather", "arguments": {"city": "Paris"} and then',
        '{"name": "get_weather", "arguments": {"city": {"in": "Paris"',  # three braces short
    ],
)
def test_what_is_not_a_whole_offered_call_stays_content_as_written(text: str) -> None:
    parsed = parse(text, NAMES)
    assert parsed.calls == ()
    assert parsed.content == text


def test_without_offered_names_nothing_is_a_call() -> None:
    text = '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>'
    assert parse(text, ()).content == text


# -- streaming: whatever the split, the stream says what the whole text says -----------------
_CALL_TEXTS = [
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    '```json\n{"name": "read_file", "arguments": {"path": "x.py"}}\n```',
    '{"name": "get_weather", "arguments": {"city": "Oslo"}}',
]
_NOISE = [
    "Sure. ",
    "\n",
    "  ",
    "<",
    "<tool",
    "{",
    '{"name"',
    "`",
    "```",
    "```json\n",
    "}",
    '{"name": "nope", "arguments": {}}',
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Par',
    "déjà vu 🙂",
    "\x1f",  # whitespace to str.strip(), not to JSON or the parser
    "x = {1: 2}",
]
_TEXT = st.lists(st.sampled_from(_CALL_TEXTS + _NOISE) | st.text(max_size=6), max_size=8).map(
    "".join
)


@settings(max_examples=400, deadline=None)
@given(text=_TEXT, cuts=st.lists(st.integers(0, 400), max_size=12))
def test_a_stream_sends_the_whole_texts_content_and_calls(text: str, cuts: list[int]) -> None:
    whole = parse(text, NAMES)
    bounds = sorted({c for c in cuts if c < len(text)} | {0, len(text)})
    stream = ToolCallStream(NAMES)
    sent = "".join(stream.feed(text[a:b]) for a, b in itertools.pairwise(bounds))
    rest, calls = stream.finish()
    assert sent + rest == (whole.content or "")
    assert [(c.name, c.arguments) for c in calls] == [(c.name, c.arguments) for c in whole.calls]
    if not whole.calls:
        assert sent + rest == text  # no call: every character, as written


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet=st.characters(blacklist_characters="`<{"), max_size=80))
def test_text_that_cannot_open_a_call_is_sent_at_once(text: str) -> None:
    """Held back is only trailing whitespace: prose streams as it comes."""
    stream = ToolCallStream(NAMES)
    assert stream.feed(text) == text.rstrip(" \t\r\n")


def test_the_escaped_view_holds_the_long_texts_that_escaping_changes() -> None:
    from draftless.serve.protocol import MIN_ESCAPED, ChatRequest

    long_plain = "a" * MIN_ESCAPED  # escaping changes nothing: the prompt already holds it
    note = 'line one\nsays "hi"\n' * 4
    request = ChatRequest.model_validate(
        {
            "messages": [
                {"role": "user", "content": "short\n"},
                {"role": "user", "content": long_plain},
                {"role": "user", "content": note},
                {"role": "assistant", "content": note},  # the same text once
            ]
        }
    )
    assert request.escaped_contents() == [json.dumps(note)[1:-1]]


def test_the_strings_inside_a_json_message_are_held_as_text() -> None:
    from draftless.serve.protocol import MIN_ESCAPED, ChatRequest

    note = 'line one\nsays "hi"\n' * 4
    result = json.dumps({"path": "n.txt", "content": note, "lines": [note.upper(), 3]})
    plain_long = "b" * MIN_ESCAPED  # its JSON text holds it as it is: nothing to add
    messages = [
        {"role": "user", "content": "[" + "1, " * 40 + "2]"},  # JSON without strings
        {"role": "tool", "tool_call_id": "c", "content": result},
        {"role": "tool", "tool_call_id": "d", "content": json.dumps([plain_long])},
        {"role": "user", "content": "{not json" + "x" * MIN_ESCAPED},
    ]
    request = ChatRequest.model_validate({"messages": messages})
    assert request.json_strings() == [note.upper(), note]  # longest first, then in order


# -- the grammar of a forced call ----------------------------------------------------------
def _offered(*names: str, parameters: dict | None = None) -> list[dict]:
    function = {"parameters": parameters} if parameters is not None else {}
    return [{"type": "function", "function": {"name": n, **function}} for n in names]


@pytest.mark.parametrize(
    ("only", "many", "tags"),
    [(None, True, (None, None)), ("b", False, (None, None)), (None, False, (151657, 151658))],
)
def test_the_call_grammar_compiles_and_names_only_what_it_may(only, many, tags) -> None:
    llguidance = pytest.importorskip("llguidance")
    tools = _offered("a", "b", parameters={"type": "object", "properties": {"x": {}}})
    text = call_grammar(tools, only, many, tags)
    bad, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
        llguidance.LLMatcher.grammar_from_lark(text)
    )
    assert not bad, messages
    assert ('{"const": "b"}' in text) and (('{"const": "a"}' in text) == (only is None))
    assert ('("\\n" call)*' in text) == many
    assert ("<[151657]>" in text) == (tags[0] is not None)
    assert ('"<tool_call>"' in text) == (tags[0] is None)


def test_a_tool_without_parameters_takes_any_object_as_arguments() -> None:
    text = call_grammar(_offered("ping"), None, False)
    assert '"arguments": {"type": "object"}' in text


# -- calls under the call grammar, streamed as written ---------------------------------------

FORCED = [
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris \\"{[\\" }", '
    '"days": [1, {"a": null}], "ok": true}}\n</tool_call>',
    '<tool_call>\n{ "name" : "search" ,\n "arguments" :{}}\n</tool_call>\n<tool_call>\n'
    '{"name": "get_weather", "arguments": {"city": "Lyon\\\\"}}\n</tool_call>',
    '{"name":"f\\u00e9","arguments":{"n":-1.5e3,"s":"}"}}',
]


def _joined(deltas) -> list[tuple[str, str, str]]:
    """(id, name, arguments) per call index, from the deltas in order."""
    calls: dict[int, list[str]] = {}
    for d in deltas:
        if d.id is not None:  # the first delta of a call names it, once
            assert d.index == len(calls) and d.arguments == ""
            calls[d.index] = [d.id, d.name, ""]
        else:
            assert d.index == len(calls) - 1  # pieces of the open call only
            calls[d.index][2] += d.arguments
    return [tuple(c) for c in calls.values()]  # type: ignore[misc]


@settings(max_examples=200, deadline=None)
@given(which=st.sampled_from(range(len(FORCED))), cuts=st.lists(st.integers(0, 200), max_size=12))
def test_forced_calls_stream_as_written_however_the_text_is_cut(which: int, cuts) -> None:
    from draftless.serve.tools import ForcedCallStream

    text = FORCED[which]
    bounds = sorted({0, len(text), *(c for c in cuts if c < len(text))})
    stream = ForcedCallStream()
    deltas = [d for a, b in itertools.pairwise(bounds) for d in stream.feed(text[a:b])]
    got = _joined(deltas)
    calls = parse(text, ["get_weather", "search", "fé"]).calls
    assert [(name, json.loads(args)) for _, name, args in got] == [
        (c.name, json.loads(c.arguments)) for c in calls
    ]
    for _, _, args in got:  # each call's arguments are the text written, as it was written
        assert args in text
    wire = [d.to_wire() for d in deltas]
    assert all(w["function"].keys() >= {"arguments"} for w in wire)
    assert [w["function"]["name"] for w in wire if "id" in w] == [c.name for c in calls]


@pytest.mark.parametrize("end", range(0, len(FORCED[0]), 7))
def test_a_forced_call_cut_short_has_sent_a_prefix_of_its_arguments(end: int) -> None:
    from draftless.serve.tools import ForcedCallStream

    text = FORCED[0]
    whole = _joined(ForcedCallStream().feed(text))[0][2]
    got = _joined(ForcedCallStream().feed(text[:end]))
    assert len(got) <= 1
    if got:
        assert whole.startswith(got[0][2])  # never more than was written, never other text
        assert got[0][1] == "get_weather"
    else:
        assert '"arguments":' not in text[:end].replace(" ", "")  # named once it can be


# -- tool_choice "auto": free text, then calls as written from the tag the grammar holds from --

# what the call grammar lets follow the opening tag it holds from (call_grammar(opened=True))
_OPENED = [
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris \\"{[\\" }"}}\n</tool_call>',
    '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"days": [1, {"a": null}]}}\n</tool_call>',
]


def _streamed(text: str, at: int | None, told: int, cuts: list[int]):
    """(content sent, (name, arguments) of the calls sent or finished, deltas) of `text` fed
    in pieces cut at `cuts`, told before the piece that starts at `told` that the tag is at
    `at`."""
    bounds = sorted({0, len(text), *(c for c in cuts if c < len(text))})
    stream = AutoCallStream(NAMES)
    content, deltas = "", []
    for a, b in itertools.pairwise(bounds):
        if at is not None and (a >= told or b > at) and not stream.told:
            stream.open_at(at)
        piece, more = stream.feed(text[a:b])
        content, deltas = content + piece, deltas + more
    rest, finished = stream.finish()
    assert not (deltas and finished)  # sent as written, or whole at the end
    calls = [(name, json.loads(args)) for _, name, args in _joined(deltas)]
    return content + rest, calls + [(c.name, json.loads(c.arguments)) for c in finished], deltas


@settings(max_examples=400, deadline=None)
@given(
    before=_TEXT,
    which=st.sampled_from(range(len(_OPENED))),
    told=st.integers(0, 400),
    cuts=st.lists(st.integers(0, 400), max_size=12),
)
def test_an_auto_stream_sends_the_whole_texts_content_and_calls(before, which, told, cuts):
    text = before + _OPENED[which]
    at = len(before)
    whole = parse(text, NAMES)
    content, calls, deltas = _streamed(text, at, min(told, at), cuts)
    assert content == (whole.content or "")
    assert calls == [(c.name, json.loads(c.arguments)) for c in whole.calls]
    opened = parse(_OPENED[which], NAMES).calls
    streamed = _joined(deltas)[-len(opened) :]  # the calls the grammar held, as written
    assert [(name, json.loads(a)) for _, name, a in streamed] == [
        (c.name, json.loads(c.arguments)) for c in opened
    ]
    assert all(a in text for _, _, a in streamed)


@pytest.mark.parametrize("at", [0, 3, 30])
def test_an_auto_stream_told_a_place_that_is_not_the_tag_parses_at_the_end(at: int) -> None:
    text = "Sure." + _OPENED[0]  # the tag is at 5
    content, calls, deltas = _streamed(text, at, 0, [2, 9, 20])
    assert not deltas and content == "Sure."
    assert calls == [("get_weather", json.loads(parse(text, NAMES).calls[0].arguments))]


def test_a_call_written_before_the_tag_is_sent_whole_and_first() -> None:
    bare = '{"name": "get_weather", "arguments": {"city": "Oslo"}}'
    text = "Two calls.\n" + bare + "\n" + _OPENED[1]
    content, calls, deltas = _streamed(text, len(text) - len(_OPENED[1]), 0, [4, 40, 90])
    assert content == "Two calls."
    assert [name for name, _ in calls] == ["get_weather", "read_file", "get_weather"]
    assert [d.index for d in deltas if d.id is not None] == [0, 1, 2]


def test_a_fence_the_tag_goes_on_with_is_part_of_the_call() -> None:
    text = "Here:\n```json\n" + _OPENED[0]
    content, calls, _ = _streamed(text, text.index("<tool_call>"), 0, [3, 8, 12, 30])
    assert content == "Here:" == parse(text, NAMES).content
    assert [name for name, _ in calls] == ["get_weather"]


@pytest.mark.parametrize(
    ("text", "opens"),
    [
        ("", None),
        (" \n", None),
        ("Sure", False),
        ("{", None),
        ('{"na', None),
        ('{"name"', None),
        ('{"name" :', None),
        ('{"name": "get_w', None),
        ('{"name": "get_weather"', True),
        ('\n```json\n{\n  "name": "read_file"', True),
        ('<tool_call>\n{"name": "get_weather", "arg', True),
        ('{"name": "nope"', False),
        ('{"name": "get_weather2', False),
        ('{"name": 3', False),
        ('{"city": "Paris"}', False),
        ("```python\n", False),
        ('Call: {"name": "get_weather"', False),  # after text: only the tag opens
    ],
)
def test_an_answer_opens_a_call_once_it_names_an_offered_tool(text: str, opens) -> None:
    assert opens_call(text, NAMES) is opens


def test_the_auto_call_grammar_compiles_with_tags_by_id_or_as_text() -> None:
    llguidance = pytest.importorskip("llguidance")
    tools = _offered("a", "b", parameters={"type": "object", "properties": {"x": {}}})
    for many, tags in ((True, (151657, 151658)), (False, (None, None))):
        text = auto_call_grammar(tools, many, tags)
        bad, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
            llguidance.LLMatcher.grammar_from_lark(text)
        )
        assert not bad, messages
        assert ("(WS tagged)+" in text) == many and ("<[151657]>" in text) == (tags[0] is not None)
