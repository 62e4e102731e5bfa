"""Multi-turn chat over any model and tokenizer, plain or speculative.

The committed token stream is the source of truth: the model's cache, the decoder's history
and the draft index all hold exactly that stream; the messages exist only to render the chat
template. One turn renders the template for the messages plus the new user message, appends
to the stream only the template's *delta* (what follows the end-of-turn token of the previous
reply), decodes the reply, and keeps its text as the assistant message.

Worked example (ChatML, `|` between tokens). Turn 1 commits
`<|im_start|>|user|\\n|hi|<|im_end|>|\\n|<|im_start|>|assistant|\\n`; the model commits
`Hel|lo|<|im_end|>`. Turn 2's rendering starts with turn 1's up to its generation prompt; the
first end-of-turn token after it closes the assistant message, which the stream already ends
with, so the delta is `\\n|<|im_start|>|user|\\n|more|<|im_end|>|\\n|<|im_start|>|assistant|\\n`.
The stream keeps `Hel|lo`, the tokens the model chose, not the template's tokenization of
"Hello". A template that rewrites earlier turns cannot be diffed: the turn then *rebuilds*
from the longest common prefix (and rebuilds the index, which cannot forget).

Stops: end-of-generation ids and `extra_stop_ids` end a reply inside the decoder's acceptance
loop, so they are exact with speculation. Text `stop_sequences` trim the reply after decoding:
the stream is cut back to the reply's text, and with speculation, where a verify can accept
tokens past the one that completed the sequence, the RNG is rewound by the draws made for
those, so the next turn goes on exactly as plain decoding would. The context's end ends a
reply with stop reason "context".

Interruption: `stream(..., interrupt=flag)` polls `flag()` between decoder steps; the turn
keeps what was committed. An exception inside a step leaves the step undone (the decoder's
guarantee) and propagates. `check_integrity()` asserts that cache, history and index agree.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from draftless.costs import CostTable
from draftless.decoder import SpecOptions, SpeculativeDecoder
from draftless.errors import UserError
from draftless.metrics import DecodeStats
from draftless.models.base import Model, ModelError
from draftless.sampling import SamplingOptions, rewind
from draftless.sources.base import Draft, DraftSource, check_source
from draftless.sources.cascade import SpeculationIndex
from draftless.text import StreamDecoder, TextStops

__all__ = [
    "ChatError",
    "ContextFullError",
    "Conversation",
    "EmptyMessageError",
    "Reply",
    "SpeculationRequiredError",
    "TurnGate",
]

DEFAULT_MAX_NEW_TOKENS = 512

# stop: an end-of-generation or extra stop id (committed, last in token_ids)
# stop_sequence: a text stop sequence (trimmed away); length: max_new_tokens; context: the
# context is full; interrupted: the interrupt flag, a closed stream or Ctrl-C; error: an
# exception in a step
StopReason = Literal["stop", "stop_sequence", "length", "context", "interrupted", "error"]


class ChatError(UserError, ValueError):
    """A Conversation was built or used wrongly; the message says what and why."""


class SpeculationRequiredError(ChatError):
    """Reference documents only serve speculation."""


class EmptyMessageError(ChatError):
    pass


class ContextFullError(ChatError):
    """The model's context has no room for the next message and a reply."""


@dataclass(frozen=True, slots=True)
class Reply:
    text: str  # the reply as shown: stop ids and a stop sequence excluded
    token_ids: tuple[int, ...]  # what the turn committed after the prompt (a stop id included)
    stop_reason: StopReason
    stats: DecodeStats  # this turn only
    prompt_tokens: int  # tokens the user message appended (the template's delta)
    seconds: float  # wall time of the turn, the delta's prefill included


class TurnGate:
    """The draft source the decoder sees: the index behind a gate that closes at a stop.

    Between replies the gate passes everything (the template's delta is committed stream
    too). During a reply it passes committed tokens up to and including the first stop id and
    then closes: tokens after a stop are never learned, and it drafts nothing until
    `end_reply()` opens it again.

    Example: stop id 2, during a reply observe([5, 2, 7]) feeds [5, 2] to the index and
    drops 7; the gate then drafts nothing until end_reply().
    """

    def __init__(self, index: DraftSource, stop_ids: Iterable[int]) -> None:
        check_source(index)
        self.index = index
        self.stop_ids = frozenset(int(t) for t in stop_ids)
        self.learned = 0  # tokens the index has seen
        self.dropped = 0  # committed tokens kept from it (after a stop)
        self._in_reply = False
        self._closed = False

    @property
    def wants_topk(self) -> bool:
        return self.index.wants_topk and not self._closed

    @property
    def topk_member(self) -> str | None:
        return self.index.topk_member

    def propose(self, budget: int) -> Draft | None:
        return None if self._closed else self.index.propose(budget)

    def observe(self, committed: Sequence[int] | np.ndarray) -> None:
        ids = [int(t) for t in committed]
        keep = 0 if self._closed else len(ids)
        if self._in_reply and not self._closed:
            for i, t in enumerate(ids):
                if t in self.stop_ids:
                    keep = i + 1
                    self._closed = True
                    break
        if keep:
            self.index.observe(ids[:keep])
        self.learned += keep
        self.dropped += len(ids) - keep

    def observe_topk(self, token_ids: Sequence[int] | np.ndarray, topk_ids: np.ndarray) -> None:
        """Rows whose input token is a stop (what follows a stop) are not learned."""
        if self._closed:
            return
        ids = [int(t) for t in token_ids]
        rows = len(ids)
        if self._in_reply:
            rows = next((i for i, t in enumerate(ids) if i > 0 and t in self.stop_ids), rows)
        if rows:
            self.index.observe_topk(ids[:rows], topk_ids[:rows])

    def start_reply(self) -> None:
        self._in_reply = True
        self._closed = False

    def end_reply(self) -> None:
        self._in_reply = False
        self._closed = False


def _default_index(vocab_size: int) -> DraftSource:
    return SpeculationIndex(vocab_size)


class Conversation:
    """A chat with one model, plain or speculative; it owns the model's cache.

        conv = Conversation(model, system="Be brief.", speculation=True)
        conv.add_reference_text(open("notes.md").read())
        reply = conv.send("Summarise the notes.")        # Reply(text, token_ids, ...)
        for piece in conv.stream("And the second point?"):  # the same, streamed
            print(piece, end="")

    Plain and speculative conversations commit the same stream, turn after turn (greedy,
    or sampled with a seed); an interrupted turn ends after a whole step, and a speculative
    step may commit several tokens. Options are checked here; a bad one raises a ChatError (a
    ValueError) naming it. `index_factory` builds the draft index (default: the cascade,
    `SpeculationIndex(model.vocab_size)`); `reset()` calls the index's `reset()` if it has
    one, else the factory again.
    """

    def __init__(
        self,
        model: Model,
        *,
        system: str | None = None,
        sampling: SamplingOptions | None = None,
        speculation: bool = False,
        spec_options: SpecOptions | None = None,
        extra_stop_ids: Iterable[int] = (),
        stop_sequences: Iterable[str] = (),
        cost_table: CostTable | None = None,
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
        index_factory: Callable[[], DraftSource] | None = None,
        clock: Callable[[], float] | None = time.perf_counter,
    ) -> None:
        if (
            isinstance(max_new_tokens, bool)
            or not isinstance(max_new_tokens, int)
            or max_new_tokens < 1
        ):
            raise ChatError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
        if system is not None and not isinstance(system, str):
            raise ChatError(f"system must be a string or None, got {type(system).__name__}")
        sequences = (stop_sequences,) if isinstance(stop_sequences, str) else stop_sequences
        self.stop_sequences: tuple[str, ...] = tuple(sequences)
        for s in self.stop_sequences:
            if not isinstance(s, str) or not s:
                raise ChatError(f"stop_sequences must be non-empty strings, got {s!r}")
        if index_factory is not None and not speculation:
            raise ChatError("index_factory needs speculation=True")
        extra: set[int] = set()
        for t in extra_stop_ids:
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < model.vocab_size:
                raise ChatError(
                    f"extra_stop_ids: {t!r} is not a token id in [0, {model.vocab_size})"
                )
            extra.add(t)
        self.model = model
        self.tokenizer = model.tokenizer
        self.system = system or None
        self.sampling = sampling or SamplingOptions()
        self.speculation = bool(speculation)
        self.spec_options = spec_options or SpecOptions()
        self.cost_table = cost_table
        self.max_new_tokens = max_new_tokens
        self.clock = clock
        self.turn_end_ids = frozenset(model.eos_token_ids)  # what closes a turn in a template
        self.stop_ids = self.turn_end_ids | frozenset(extra)  # what ends a reply
        self._index_factory = index_factory or (lambda: _default_index(model.vocab_size))
        self._references: list[list[int]] = []
        self._index: DraftSource | None = self._index_factory() if self.speculation else None
        self.rebuilds = 0  # turns whose template delta could not be diffed
        self.last_reply: Reply | None = None
        self._busy = False
        self._start()
        self._render([*self.messages, {"role": "user", "content": "hi"}])  # fail now, not later

    # -- state ---------------------------------------------------------------------------
    def _start(self) -> None:
        """A fresh stream: empty cache, a new decoder (RNG from the seed), fresh index state."""
        self.model.truncate(0)
        self._gate = TurnGate(self._index, self.stop_ids) if self._index is not None else None
        self.decoder = SpeculativeDecoder(
            self.model,
            sampling=self.sampling,
            source=self._gate,
            options=self.spec_options,
            cost_table=self.cost_table,
            clock=self.clock,
        )
        self.messages: list[dict[str, str]] = (
            [{"role": "system", "content": self.system}] if self.system else []
        )
        self._template_prompt: list[int] = []  # the last rendering, up to its generation prompt
        self.turns = 0

    def reset(self) -> None:
        """Forget the conversation; keep the options and the reference documents.

        Afterwards the conversation commits what a new one with the same arguments and
        references would (the RNG restarts from `sampling.seed`).
        """
        self._check_idle()
        if self._index is not None:
            self._index = self._fresh_index()
        self._start()

    def _fresh_index(self) -> DraftSource:
        if isinstance(self._index, SpeculationIndex):
            self._index.reset()  # keeps its frozen references, rewinds the cursors
            return self._index
        return self._index_factory()

    @property
    def history(self) -> tuple[int, ...]:
        """The committed token stream (prompts, templates and replies)."""
        return tuple(self.decoder.history)

    @property
    def index(self) -> DraftSource | None:
        """The draft index (the cascade), None without speculation."""
        return self._index

    @property
    def stats(self) -> DecodeStats:
        """Decoder statistics since the conversation started (or was reset)."""
        return self.decoder.stats

    @property
    def n_ctx(self) -> int | None:
        return self.model.n_ctx

    def check_integrity(self) -> None:
        """Raise RuntimeError unless cache, history and index agree on the committed stream."""
        history = self.decoder.history
        expected = max(0, len(history) - 1)  # the last committed token is carried
        if self.model.n_past != expected:
            raise RuntimeError(
                f"the cache holds {self.model.n_past} tokens, the stream "
                f"{len(history)} (expected {expected} in the cache)"
            )
        if self._gate is not None and self._gate.learned != len(history):
            raise RuntimeError(
                f"the index learned {self._gate.learned} tokens, the stream has {len(history)}"
            )
        if isinstance(self._index, SpeculationIndex) and [
            int(t) for t in self._index.conversation.tokens
        ] != list(history):
            raise RuntimeError("the conversation index does not hold the committed stream")

    # -- references ----------------------------------------------------------------------
    def add_reference(self, token_ids: Sequence[int]) -> int:
        """Inject a reference document (ids from the model's tokenizer); returns its slot.

        Allowed mid-conversation: the index catches up over the stream committed so far.
        """
        self._check_idle()
        if self._index is None:
            raise SpeculationRequiredError("reference documents need speculation=True")
        if not isinstance(self._index, SpeculationIndex):
            raise ChatError(f"the draft index {type(self._index).__name__} takes no references")
        ids = [int(t) for t in token_ids]
        if not ids:
            raise ChatError("the reference is empty")
        bad = next((t for t in ids if not 0 <= t < self.model.vocab_size), None)
        if bad is not None:
            raise ChatError(
                f"reference token id {bad} is outside the vocabulary [0, {self.model.vocab_size})"
            )
        slot = self._index.add_reference(ids)
        self._references.append(ids)
        return slot

    def add_reference_text(self, text: str) -> int:
        """Tokenize `text` with the model's own tokenizer (the tokenize-externally contract,
        so it matches the stream token for token) and inject it."""
        if not text.strip():
            raise ChatError("the reference is empty")
        return self.add_reference(self.tokenizer.encode(text))

    def clear_references(self) -> None:
        self._check_idle()
        if isinstance(self._index, SpeculationIndex):
            self._index.clear_references()
        self._references.clear()

    @property
    def references(self) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(r) for r in self._references)

    # -- a turn --------------------------------------------------------------------------
    def send(self, text: str, *, interrupt: Callable[[], bool] | None = None) -> Reply:
        """One turn: the user's `text` in, the assistant's Reply out."""
        for _ in self.stream(text, interrupt=interrupt):
            pass
        assert self.last_reply is not None
        return self.last_reply

    def stream(self, text: str, *, interrupt: Callable[[], bool] | None = None) -> Iterator[str]:
        """One turn, streamed: yields pieces of the reply text; `last_reply` has the Reply.

        The message is checked (and the template rendered) now; the model runs as the
        iterator is consumed. `interrupt()` is polled between decoder steps: True ends the
        turn there, as does closing the iterator.
        """
        self._check_idle()
        if not isinstance(text, str) or not text.strip():
            raise EmptyMessageError("the message is empty")
        messages = [*self.messages, {"role": "user", "content": text}]
        rendered = self._render(messages)
        keep, delta = self._delta(rendered)
        size = keep + len(delta)
        if self.n_ctx is not None and size >= self.n_ctx:  # no room left for a reply
            raise ContextFullError(
                f"the context is full: {size} tokens with this message, the model holds "
                f"{self.n_ctx}; reset the conversation"
            )
        return self._turn(messages, rendered, keep, delta, self.max_new_tokens, interrupt)

    def _render(self, messages: list[dict[str, str]]) -> list[int]:
        try:
            return [
                int(t)
                for t in self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
            ]
        except ModelError:
            raise
        except Exception as err:  # a Jinja error from the model's own template
            raise ChatError(f"the chat template failed: {err}") from None

    def _delta(self, rendered: list[int]) -> tuple[int, list[int]]:
        """(keep, tokens): keep the first `keep` committed tokens, then append `tokens`."""
        history = self.decoder.history
        if not history:
            return 0, rendered
        prev = self._template_prompt
        if prev and rendered[: len(prev)] == prev:
            for e in range(len(prev), len(rendered)):
                if rendered[e] in self.turn_end_ids:  # closes the previous assistant message
                    skip = 1 if history[-1] == rendered[e] else 0
                    return len(history), rendered[e + skip :]
        keep = 0  # the template cannot be diffed: rebuild from the common prefix
        while keep < min(len(history), len(rendered)) and history[keep] == rendered[keep]:
            keep += 1
        keep = min(keep, len(rendered) - 1)  # something must be appended to decode from
        return keep, rendered[keep:]

    def _turn(
        self,
        messages: list[dict[str, str]],
        rendered: list[int],
        keep: int,
        delta: list[int],
        budget: int,
        interrupt: Callable[[], bool] | None,
    ) -> Iterator[str]:
        self._busy = True
        dec = self.decoder
        before = dec.stats.copy()
        t0 = time.perf_counter()
        produced: list[int] = []  # committed by this turn's decoding
        text = ""  # the reply text, once the turn ends
        reason: StopReason = "length"
        appended = done = False
        detok = StreamDecoder(self.tokenizer, skip_special=True)
        stops = TextStops(self.stop_sequences)
        try:
            self._check_cache()
            if keep < len(dec.history):
                self._rewind(keep)
                self.rebuilds += 1
            dec.append(delta)
            appended = True
            self.messages = messages
            self._template_prompt = rendered
            if self._gate is not None:
                self._gate.start_reply()
            pending = ""  # text safe to show, not yet yielded
            for chunk in dec.stream(budget, self.stop_ids):
                produced.extend(chunk)
                pending = stops.push(
                    "".join(detok.push(t) for t in chunk if t not in self.stop_ids)
                )
                if chunk[-1] in self.stop_ids:
                    reason = "stop"
                if stops.cut is not None:
                    reason = "stop_sequence"
                    break
                if pending:
                    yield pending
                    pending = ""
                if reason == "length" and interrupt is not None and interrupt():
                    reason = "interrupted"
                    break
            if reason == "length" and dec.at_context_end():
                reason = "context"
            if stops.cut is None:
                pending += stops.push(detok.flush())
                if stops.cut is not None:
                    reason = "stop_sequence"
                pending += stops.finish()
            text = stops.text
            if stops.cut is not None:
                produced = self._trim(produced, text)
            done = True
            if pending:
                yield pending
        except BaseException as err:
            if not done:
                if isinstance(err, KeyboardInterrupt | GeneratorExit):
                    reason = "interrupted"
                else:
                    reason = "error"
                text = stops.text if stops.cut is not None else stops.text + detok.flush()
            raise
        finally:
            if appended:
                self._finish(text, produced, reason, len(delta), t0, before)
            self._busy = False

    def _finish(
        self,
        text: str,
        produced: list[int],
        reason: StopReason,
        prompt_tokens: int,
        t0: float,
        before: DecodeStats,
    ) -> None:
        self.messages.append({"role": "assistant", "content": text})
        if self._gate is not None:
            self._gate.end_reply()
        self.turns += 1
        self.last_reply = Reply(
            text=text,
            token_ids=tuple(produced),
            stop_reason=reason,
            stats=self.decoder.stats - before,
            prompt_tokens=prompt_tokens,
            seconds=time.perf_counter() - t0,
        )

    def _trim(self, produced: list[int], kept: str) -> list[int]:
        """Cut the stream back to the reply text `kept` (what precedes a stop sequence).

        Keeps the longest prefix of `produced` whose text fits in `kept` and re-encodes
        the characters of a token that straddles the cut. The RNG drew for the tokens up to
        the one that completed the sequence, as a plain run stopping there does; the draws
        for tokens a verify accepted after that one are undone. The index, which cannot
        forget, is rebuilt from the cut stream.
        """
        if not self.sampling.greedy:
            rewind(self.decoder.rng, len(produced) - self._stop_token_count(produced))
        n = len(produced)
        while n > 0:
            prefix = self.tokenizer.decode(
                [t for t in produced[:n] if t not in self.stop_ids], skip_special=True
            )
            if kept.startswith(prefix):
                break
            n -= 1
        else:
            prefix = ""
        fragment = kept[len(prefix) :]
        extra = [int(t) for t in self.tokenizer.encode(fragment)] if fragment else []
        self._rewind(len(self.decoder.history) - (len(produced) - n))
        self.decoder.append(extra)
        return produced[:n] + extra

    def _stop_token_count(self, produced: list[int]) -> int:
        """How many of `produced` a plain run commits before its text stop: through the
        first token whose text completes a stop sequence (plain decoding checks after each
        token); all of them if none does before the end (a stop found when the text was
        flushed)."""
        detok = StreamDecoder(self.tokenizer, skip_special=True)
        stops = TextStops(self.stop_sequences)
        for i, t in enumerate(produced):
            if t not in self.stop_ids:
                stops.push(detok.push(t))
                if stops.cut is not None:
                    return i + 1
        return len(produced)

    def _rewind(self, n: int) -> None:
        """Cut the committed stream back to its first n tokens (and rebuild the index from
        it: an index cannot forget)."""
        dec = self.decoder
        if n >= len(dec.history):
            return
        dec.truncate(max(0, n))
        if self._index is not None:
            self._index = self._fresh_index()
            self._gate = TurnGate(self._index, self.stop_ids)
            self._gate.observe(dec.history)
            dec.source = self._gate

    def _check_idle(self) -> None:
        if self._busy:
            raise ChatError("a turn is still streaming; finish or close it first")

    def _check_cache(self) -> None:
        expected = max(0, len(self.decoder.history) - 1)
        if self.model.n_past != expected:
            raise RuntimeError(
                f"the model's cache holds {self.model.n_past} tokens but this conversation "
                f"expects {expected}: another user of the model changed it"
            )
