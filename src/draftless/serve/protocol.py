"""The OpenAI wire format: request models (validated by pydantic) and response bodies.

A request is parsed into a pydantic model; `to_sampling()` and the fields go to the engine.
Anything the library refuses later (a stop id outside the vocabulary, a prompt longer than the
context) comes back as a `UserError` and is answered with the same error body:

    {"error": {"message": "...", "type": "invalid_request_error", "param": "...", "code": ...}}
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from typing import Any, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

from draftless.errors import UsageError
from draftless.grammar import GrammarSpec
from draftless.logprobs import MAX_TOP, TokenLogprob
from draftless.models.base import Tokenizer
from draftless.sampling import MAX_BIAS, SamplingOptions
from draftless.serve.tools import CallDelta, ToolCall

MAX_STOPS = 16  # stop sequences per request
MAX_REQUEST_REFERENCES = 4  # `references` documents per request
MAX_REFERENCE_CHARS = 1_000_000  # characters per request reference
MAX_SEED = 2**63 - 1
MAX_CHOICES = 16  # `n` at most: choices are generated one after another
MAX_BIASED = 1024  # logit_bias entries per request
MAX_TOOLS = 128  # tools per request (OpenAI's limit)
MAX_GRAMMAR_CHARS = 200_000  # characters of a `grammar`
MIN_ESCAPED = 64  # characters: shorter message texts get no JSON-escaped reference


def _encodable(text: str) -> str:
    """Text the tokenizer can take: JSON may carry a lone surrogate ("\\ud800"), which no
    UTF-8 encoder takes (it was a 500 from deep in the tokenizer)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"text holds an unpaired surrogate (U+{ord(text[exc.start]):04X}) at character "
            f"{exc.start}; it is not valid Unicode"
        ) from None
    return text


# OpenAI fields that ask for what this server does not do. Sent, they are refused (a 400
# naming the field) rather than ignored: a client that asks for log probabilities, a JSON
# schema or tool calls and silently gets plain text is worse off than one told so. Their
# "off" values (false, null, [], "none", {"type": "text"}) pass.
UNSUPPORTED = {
    "functions": "functions and function_call are the old names: send tools and tool_choice",
    "function_call": "functions and function_call are the old names: send tools and tool_choice",
    "echo": "echo is not supported by this server",
    "suffix": "suffix (insertion) is not supported by this server",
    "best_of": "best_of must be 1 (this server generates one choice)",
}


def _asks_for(name: str, value: Any) -> bool:
    """Whether an UNSUPPORTED field's value asks for the feature."""
    if value is None or value is False or value == [] or value == {} or value == "":
        return False
    if name == "function_call":
        return value not in ("none", "auto")  # auto, without functions, is no call
    if name == "best_of":
        return value != 1
    return True


class RequestError(UsageError):
    """A request field the server cannot serve; `param` names it (OpenAI's error `param`)."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


def error_body(
    message: str,
    *,
    type: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class StreamOptions(BaseModel):
    """OpenAI's `stream_options`: `include_usage` adds a last chunk, before `[DONE]`, whose
    `choices` is empty and whose `usage` counts the whole request."""

    model_config = ConfigDict(extra="ignore")  # e.g. vLLM's continuous_usage_stats

    include_usage: bool = False


class JsonSchemaFormat(BaseModel):
    """`response_format.json_schema`: the schema, with OpenAI's name and strict flag."""

    model_config = ConfigDict(extra="ignore")  # description

    name: str | None = None
    schema_: Any = Field(default=None, alias="schema")
    strict: bool | None = None  # the schema is always followed, strict or not

    @field_validator("schema_")
    @classmethod
    def _a_schema(cls, schema: Any) -> Any:
        return _schema(schema)


def _schema(schema: Any) -> Any:
    if schema is not None and not isinstance(schema, dict | bool):
        raise ValueError(f"a JSON schema is an object (or true/false), got {type(schema).__name__}")
    return schema


class ResponseFormat(BaseModel):
    """OpenAI's `response_format`: "text", "json_object" (any JSON object) or "json_schema"
    (`json_schema.schema`); llama-server's `json_object` with a `schema` is taken too."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None
    schema_: Any = Field(default=None, alias="schema")

    @field_validator("schema_")
    @classmethod
    def _a_schema(cls, schema: Any) -> Any:
        return _schema(schema)

    @model_validator(mode="after")
    def _schema_where_its_type_wants_it(self) -> Self:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError('response_format "json_schema" needs its json_schema object')
        if self.type != "json_schema" and self.json_schema is not None:
            raise ValueError(f'response_format "{self.type}" takes no json_schema')
        return self

    def grammar(self) -> GrammarSpec | None:
        if self.json_schema is not None:  # type "json_schema" (validated above)
            schema = self.json_schema.schema_
            return GrammarSpec.json_schema({} if schema is None else schema)
        if self.type == "json_object":
            if self.schema_ is not None:
                return GrammarSpec.json_schema(self.schema_)
            return GrammarSpec.json_object()
        return None


class _Params(BaseModel):
    """Fields shared by chat and text completions (OpenAI's, then the extensions)."""

    model_config = ConfigDict(extra="ignore")  # OpenAI fields this server does not use

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED)
    stop: str | list[str] | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    # extensions (llama-server's names)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    repeat_penalty: float = Field(default=1.0, gt=0.0)
    penalty_last_n: int = Field(default=64, ge=-1)
    stop_token_ids: list[int] | None = None
    references: list[str] | None = Field(default=None, max_length=MAX_REQUEST_REFERENCES)
    # log probabilities: chat's `logprobs: true` and `top_logprobs` (0-20); completions'
    # `logprobs: N` (the alternatives per token, 0-20). See `logprob_top`.
    logprobs: bool | int | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP)
    logit_bias: dict[str, float] | None = None  # token id (as text) -> bias in [-100, 100]
    # structured output: what the answer must follow (see `grammar_spec`)
    response_format: ResponseFormat | None = None
    grammar: str | None = Field(default=None, max_length=MAX_GRAMMAR_CHARS)  # Lark or GBNF
    # UNSUPPORTED: kept to be refused when they ask for something
    functions: list[Any] | None = None
    function_call: str | dict[str, Any] | None = None
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None

    @field_validator(*UNSUPPORTED)
    @classmethod
    def _unsupported(cls, value: Any, info: Any) -> Any:
        if _asks_for(info.field_name, value):
            raise ValueError(UNSUPPORTED[info.field_name])
        return value

    @field_validator("n")
    @classmethod
    def _choices(cls, n: int) -> int:
        if not 1 <= n <= MAX_CHOICES:
            raise ValueError(f"n must be in [1, {MAX_CHOICES}], got {n}")
        return n

    @field_validator("stream_options")
    @classmethod
    def _stream_only(cls, opts: StreamOptions | None, info: ValidationInfo) -> StreamOptions | None:
        if opts is not None and not info.data.get("stream"):
            raise ValueError("stream_options is only allowed when stream is true")
        return opts

    @field_validator("stop")
    @classmethod
    def _stops(cls, stop: str | list[str] | None) -> str | list[str] | None:
        stops = [stop] if isinstance(stop, str) else stop or []
        if len(stops) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop sequences, got {len(stops)}")
        if any(not s for s in stops):
            raise ValueError("a stop sequence must be non-empty text")
        for text in stops:
            _encodable(text)
        return stop

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, bias: dict[str, float] | None) -> dict[str, float] | None:
        if bias is None:
            return None
        if len(bias) > MAX_BIASED:
            raise ValueError(f"at most {MAX_BIASED} tokens, got {len(bias)}")
        for key, value in bias.items():
            try:
                token = int(key)
            except ValueError:
                token = -1
            if token < 0:
                raise ValueError(f"keys are token ids, got {key!r}")
            if not -MAX_BIAS <= value <= MAX_BIAS:  # NaN fails too
                raise ValueError(
                    f"the bias of token {key} must be in [-{MAX_BIAS:g}, {MAX_BIAS:g}], got {value}"
                )
        return bias

    @property
    def bias_pairs(self) -> tuple[tuple[int, float], ...]:
        """logit_bias as the sampler takes it: (token id, bias), ascending ids."""
        return tuple(sorted((int(k), float(v)) for k, v in (self.logit_bias or {}).items()))

    @field_validator("stop_token_ids")
    @classmethod
    def _stop_ids(cls, ids: list[int] | None) -> list[int] | None:
        if ids is not None and any(t < 0 for t in ids):
            raise ValueError("stop_token_ids must be token ids (>= 0)")
        return ids

    @field_validator("references")
    @classmethod
    def _references(cls, refs: list[str] | None) -> list[str] | None:
        for i, text in enumerate(refs or []):
            _encodable(text)
            if len(text) > MAX_REFERENCE_CHARS:
                raise ValueError(
                    f"reference {i} is {len(text):,} characters; the limit is "
                    f"{MAX_REFERENCE_CHARS:,}"
                )
        return refs

    # -- what the engine needs -----------------------------------------------------------
    @property
    def stop_sequences(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def choices(self) -> list[Self]:
        """One request per choice, each generated on its own (n = 1). Choice i draws from
        `seed + i` when a seed is given, so choice 0 is what the request with n = 1 gets and
        the others differ from it; without a seed each draws its own."""
        if self.n == 1:
            return [self]
        seeds = [
            None if self.seed is None else (self.seed + i) % (MAX_SEED + 1) for i in range(self.n)
        ]
        return [self.model_copy(update={"n": 1, "seed": seed}) for seed in seeds]

    @property
    def usage_chunk(self) -> bool:
        """Whether a stream ends with OpenAI's separate usage chunk (`include_usage`)."""
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def grammar_spec(self) -> GrammarSpec | None:
        """What the answer must follow: `response_format` (a JSON schema, any JSON object) or
        llama-server's `grammar` (Lark or GBNF); None: free text."""
        if self.grammar is not None:
            return GrammarSpec("grammar", self.grammar)
        return None if self.response_format is None else self.response_format.grammar()

    @model_validator(mode="after")
    def _one_grammar(self) -> Self:
        fmt = self.response_format
        if self.grammar is not None and fmt is not None and fmt.type != "text":
            raise ValueError("send response_format or grammar, not both")
        return self

    @property
    def token_limit(self) -> int | None:
        """max_completion_tokens (the newer name) or max_tokens; None: up to the context."""
        return self.max_completion_tokens or self.max_tokens

    def to_sampling(self) -> SamplingOptions:
        return SamplingOptions(
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            min_p=self.min_p,
            repeat_penalty=self.repeat_penalty,
            frequency_penalty=self.frequency_penalty,
            presence_penalty=self.presence_penalty,
            penalty_last_n=self.penalty_last_n,
            seed=self.seed,
            logit_bias=self.bias_pairs,
        )


def _longest(texts: set[str]) -> list[str]:
    """The texts of at least MIN_ESCAPED characters, longest first (then in text order, so
    the index's reference names do not depend on set order), at most
    MAX_REQUEST_REFERENCES."""
    long = [t for t in texts if len(t) >= MIN_ESCAPED]
    return sorted(long, key=lambda t: (-len(t), t))[:MAX_REQUEST_REFERENCES]


def _strings_in(value: Any) -> list[str]:
    """Every string value in a decoded JSON document (keys aside), depth first."""
    out: list[str] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return out


class TextPart(BaseModel):
    type: str
    text: str

    @field_validator("type")
    @classmethod
    def _text_only(cls, kind: str) -> str:
        if kind != "text":  # image_url, input_audio, file: a model of text alone cannot
            raise ValueError(f"content parts of type {kind!r} are not supported (text only)")
        return kind

    @field_validator("text")
    @classmethod
    def _text(cls, text: str) -> str:
        return _encodable(text)


class FunctionDef(BaseModel):
    """A tool the model may call: its name, what it does and its JSON-schema parameters."""

    model_config = ConfigDict(extra="allow")  # e.g. strict: passed to the template as sent

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(BaseModel):
    type: Literal["function"]
    function: FunctionDef


class FunctionCall(BaseModel):
    name: str
    arguments: str  # a JSON object, as text (OpenAI's shape)

    @field_validator("arguments")
    @classmethod
    def _object(cls, arguments: str) -> str:
        try:
            value = json.loads(arguments)
        except ValueError:
            value = None
        if not isinstance(value, dict):
            raise ValueError("arguments must be a JSON object, as text")
        return arguments


class MessageToolCall(BaseModel):
    """A call an earlier assistant message made, sent back with the conversation."""

    model_config = ConfigDict(extra="ignore")

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[MessageToolCall] | None = None  # an assistant's calls
    tool_call_id: str | None = None  # a tool message: the call it answers

    @field_validator("content")
    @classmethod
    def _content(cls, content: str | list[TextPart] | None) -> str | list[TextPart] | None:
        return _encodable(content) if isinstance(content, str) else content

    @model_validator(mode="after")
    def _roles(self) -> Self:
        if self.tool_calls and self.role != "assistant":
            raise ValueError(f"tool_calls belong to assistant messages, not {self.role}")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs the tool_call_id of the call it answers")
        return self

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)

    def for_template(self) -> dict[str, Any]:
        """The message as chat templates take it: OpenAI's roles ("developer" is "system"),
        the content as text, and a call's arguments as an object (Qwen's and Hermes'
        templates write `arguments | tojson`)."""
        message: dict[str, Any] = {
            "role": "system" if self.role == "developer" else self.role,
            "content": self.text(),
        }
        if self.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {
                        "name": call.function.name,
                        "arguments": json.loads(call.function.arguments),
                    },
                }
                for call in self.tool_calls
            ]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


class ChatRequest(_Params):
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[Tool] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None  # every call the model writes is returned

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(
        cls, choice: str | dict[str, Any] | None, info: ValidationInfo
    ) -> str | dict[str, Any] | None:
        name = None
        if isinstance(choice, dict):
            function = choice.get("function")
            name = function.get("name") if isinstance(function, dict) else None
            if choice.get("type") != "function" or not isinstance(name, str):
                raise ValueError(
                    'a named tool_choice is {"type": "function", "function": {"name": ...}}'
                )
        tools = info.data.get("tools") or []
        if (choice == "required" or name is not None) and not tools:
            raise ValueError("tool_choice asks for a call, and the request offers no tools")
        if name is not None and name not in [t.function.name for t in tools]:
            raise ValueError(f"tool_choice names {name!r}, which is not one of the tools")
        return choice

    @property
    def required_call(self) -> tuple[bool, str | None]:
        """(whether the answer must be a tool call, the function it must call or None: any)
        from tool_choice "required" or a named function."""
        choice = self.tool_choice
        if isinstance(choice, dict):
            return True, choice["function"]["name"]
        return choice == "required", None

    @property
    def offered_tools(self) -> list[dict[str, Any]] | None:
        """The tools as the chat template takes them; None when there are none to call
        (no tools, or tool_choice "none")."""
        if not self.tools or self.tool_choice == "none":
            return None
        return [t.model_dump(exclude_none=True) for t in self.tools]

    @property
    def tool_names(self) -> list[str]:
        return [t.function.name for t in self.tools or ()]

    def escaped_contents(self) -> list[str]:
        """The messages' texts as they read inside a JSON string, where a tool call copies
        them (a file read by one tool and written back by another): newlines as `\\n`,
        quotes as `\\"`. Only the long ones that escaping changes: the others the index
        already holds as the prompt. Longest first, at most MAX_REQUEST_REFERENCES."""
        escaped = set()
        for text in {m.text() for m in self.messages}:
            if len(text) < MIN_ESCAPED:  # the escaped text's length alone would let more in
                continue
            inside = json.dumps(text, ensure_ascii=False)[1:-1]
            if inside != text:
                escaped.add(inside)
        return _longest(escaped)

    def json_strings(self) -> list[str]:
        """The other way round: the long strings inside a message that is JSON (a tool's
        result: an API's answer, a file read as {"path": ..., "content": ...}) as plain text,
        which an answer quoting them writes and the prompt holds only escaped. Longest first,
        at most MAX_REQUEST_REFERENCES."""
        found: set[str] = set()
        for message in self.messages:
            text = message.text()
            if len(text) < MIN_ESCAPED or text.lstrip()[:1] not in ("{", "["):
                continue
            try:
                value = json.loads(text)
            except ValueError:
                continue
            found.update(s for s in _strings_in(value) if s not in text)
        return _longest(found)

    @field_validator("logprobs")
    @classmethod
    def _chat_logprobs(cls, value: bool | int | None) -> bool | int | None:
        if value is not None and not isinstance(value, bool):
            raise ValueError("logprobs is true or false on /v1/chat/completions")
        return value

    @field_validator("top_logprobs")
    @classmethod
    def _top_needs_logprobs(cls, top: int | None, info: ValidationInfo) -> int | None:
        if top and not info.data.get("logprobs"):
            raise ValueError("top_logprobs needs logprobs: true")
        return top

    @property
    def logprob_top(self) -> int | None:
        """Alternatives to report per token; None: no log probabilities asked for."""
        return (self.top_logprobs or 0) if self.logprobs else None

    def chat(self) -> list[dict[str, Any]]:
        """The messages as the chat template wants them (see ChatMessage.for_template)."""
        return [m.for_template() for m in self.messages]


class CompletionRequest(_Params):
    # one prompt: text, or token ids (OpenAI's array of tokens), alone or in a list of one
    prompt: str | list[str] | list[StrictInt] | list[list[StrictInt]]
    tools: list[Any] | None = None  # refused: tools are for chat completions
    tool_choice: str | dict[str, Any] | None = None

    @field_validator("tools", "tool_choice")
    @classmethod
    def _chat_only(cls, value: Any) -> Any:
        if value not in (None, [], "none", "auto"):
            raise ValueError("tools are for /v1/chat/completions")
        return value

    @field_validator("logprobs")
    @classmethod
    def _completion_logprobs(cls, value: bool | int | None) -> bool | int | None:
        if value is False or value is None:
            return None
        if isinstance(value, bool) or not 0 <= value <= MAX_TOP:
            raise ValueError(f"logprobs is a count in [0, {MAX_TOP}] on /v1/completions")
        return value

    @property
    def logprob_top(self) -> int | None:
        """Alternatives to report per token; None: no log probabilities asked for."""
        return None if self.logprobs is None else int(self.logprobs)

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, prompt: Any) -> Any:
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
            if any(t < 0 for t in prompt):
                raise ValueError("token ids are >= 0")
            return prompt
        if isinstance(prompt, list) and len(prompt) != 1:
            raise ValueError(f"prompt must be one prompt, got a list of {len(prompt)}")
        one = prompt if isinstance(prompt, str) else prompt[0]
        if isinstance(one, list):
            if not one:
                raise ValueError("the prompt is empty")
            return cls._one_prompt(one)
        if not _encodable(one).strip():
            raise ValueError("the prompt is empty")
        return prompt

    def token_ids(self) -> list[int] | None:
        """The prompt's token ids when it was sent as ids (None: it is text)."""
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
            prompt = prompt[0]
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
            return [int(t) for t in prompt]
        return None

    def text(self) -> str:
        prompt = self.prompt
        return prompt if isinstance(prompt, str) else str(prompt[0])


# -- responses --------------------------------------------------------------------------
def _token(tokenizer: Tokenizer, token_id: int) -> tuple[str, list[int] | None]:
    """A token's text and its UTF-8 bytes (None where the token is part of a character,
    which its text alone cannot carry)."""
    text = tokenizer.decode([token_id], skip_special=False)
    return text, None if "\ufffd" in text else list(text.encode("utf-8"))


def chat_logprobs(entries: Sequence[TokenLogprob], tokenizer: Tokenizer) -> dict[str, Any]:
    """A chat choice's `logprobs`: {"content": [{token, logprob, bytes, top_logprobs}]}."""
    content = []
    for e in entries:
        text, raw = _token(tokenizer, e.token_id)
        top = []
        for token_id, logprob in e.top:
            alt, alt_raw = _token(tokenizer, token_id)
            top.append({"token": alt, "logprob": logprob, "bytes": alt_raw})
        content.append({"token": text, "logprob": e.logprob, "bytes": raw, "top_logprobs": top})
    return {"content": content, "refusal": None}


def completion_logprobs(
    entries: Sequence[TokenLogprob], tokenizer: Tokenizer, offset: int = 0
) -> dict[str, Any]:
    """A completion choice's `logprobs` (the legacy shape): tokens, token_logprobs,
    top_logprobs ({text: logprob}, the likelier kept where two decode alike) and
    text_offset (where each token's text starts in the completion, from `offset`)."""
    tokens: list[str] = []
    offsets: list[int] = []
    tops: list[dict[str, float]] = []
    for e in entries:
        offsets.append(offset)
        text = _token(tokenizer, e.token_id)[0]
        tokens.append(text)
        offset += len(text)
        alts: dict[str, float] = {}
        for token_id, logprob in e.top:
            alts.setdefault(_token(tokenizer, token_id)[0], logprob)
        tops.append(alts)
    return {
        "tokens": tokens,
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": tops,
        "text_offset": offsets,
    }


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _body(
    kind: str, rid: str, model: str, choice: dict[str, Any], index: int = 0
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": index, **choice}],
    }


def message(text: str, calls: Sequence[ToolCall] = ()) -> dict[str, Any]:
    """A whole chat choice's message; with tool calls, content is null unless the model
    wrote text beside them (as OpenAI answers)."""
    if not calls:
        return {"role": "assistant", "content": text}
    content = text or None  # the parser keeps no whitespace around calls
    return {"role": "assistant", "content": content, "tool_calls": [c.to_wire() for c in calls]}


def response(
    chat: bool,
    rid: str,
    model: str,
    choices: Sequence[tuple[str, str, dict[str, Any] | None, Sequence[ToolCall]]],
    use: dict[str, int],
    stats: dict[str, Any],
) -> dict[str, Any]:
    """A whole chat completion (`chat`) or text completion: one (text, finish_reason,
    logprobs, tool calls) per choice."""
    kind = "chat.completion" if chat else "text_completion"
    body = _body(kind, rid, model, {}) | {"usage": use, "draftless": stats}
    body["choices"] = [
        {
            "index": i,
            **({"message": message(text, calls)} if chat else {"text": text}),
            "finish_reason": finish,
            "logprobs": logprobs,
        }
        for i, (text, finish, logprobs, calls) in enumerate(choices)
    ]
    return body


def tool_calls_chunk(
    rid: str, model: str, calls: Sequence[ToolCall], index: int = 0
) -> dict[str, Any]:
    """A streamed chat chunk that carries a choice's tool calls, each whole (a client joins
    the `arguments` of deltas with the same call index, so one delta per call is a stream)."""
    delta = {"tool_calls": [c.to_wire(i) for i, c in enumerate(calls)]}
    choice = {"delta": delta, "finish_reason": None, "logprobs": None}
    return _body("chat.completion.chunk", rid, model, choice, index)


def call_deltas_chunk(
    rid: str, model: str, deltas: Sequence[CallDelta], index: int = 0
) -> dict[str, Any]:
    """A streamed chat chunk with pieces of tool calls as they are written."""
    delta = {"tool_calls": [d.to_wire() for d in deltas]}
    choice = {"delta": delta, "finish_reason": None, "logprobs": None}
    return _body("chat.completion.chunk", rid, model, choice, index)


def usage_chunk(chat: bool, rid: str, model: str, use: dict[str, int]) -> dict[str, Any]:
    """A stream's last chunk under `include_usage`: no choices, the whole request's usage."""
    kind = "chat.completion.chunk" if chat else "text_completion"
    return _body(kind, rid, model, {}) | {"choices": [], "usage": use}


def chunk(
    chat: bool,
    rid: str,
    model: str,
    text: str | None,
    finish: str | None = None,
    extra: dict[str, Any] | None = None,
    logprobs: dict[str, Any] | None = None,
    index: int = 0,
) -> dict[str, Any]:
    """A streamed piece of choice `index` of either: `text` (None: a chat's first chunk,
    which names the role; a chat's last, with `finish`, has an empty delta)."""
    if not chat:
        content: dict[str, Any] = {"text": text or ""}
    elif text is None:
        content = {"delta": {"role": "assistant", "content": ""}}
    else:
        content = {"delta": {"content": text} if finish is None else {}}
    choice = content | {"finish_reason": finish, "logprobs": logprobs}
    kind = "chat.completion.chunk" if chat else "text_completion"
    return _body(kind, rid, model, choice, index) | (extra or {})
