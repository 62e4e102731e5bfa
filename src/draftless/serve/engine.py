"""The engine: where the server's concurrency is decided, once.

One worker thread owns the model (tokenizer included) and serves requests one at a time, in
arrival order, from a queue. An HTTP handler never touches the model: it submits a `Job` and
awaits what the worker sends on the job's channel (an asyncio.Queue fed through
`loop.call_soon_threadsafe`, the one thread-safe way into an event loop):

    Started(prompt_tokens, reused_tokens)   the prompt is in the cache
    "text", "text", ...                      streamed pieces (streaming requests only;
                                             Piece(text, logprobs) when they asked for those)
    Finished(...)                            the end, with usage and speculation stats
    an exception                             instead of any of these (the request's error)

A request may wait; it is never interleaved with another. A handler whose client went away
sets `job.cancelled`; the worker checks it between decoder steps and drops the run there,
freeing the model for the next request.

Each request runs on the same SpeculativeDecoder (`restart` keeps the KV cache of the prompt's
longest common prefix with the previous request's stream) with a fresh SpeculationIndex over
its prompt, its own `references`, the server's --spec-ref documents and the cross-request
history (serve/history.py). The text, the stops and the stop reasons come from the CLI's
`generate_text`, the loop `draftless generate` runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from draftless.constraint import Constraint, Triggered
from draftless.decoder import GRAMMAR, SpecOptions, SpeculativeDecoder
from draftless.errors import UserError
from draftless.grammar import GrammarError, GrammarSpec, compile_grammar
from draftless.logprobs import LogprobRecorder, TokenLogprob
from draftless.metrics import MemberStats
from draftless.models.base import ContextFull, Model, Tokenizer
from draftless.serve import protocol as wire
from draftless.serve.history import DEFAULT_INDEX_BUDGET, RequestHistory
from draftless.serve.metrics import Metrics
from draftless.serve.protocol import ChatRequest, CompletionRequest, RequestError
from draftless.serve.tools import (
    HERMES_CLOSE,
    HERMES_OPEN,
    AutoCallStream,
    CallDelta,
    ForcedCallStream,
    ToolCall,
    auto_call_grammar,
    call_grammar,
    opens_call,
)
from draftless.serve.tools import parse as parse_tool_calls
from draftless.sources.cascade import SpeculationIndex
from draftless.text import generate_text

NO_LIMIT = 1 << 30  # tokens: "until the context ends" for a backend that does not say


@dataclass(frozen=True, slots=True)
class Started:
    prompt_tokens: int
    reused_tokens: int  # prompt tokens whose cache rows were kept from the previous request


@dataclass(frozen=True, slots=True)
class Piece:
    """Streamed text with the log probabilities of the tokens taken since the last piece."""

    text: str
    logprobs: dict[str, Any]  # the chunk's choice `logprobs`, in the endpoint's shape


@dataclass(frozen=True, slots=True)
class Finished:
    text: str
    finish_reason: str  # OpenAI's: "stop" (eos, stop id or stop text) or "length"
    prompt_tokens: int
    completion_tokens: int  # the stop token included, as llama.cpp counts
    stats: dict[str, Any]  # the response's `draftless` object
    # the choice's `logprobs` (a stream's last chunk: of the tokens not sent yet); None
    # when the request did not ask for them
    logprobs: dict[str, Any] | None = None
    # the calls in the text (a request with tools); `text` is then the text around them
    tool_calls: tuple[ToolCall, ...] = ()
    calls_sent: bool = False  # a stream sent them as they were written (`CallDeltas`)


@dataclass(frozen=True, slots=True)
class CallDeltas:
    """Streamed pieces of tool calls (a forced call's name, then its arguments as written)."""

    deltas: tuple[CallDelta, ...]


class Cancelled(Exception):
    """The client went away, or the server is shutting down."""


class ServerClosing(UserError):
    """The server is shutting down and takes no new requests."""


@dataclass(eq=False)
class Job:
    params: ChatRequest | CompletionRequest
    loop: asyncio.AbstractEventLoop
    channel: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    arrived: float = field(default_factory=time.perf_counter)

    @property
    def stream(self) -> bool:
        return self.params.stream

    def send(self, item: Any) -> None:
        """From the worker thread to the handler's event loop."""
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody listens any more
            self.loop.call_soon_threadsafe(self.channel.put_nowait, item)


class Engine:
    """Serves jobs on one model from one worker thread; see the module docstring."""

    def __init__(
        self,
        model: Model,
        *,
        spec: bool = True,
        references: Sequence[str] = (),
        index_budget: int = DEFAULT_INDEX_BUDGET,
        options: SpecOptions | None = None,
        metrics: Metrics | None = None,
        edits: bool = True,
    ) -> None:
        self.model = model
        self.spec = spec
        self.edits = edits  # carry edits learned from the stream into drafts
        self.metrics = metrics or Metrics()
        self.references = [model.tokenizer.encode(text) for text in references]
        self.history = RequestHistory(index_budget if spec else 0)
        self.metrics.index_budget.set(self.history.budget)
        self.decoder = SpeculativeDecoder(model, options=options)
        self.n_ctx: int | None = model.n_ctx
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self._closed = False
        self._current: Job | None = None
        self.cancelled_runs = 0
        self.cancelled_tokens = 0  # tokens the last cancelled run generated before it stopped
        self.cancelled_prefills = 0  # requests cancelled while their prompt was prefilled
        self._worker = threading.Thread(target=self._loop, name="draftless-engine", daemon=True)
        self._worker.start()

    # -- the handlers' side ----------------------------------------------------------------
    def submit(self, job: Job) -> None:
        with self._lock:
            if self._closed:
                raise ServerClosing("the server is shutting down")
            self._queue.put(job)
            self.metrics.queue_depth.set(self._queue.qsize())

    def close(self, timeout: float | None = 30.0) -> None:
        """Refuse new jobs, cancel the waiting and the running one, stop the worker."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            while True:
                try:
                    job = self._queue.get_nowait()
                except queue.Empty:
                    break
                if job is not None:
                    job.cancelled.set()
                    job.send(Cancelled("the server is shutting down"))
            current = self._current
            if current is not None:
                current.cancelled.set()
            self._queue.put(None)
        self._worker.join(timeout)
        self.metrics.queue_depth.set(0)

    @property
    def alive(self) -> bool:
        return self._worker.is_alive() and not self._closed

    # -- the worker ------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            job = self._queue.get()
            self.metrics.queue_depth.set(self._queue.qsize())
            if job is None:
                return
            if job.cancelled.is_set():
                job.send(Cancelled("cancelled before it started"))
                continue
            self._current = job
            try:
                job.send(self._serve(job))
            except Cancelled as err:
                job.send(err)  # the decoder stopped between steps: its state is whole
            except Exception as err:  # the request's error, reported to it alone
                if not isinstance(err, UserError):
                    self.decoder.reset()  # an unexpected failure: trust no cached row
                job.send(err)
            finally:
                self._current = None

    def _serve(self, job: Job) -> Finished:
        p, model, dec = job.params, self.model, self.decoder
        tok = model.tokenizer
        tools, tool_names, views = None, [], []
        if isinstance(p, ChatRequest):
            tools, tool_names = p.offered_tools, p.tool_names
            if tools is not None or any(m.role == "tool" for m in p.messages):
                views = p.escaped_contents() + p.json_strings()
            ids, what = tok.apply_chat_template(p.chat(), tools=tools), "messages"
            if tools is not None and ids == tok.apply_chat_template(p.chat()):
                raise RequestError(
                    f"the chat template of {model.name} has no place for tools (it renders "
                    "the same with them and without), so the model would never see them",
                    "tools",
                )
        else:
            what, sent = "prompt", p.token_ids()
            ids = tok.encode(p.text(), add_special=True) if sent is None else sent
            if sent is not None and max(sent) >= model.vocab_size:
                raise RequestError(
                    f"prompt: {max(sent)} is not a token id of this model [0, {model.vocab_size})",
                    what,
                )
        if not ids:
            raise RequestError("the prompt is empty", what)
        if self.n_ctx is not None and len(ids) >= self.n_ctx:
            raise RequestError(
                f"the prompt is {len(ids):,} tokens; the context holds {self.n_ctx:,} "
                "(the prompt and at least one generated token)",
                what,
                "context_length_exceeded",
            )
        stop_ids = frozenset(p.stop_token_ids or ())
        biased = [t for t, _ in p.bias_pairs]
        for param, asked in (("stop_token_ids", stop_ids), ("logit_bias", biased)):
            bad = sorted(t for t in asked if t >= model.vocab_size)
            if bad:
                raise RequestError(
                    f"{param}: {bad[0]} is not a token id of this model [0, {model.vocab_size})",
                    param,
                )
        eos = model.eos_token_ids | stop_ids
        constraint: Constraint | None = None
        spec, param = p.grammar_spec, "grammar" if p.grammar is not None else "response_format"
        if isinstance(p, ChatRequest) and p.required_call[0]:
            spec, param = self._call_grammar(p, ids, spec), "tools"
        if spec is not None:
            try:  # before the prefill: a schema it cannot compile costs the model nothing
                constraint = compile_grammar(model, spec, eos)
            except GrammarError as err:
                raise RequestError(str(err), param) from None
        elif isinstance(p, ChatRequest) and tools is not None:  # "auto": a call's grammar
            constraint = self._auto_call_grammar(p, ids, eos)  # holds once the model opens one
        source, names = self._source(p.references or [], views) if self.spec else (None, [])
        started = time.perf_counter()

        def unless_cancelled() -> None:  # between pieces of the prefill
            if job.cancelled.is_set():
                raise Cancelled("the client went away")

        try:
            reused = dec.restart(
                ids,
                sampling=p.to_sampling(),
                source=source,
                between=unless_cancelled,
                constraint=constraint,
            )
        except ContextFull as err:
            raise RequestError(str(err), what, "context_length_exceeded") from None
        except Cancelled:
            self.cancelled_prefills += 1
            self.metrics.cancelled.inc()
            raise
        prefill_seconds = time.perf_counter() - started
        job.send(Started(len(ids), reused))

        room = self.n_ctx - (len(ids) - 1) if self.n_ctx is not None else NO_LIMIT
        limit = min(p.token_limit or room, room)  # never a forward past the context's end
        shown: list[str] = []
        calls: AutoCallStream | ForcedCallStream | None = None
        if tools is not None and job.stream:  # a forced answer is nothing but calls: each
            forced = isinstance(p, ChatRequest) and p.required_call[0]  # sent as written
            calls = ForcedCallStream() if forced else AutoCallStream(tool_names)
        opened = constraint if isinstance(constraint, Triggered) else None
        top = p.logprob_top
        logprobs = None if top is None else _Logprobs(p, LogprobRecorder(dec, top), tok, len(ids))

        def show(piece: str) -> None:
            shown.append(piece)
            if isinstance(calls, ForcedCallStream):
                deltas = calls.feed(piece)
                if deltas:
                    job.send(CallDeltas(tuple(deltas)))
                return
            if calls is not None:  # text that may open a tool call waits for the end; from
                # where the calls' grammar holds, calls go as they are written
                if opened is not None and opened.opened_at is not None and not calls.told:
                    before = dec.history[len(ids) : len(ids) + opened.opened_at]
                    calls.open_at(len(tok.decode(before, skip_special=True)))
                piece, deltas = calls.feed(piece)
                if deltas:
                    job.send(CallDeltas(tuple(deltas)))
            if job.stream and piece:
                job.send(piece if logprobs is None else Piece(piece, logprobs.next()))

        def emit(piece: str) -> None:  # called between decoder steps, with safe text
            if job.cancelled.is_set():
                raise Cancelled("the client went away")
            show(piece)

        t0 = time.perf_counter()
        try:
            run = generate_text(
                dec,
                limit,
                eos,
                p.stop_sequences,
                emit,
                interrupt=job.cancelled.is_set,
                on_token=None if logprobs is None else logprobs.took,
            )
            if run.stop_reason == "interrupted":  # polled between steps, shown text or not
                raise Cancelled("the client went away")
            text, tokens, reason = run.text, run.token_ids, run.stop_reason
        except Cancelled:
            self.cancelled_runs += 1
            self.cancelled_tokens = len(dec.history) - len(ids)  # generated before the stop
            self.metrics.cancelled.inc()
            raise
        except ContextFull:  # a backend that does not tell its context size: its end
            tokens = dec.history[len(ids) :]
            text, reason = tok.decode(tokens, skip_special=True), "length"
            done = "".join(shown)
            if text.startswith(done) and len(text) > len(done):
                show(text[len(done) :])
        finally:
            if logprobs is not None:
                logprobs.recorder.close()
        seconds = time.perf_counter() - t0
        if self.spec:
            self.history.add([*ids, *tokens])
        queued = started - job.arrived
        times = (queued, prefill_seconds, seconds)
        stats = self._stats(reason, len(ids), reused, len(tokens), times, names)
        self._record(len(ids), reused, len(tokens), stats["edits"])
        finish = "length" if reason in ("length", "context") else "stop"
        found: tuple[ToolCall, ...] = ()
        sent_calls = False
        if isinstance(calls, ForcedCallStream):  # streamed call by call, as written
            sent_calls = calls.calls > 0
            found = parse_tool_calls(text, tool_names).calls
            text = ""
        elif calls is not None:  # streamed: what the stream held back, then the calls
            held, found = calls.finish()
            if held:
                job.send(held)  # its log probabilities come with the last chunk
            if calls.calls is not None:  # from where the grammar held, sent as written
                sent_calls = calls.sent_calls
                found = parse_tool_calls(text, tool_names).calls
        elif tools is not None:
            parsed = parse_tool_calls(text, tool_names)
            text, found = parsed.content or "", parsed.calls
        if found and finish != "length":  # a run cut by the limit says so, calls or not
            finish = "tool_calls"
        # a stop id ends the run but is no text: it has no log probability to show
        shown_tokens = len(tokens) - (reason == "stop")
        rest = None
        if logprobs is not None:
            rest = logprobs.next(shown_tokens, whole=not job.stream)
        return Finished(text, finish, len(ids), len(tokens), stats, rest, found, sent_calls)

    def _call_grammar(
        self, p: ChatRequest, ids: Sequence[int], other: GrammarSpec | None
    ) -> GrammarSpec:
        """The grammar of the call(s) tool_choice asks for, in the Hermes form the template
        tells the model to write (`tools.call_grammar`)."""
        if other is not None:
            raise RequestError(
                "tool_choice asks for a tool call and response_format (or grammar) for "
                "something else; send one",
                "tool_choice",
            )
        if HERMES_OPEN not in self.model.tokenizer.decode(ids):
            raise RequestError(
                f"tool_choice {p.tool_choice!r} needs a chat template that asks for calls as "
                f"{HERMES_OPEN} (the Hermes form, as Qwen 2.5's); the template of "
                f"{self.model.name} does not, so send 'auto'",
                "tool_choice",
            )
        _, only = p.required_call  # a named function: one call of it
        many = only is None and p.parallel_tool_calls is not False
        tags = tuple(self._one_token(tag) for tag in (HERMES_OPEN, HERMES_CLOSE))
        grammar = call_grammar(p.offered_tools or [], only, many, (tags[0], tags[1]))
        return GrammarSpec("lark", grammar)

    def _auto_call_grammar(
        self, p: ChatRequest, ids: Sequence[int], eos: frozenset[int]
    ) -> Triggered | None:
        """Under tool_choice "auto", the grammar of calls (`tools.auto_call_grammar`) from where
        the model opens one (as llama.cpp's lazy grammars): it writes `<tool_call>`, or its
        answer begins with a call of one of the request's tools (`{"name": "get_weather"`,
        bare or in a fence). Before that the answer is free text; after it, whole calls.
        None where the template asks for no Hermes calls, or a tool's schema is one the
        grammar engine cannot compile (calls are then parsed as written, as before)."""
        tok = self.model.tokenizer
        if HERMES_OPEN not in tok.decode(ids):
            return None
        tags = (self._one_token(HERMES_OPEN), self._one_token(HERMES_CLOSE))
        many = p.parallel_tool_calls is not False
        grammar = auto_call_grammar(p.offered_tools or [], many, tags)
        try:
            then = compile_grammar(self.model, GrammarSpec("lark", grammar), eos)
        except GrammarError:
            return None
        names = frozenset(p.tool_names)

        def opens(tokens: Sequence[int]) -> bool | None:
            return opens_call(tok.decode(tokens, skip_special=True), names)

        return Triggered(then, tags[0], opens)

    def _one_token(self, text: str) -> int | None:
        """The id of the one token that spells `text`, if the vocabulary has one."""
        ids = self.model.tokenizer.encode(text)
        return ids[0] if len(ids) == 1 else None

    def _source(self, texts: Sequence[str], views: Sequence[str] = ()) -> tuple[Any, list[str]]:
        """A fresh SpeculationIndex with the server's references, the cross-request history,
        the request's references and `views` (in a conversation with tools, its messages as
        the text of JSON strings, which a call's arguments copy, and the strings inside JSON
        messages as text, which an answer quotes); and the names of those references, in
        order."""
        docs: list[Any] = list(self.references)  # server-wide first: their gates' names
        names = [f"server[{i}]" for i in range(len(docs))]  # stay the same across requests
        past = self.history.reference()
        if past is not None:
            docs.append(past)
            names.append("history")
        docs += [self.model.tokenizer.encode(text) for text in texts]
        names += [f"request[{i}]" for i in range(len(texts))]
        docs += [self.model.tokenizer.encode(text) for text in views]
        names += [f"json[{i}]" for i in range(len(views))]
        index = SpeculationIndex(
            self.model.vocab_size, max_references=max(8, len(docs)), edits=self.edits
        )
        for doc in docs:
            index.add_reference(doc)
        return index, names

    def _stats(
        self,
        reason: str,
        prompt_tokens: int,
        reused: int,
        completion_tokens: int,
        times: tuple[float, float, float],  # seconds queued, prefilling, decoding
        names: list[str],
    ) -> dict[str, Any]:
        queued, prefill_seconds, seconds = times
        dec = self.decoder
        s = dec.stats
        sources = []
        members = dec.source.members() if isinstance(dec.source, SpeculationIndex) else ()
        if GRAMMAR in s.members:  # the tokens a response_format's grammar forced
            members = (*members, GRAMMAR)
        for member in members:
            counts = s.members.get(member, MemberStats())
            name = member
            if name.startswith("reference["):
                name = names[int(name[len("reference[") : -1])]
            sources.append({"name": name, "drafted": counts.drafted, "accepted": counts.accepted})
        return {
            "spec": self.spec,
            "stop_reason": reason,  # "stop" (eos / stop id), "stop_sequence" or "length"
            "steps": s.steps,
            "verify_steps": s.verify_steps,
            "plain_steps": s.plain_steps,
            "committed": s.committed,
            "drafted": s.drafted,
            "accepted": s.accepted,
            "acceptance": round(s.acceptance, 4),
            "tokens_per_step": round(s.tokens_per_step, 4),
            "sources": sources,
            "edits": dec.source.edit_stats() if isinstance(dec.source, SpeculationIndex) else None,
            "seed": dec.seed,
            "prompt_tokens": prompt_tokens,
            "reused_tokens": reused,
            "queue_seconds": round(queued, 4),
            "prefill_seconds": round(prefill_seconds, 4),
            "decode_seconds": round(seconds, 4),
            "decode_tokens_per_second": round(completion_tokens / seconds, 2) if seconds else 0.0,
            "index_tokens": self.history.n_tokens,
        }

    def _record(
        self, prompt_tokens: int, reused: int, completion_tokens: int, edits: dict[str, int] | None
    ) -> None:
        m, s = self.metrics, self.decoder.stats
        m.prompt_tokens.inc(prompt_tokens)
        m.reused_tokens.inc(reused)
        m.completion_tokens.inc(completion_tokens)
        m.record_decode(s.drafted, s.accepted, s.steps, s.verify_steps)
        if edits is not None:  # the learner's counts in this request's stats
            m.edits_learned.inc(edits["learned"])
        m.index_bytes.set(self.history.charged_bytes)
        m.index_tokens.set(self.history.n_tokens)


class _Logprobs:
    """A request's log probabilities, handed out in the endpoint's shape as the text goes:
    each streamed piece carries the tokens taken since the last one."""

    def __init__(
        self,
        params: ChatRequest | CompletionRequest,
        recorder: LogprobRecorder,
        tokenizer: Tokenizer,
        start: int,
    ) -> None:
        self.chat = isinstance(params, ChatRequest)
        self.recorder = recorder
        self.tokenizer = tokenizer
        self.start = start  # the first generated token's position in the decoder's history
        self.taken = 0  # tokens the text has taken so far
        self.sent = 0  # tokens whose log probabilities went out
        self.offset = 0  # characters of the completion before the next token (completions)

    def took(self, n: int) -> None:
        self.taken = n

    def next(self, upto: int | None = None, *, whole: bool = False) -> dict[str, Any]:
        """The shape for the tokens taken since the last call (up to `upto`); `whole`: all
        of them, from the first."""
        end = self.taken if upto is None else upto
        first = 0 if whole else self.sent
        entries = self.recorder.entries(self.start + first, self.start + end) if end > first else []
        self.sent = max(self.sent, end)
        return self._shape(entries, whole)

    def _shape(self, entries: list[TokenLogprob], whole: bool) -> dict[str, Any]:
        if self.chat:
            return wire.chat_logprobs(entries, self.tokenizer)
        body = wire.completion_logprobs(entries, self.tokenizer, 0 if whole else self.offset)
        if not whole and entries:
            self.offset = body["text_offset"][-1] + len(body["tokens"][-1])
        return body
