"""Tool calls out of generated text: the Hermes family of formats (Qwen 2.5, Hermes 2 Pro and
the many models trained on them), parsed as tolerantly as llama.cpp's server parses them.

A chat template that takes `tools` tells the model to answer a call as

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Small models drift from that: Qwen2.5-Coder-0.5B writes the same object in a ```json fence,
or bare. So a call opens with an optional fence (```, ```json, ```xml), then an optional tag
(<tool_call>, <function_call>, <tools>, <tool>, <json>, <response>), then a JSON object
whose "name" is one of the request's tools and whose "arguments" (or "parameters") is an
object or a JSON text; the matching closing tag and fence are taken when they follow. The
text outside calls is the message's content (less the whitespace around the calls).

Nothing is dropped: an opening whose JSON does not parse, or that names no tool of the
request, stays in the content as it was written (the client sees what the model wrote, as
it would without tools), and so does a call cut off by the token limit inside a string. One
repair: an object at the very end of the text that lacks only its last closing braces (small
models end their turn so) is closed.

`tool_choice` "required" or a named function: `call_grammar` is a grammar whose sentences are
Hermes calls of the request's tools (their names and their parameters' JSON schemas), which
the decoder follows (draftless.grammar), so the answer is a call, and a whole one.

Streaming: `ToolCallStream` passes content through as it comes and holds back only from the
first place where a call could begin to the end, parsing that at the end of the run; the
content it sends plus what `finish` returns is what `parse` makes of the whole text. Under
`call_grammar` the text can only be calls, so `ForcedCallStream` sends each call as it is
written: its name once the name is whole, then its arguments piece by piece.

tool_choice "auto": `auto_call_grammar` holds an answer from where the model opens a call
(`<tool_call>`, or an answer that begins with a call of an offered tool: `opens_call`), as
llama.cpp's lazy grammars do, and `AutoCallStream` streams content until then and the calls
as they are written from there.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from draftless.grammar import bounded_space

_TAGS = ("tool_call", "function_call", "tools", "tool", "json", "response")
_LANGS = ("json", "xml")  # a fence's language
_WS = " \t\r\n"
_MAY_OPEN = re.compile("[`<{]")  # the first character of every opening
_DECODER = json.JSONDecoder()
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


def _blank(s: str, i: int) -> int:
    """The first position from i that is not whitespace."""
    while i < len(s) and s[i] in _WS:
        i += 1
    return i


def new_call_id() -> str:
    """A call's id in OpenAI's shape: "call_" and 24 hex digits."""
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: str  # a JSON text, as OpenAI sends it
    id: str = field(default_factory=new_call_id)

    def to_wire(self, index: int | None = None) -> dict[str, Any]:
        """OpenAI's shape: {"id", "type": "function", "function": {"name", "arguments"}};
        streamed deltas also carry the call's `index`."""
        call = {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        return call if index is None else {"index": index, **call}


@dataclass(frozen=True, slots=True)
class Parsed:
    content: str | None  # None when the message is only calls (OpenAI's null content)
    calls: tuple[ToolCall, ...]


def _arguments(obj: dict[str, Any]) -> str | None:
    """The call's arguments as a JSON text, or None if it has none a client could use."""
    args = obj.get("arguments", obj.get("parameters"))
    if isinstance(args, str):  # a JSON text already (OpenAI's own shape)
        try:
            decoded = json.loads(args)
        except ValueError:
            return None
        return args if isinstance(decoded, dict) else None
    if isinstance(args, dict):
        return json.dumps(args, ensure_ascii=False)
    return None


def _opening(s: str, at: int = 0) -> tuple[bool | None, int, str | None, bool]:
    """Whether `s[at:]` starts with a call's opening: [fence] [tag] `{` `"name"`, with
    whitespace between. (True, where the object starts, the tag, whether fenced); (None, ...)
    when `s[at:]` is a prefix of an opening, which more text may complete; (False, ...) when
    no text can."""
    n = len(s)

    def prefix_of(word: str, i: int) -> bool:  # s[i:] is a proper prefix of word
        return n - i < len(word) and word.startswith(s[i:])

    i = at
    fenced = s.startswith("`", i)
    if fenced:
        if not s.startswith("```", i):
            return (None if prefix_of("```", i) else False), 0, None, True
        i += 3
        for lang in _LANGS:
            if s.startswith(lang, i):
                i += len(lang)
                break
            if i < n and prefix_of(lang, i):
                return None, 0, None, True
        while i < n and s[i] in " \t":
            i += 1
        if i == n:
            return None, 0, None, True
        if s[i] != "\n":
            return False, 0, None, True
        i = _blank(s, i + 1)
    tag = None
    if i < n and s[i] == "<":
        tag = next((t for t in _TAGS if s.startswith(f"<{t}>", i)), None)
        if tag is None:
            maybe = any(prefix_of(f"<{t}>", i) for t in _TAGS)
            return (None if maybe else False), 0, None, fenced
        i = _blank(s, i + len(tag) + 2)
    if i == n:
        return None, 0, tag, fenced
    if s[i] != "{":
        return False, 0, tag, fenced
    obj = i
    i = _blank(s, i + 1)
    if s.startswith('"name"', i):
        return True, obj, tag, fenced
    return (None if prefix_of('"name"', i) else False), obj, tag, fenced


def _closed_at_end(text: str, obj_at: int, tag: str | None, fenced: bool) -> tuple[Any, int] | None:
    """The object at `obj_at` if the text ends where only its last one or two closing braces
    are missing (Qwen2.5-Coder-1.5B often stops a call so: `..."content": "..."}` and the end of
    its turn), and the end of the text. A string cut off by the token limit is not closed
    here: that call stays content."""
    tail = text[obj_at:].rstrip(_WS)
    for closing in ("```" if fenced else "", f"</{tag}>" if tag else ""):
        if closing and tail.endswith(closing):
            tail = tail[: -len(closing)].rstrip(_WS)
    for missing in ("}", "}}"):
        try:
            obj, end = _DECODER.raw_decode(tail + missing)
        except ValueError:
            continue
        if end == len(tail) + len(missing):
            return obj, len(text)
    return None


def _call_at(text: str, start: int, names: frozenset[str]) -> tuple[ToolCall, int] | None:
    """The call that opens at `start` and where it ends, or None if none opens there."""
    opens, obj_at, tag, fenced = _opening(text, start)
    if not opens:
        return None
    try:
        obj, end = _DECODER.raw_decode(text, obj_at)
    except ValueError:
        healed = _closed_at_end(text, obj_at, tag, fenced)
        if healed is None:
            return None
        obj, end = healed
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    arguments = _arguments(obj)
    if arguments is None:
        return None
    for closing in ([f"</{tag}>"] if tag else []) + (["```"] if fenced else []):
        after = end
        while after < len(text) and text[after] in _WS:
            after += 1
        if text.startswith(closing, after):
            end = after + len(closing)
    return ToolCall(obj["name"], arguments), end


def _split(text: str, names: frozenset[str]) -> tuple[str, tuple[ToolCall, ...]]:
    """(the text outside calls, the calls), scanning left to right. The whitespace that
    lays calls out (the newlines before, between and after them) is not content."""
    calls: list[ToolCall] = []
    content: list[str] = []
    pos = 0  # text before pos is decided
    scan = 0  # the next place a call could open
    while (m := _MAY_OPEN.search(text, scan)) is not None:
        found = _call_at(text, m.start(), names)
        if found is None:
            scan = m.start() + 1
            continue
        call, end = found
        before = text[pos : m.start()]
        content.append((before.lstrip(_WS) if calls else before).rstrip(_WS))
        calls.append(call)
        pos = scan = end
    content.append(text[pos:].lstrip(_WS) if calls else text[pos:])
    return "".join(content), tuple(calls)


HERMES_OPEN = "<tool_call>"  # a template that mentions it asks for Hermes calls
HERMES_CLOSE = "</tool_call>"


def call_grammar(
    tools: Sequence[Mapping[str, Any]],
    only: str | None,
    many: bool,
    tags: tuple[int | None, int | None] = (None, None),
) -> str:
    """A Lark grammar (llguidance's dialect) of Hermes calls: `<tool_call>`, a newline, a JSON
    object {"name": <a tool's name>, "arguments": <what its parameters schema allows>}, a
    newline, `</tool_call>`; one call, or (`many`) one or more, a newline apart, as Qwen 2.5
    writes parallel calls. `only` names the one function a call may name. `tags`: the token
    ids of the opening and closing tag where the vocabulary has them as one token (Qwen
    2.5's), which the grammar then names by id (`<[id]>`): a grammar engine reads such an
    added token as special, not as the text it spells."""
    opening, closing = _tags(tags)
    return "\n".join(
        [
            'start: call ("\\n" call)*' if many else "start: call",
            f'call: {opening} "\\n" body "\\n" {closing}',
            f"body: %json {json.dumps(_body(tools, only))}",
        ]
    )


def auto_call_grammar(
    tools: Sequence[Mapping[str, Any]], many: bool, tags: tuple[int | None, int | None]
) -> str:
    """A Lark grammar of an answer that is a call of `tools` in the forms the parser takes and
    Hermes-family models write under tool_choice "auto": the JSON object bare, in a ```
    fence, or between the tags, with whitespace around; `many`: or calls between tags, one
    after another (Qwen 2.5's parallel calls). It holds from where the model opens a call
    (`constraint.Triggered` with `opens_call`, as llama.cpp's lazy grammars): the call is
    then whole, of a tool the request offers, as its schema says, and only the end follows.
    (A second bare or fenced call is not allowed: the 1.5B, held past where it would end its
    turn, closes a bare call with a stray fence, which would open one.)"""
    opening, closing = _tags(tags)
    return "\n".join(
        [
            "start: WS (fenced | body | tagged) WS"
            + (" | WS tagged (WS tagged)+ WS" if many else ""),
            'fenced: "```" LANG /[ \\t]{0,8}\\n/ WS (tagged | body) WS "```"',
            'LANG: "json" | "xml" | ""',
            f"tagged: {opening} WS body WS {closing}",
            "WS: /[ \\t\\r\\n]{0,8}/",
            f"body: %json {json.dumps(_body(tools, None))}",
        ]
    )


def _tags(tags: tuple[int | None, int | None]) -> tuple[str, str]:
    """The opening and closing tag in a grammar: by id where the vocabulary has one token."""
    opening, closing = (
        f'"{text}"' if tag is None else f"<[{tag}]>"
        for tag, text in zip(tags, (HERMES_OPEN, HERMES_CLOSE), strict=True)
    )
    return opening, closing


def _body(tools: Sequence[Mapping[str, Any]], only: str | None) -> dict[str, Any]:
    """The JSON schema of a call's object, {"name": a tool's name, "arguments": what its
    parameters allow}, for `only` or any of `tools`."""
    schemas = []
    for tool in tools:
        function = tool["function"]
        if only is not None and function["name"] != only:
            continue
        schemas.append(
            {
                "type": "object",
                "properties": {
                    "name": {"const": function["name"]},
                    "arguments": function.get("parameters") or {"type": "object"},
                },
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    # whitespace bounded: a model held past where it would end its turn (the 1.5B ends a call
    # before its last brace; the parser heals that) can only close the call
    return bounded_space(schemas[0] if len(schemas) == 1 else {"anyOf": schemas})


def opens_call(text: str, names: Iterable[str]) -> bool | None:
    """Whether `text`, the start of an answer, opens a call of one of `names`: an opening
    ([fence] [tag] `{"name": "`) and one of the names, whole. None while more text may make
    it one; False once no text can."""
    s = text.lstrip(_WS)
    if not s:
        return None
    opens, obj, _, _ = _opening(s)
    if not opens:
        return opens
    i = _blank(s, _blank(s, obj + 1) + len('"name"'))
    for expected in ':"':
        if i == len(s):
            return None
        if s[i] != expected:
            return False
        if expected == ":":
            i = _blank(s, i + 1)
    name = _STRING.match(s, i)
    if name is None:  # still being written
        written = s[i + 1 :]
        return None if "\\" in written or any(n.startswith(written) for n in names) else False
    return json.loads(name[0]) in set(names)


def parse(text: str, names: Iterable[str]) -> Parsed:
    """The calls in `text` to the tools named `names`, and the text around them."""
    content, calls = _split(text, frozenset(names))
    return Parsed(None if calls and not content.strip(_WS) else content, calls)


class ToolCallStream:
    """Streamed content for a request with tools: `feed` each decoded piece and send what it
    returns; `finish` returns the rest of the content and the calls."""

    def __init__(self, names: Iterable[str]) -> None:
        self.names = frozenset(names)
        self.text = ""  # everything fed
        self.sent = 0  # characters of `text` sent as content
        self.holding = False  # a call may have opened: hold everything to the end

    def feed(self, piece: str) -> str:
        self.text += piece
        if self.holding:
            return ""
        rest = self.text[self.sent :]
        cut = len(rest)
        for m in _MAY_OPEN.finditer(rest):
            opens = _opening(rest, m.start())[0]
            if opens is False:
                continue
            self.holding = opens is True  # an opening: the rest is decided at the end
            cut = m.start()
            break
        # whitespace before what is held waits too: a reply of only calls has no content
        out = rest[:cut].rstrip(_WS)
        self.sent += len(out)
        return out

    def finish(self) -> tuple[str, tuple[ToolCall, ...]]:
        """(content not sent yet, the calls)."""
        content, calls = _split(self.text[self.sent :], self.names)
        if calls and self.sent == 0 and not content.strip(_WS):
            content = ""
        return content, calls


# A call's head under `call_grammar`: the object's opening, its name, the arguments' key.
_HEAD = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')


@dataclass(frozen=True, slots=True)
class CallDelta:
    """A piece of a streamed call: the first names it (`id`, `name`), the rest add to its
    `arguments` (OpenAI's streamed shape: a client joins the arguments of one index)."""

    index: int
    arguments: str
    id: str | None = None
    name: str | None = None

    def to_wire(self) -> dict[str, Any]:
        function: dict[str, Any] = {"arguments": self.arguments}
        if self.id is None:
            return {"index": self.index, "function": function}
        function = {"name": self.name, **function}
        return {"index": self.index, "id": self.id, "type": "function", "function": function}


class ForcedCallStream:
    """The calls of a text that `call_grammar` holds to (so nothing but calls: tags, JSON
    objects, the newlines between them), sent as they are written. `feed` each decoded piece
    and send the deltas it returns. A call's arguments are the JSON text the model writes,
    up to where its value ends; if the run stops inside them (the token limit), what was
    written is what the client has, as in OpenAI's streams."""

    def __init__(self, first: int = 0) -> None:
        self.text = ""
        self.calls = first  # calls named so far (`first`: the index of the first one)
        self._at = 0  # where the next call's head may start
        self._args: int | None = None  # where the open call's arguments go on from
        self._depth = 0  # brackets open in those arguments
        self._begun = False  # their value's first character has come
        self._in_string = False
        self._escaped = False

    def feed(self, piece: str) -> list[CallDelta]:
        self.text += piece
        out: list[CallDelta] = []
        while True:
            if self._args is None:
                head = _HEAD.search(self.text, self._at)
                if head is None:
                    return out
                name = json.loads(f'"{head[1]}"')
                out.append(CallDelta(self.calls, "", new_call_id(), name))
                self.calls += 1
                self._args, self._begun = head.end(), False
            start = self._args
            end, whole = self._scan(start)
            if end > start:
                out.append(CallDelta(self.calls - 1, self.text[start:end]))
            if not whole:
                self._args = end  # the value goes on in the next piece
                return out
            self._args, self._at = None, end  # the next call's head, if any

    def _scan(self, i: int) -> tuple[int, bool]:
        """(how far the arguments' value goes in the text, whether it ends there),
        following strings and brackets from `i`."""
        text = self.text
        while i < len(text):
            c = text[i]
            i += 1
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif c == "\\":
                    self._escaped = True
                elif c == '"':
                    self._in_string = False
                    if self._depth == 0:
                        return i, True
                continue
            if not self._begun and c in _WS:
                continue
            if self._depth == 0 and self._begun and (c in _WS or c in ",}"):
                return i - 1, True  # a number, true, false or null ends before this
            self._begun = True
            if c == '"':
                self._in_string = True
            elif c in "{[":
                self._depth += 1
            elif c in "}]":
                self._depth -= 1
                if self._depth == 0:
                    return i, True
        return i, False


class AutoCallStream:
    """Streamed content and calls under tool_choice "auto", where `auto_call_grammar` holds
    from where the model opens a call (`constraint.Triggered`). Content goes as
    `ToolCallStream` sends it until `open_at` tells where in the text the grammar holds from;
    from there the text can only be calls, sent as they are written (`ForcedCallStream`)
    once the first one's opening is whole. Text held back before it is parsed then: its
    content is sent, and a call in it (a small model's fenced or bare call) is sent whole."""

    def __init__(self, names: Iterable[str]) -> None:
        self.held = ToolCallStream(names)
        self.calls: ForcedCallStream | None = None
        self._open_at: int | None = None
        self.told = False  # `open_at` was called

    @property
    def sent_calls(self) -> bool:
        return self.calls is not None and self.calls.calls > 0

    def open_at(self, at: int) -> None:
        """The grammar holds from text[at] on (`at` counts characters fed before it, or to
        be fed). Told once; a place where no call opens is ignored."""
        self.told = True
        if self.calls is None and at >= self.held.sent:
            self._open_at = at

    def feed(self, piece: str) -> tuple[str, list[CallDelta]]:
        """(content to send, call deltas to send)."""
        if self.calls is not None:
            return "", self.calls.feed(piece)
        held, at = self.held, self._open_at
        if at is None:
            return held.feed(piece), []
        text = held.text + piece
        at = _blank(text, at)
        opens = _opening(text, at)[0] if at < len(text) else None
        if not opens:
            if opens is False:  # no call opens there after all: held to the end
                self._open_at = None
            return held.feed(piece), []
        # up to the opening, as content (it may have come already: held, as an opening)
        content = held.feed(piece[: max(0, at - len(held.text))])
        pre = text[held.sent : at]
        probe = pre + HERMES_OPEN + '\n{"name"'
        cut = next(  # a fence (or other opening) that a tag goes on with is the call's
            (
                m.start()
                for m in _MAY_OPEN.finditer(pre)
                if _opening(probe, m.start())[:2] == (True, len(pre) + len(HERMES_OPEN) + 1)
            ),
            len(pre),
        )
        rest, before = _split(pre[:cut], held.names)
        content += rest.rstrip(_WS)
        deltas = [
            d
            for i, c in enumerate(before)
            for d in (CallDelta(i, "", c.id, c.name), CallDelta(i, c.arguments))
        ]
        self.calls = ForcedCallStream(first=len(before))
        return content, deltas + self.calls.feed(text[at:])

    def finish(self) -> tuple[str, tuple[ToolCall, ...]]:
        """(content not sent yet, the calls) when the grammar never held: as
        `ToolCallStream`; after it did, the calls were sent as they came and nothing is left."""
        return self.held.finish() if self.calls is None else ("", ())
