"""From tokens to text and back: prompts, streamed detokenization, and text stops.

    encode_prompt(model, text, chat=True)   the prompt's token ids (chat template or raw)
    StreamDecoder(tokenizer).push(id)       the new text a token completes
    TextStops(["\\n\\n"]).push(text)        text safe to show; .cut where a stop starts
    generate_text(decoder, ...)             decode until a stop id, a stop text or the end

A stop sequence is text, not tokens: "\\n\\n" may arrive as one token or as two, or inside a
token that also carries the next word. So the generated tokens are decoded incrementally
and the text is searched; text that could be the start of a stop sequence is held back
until the next tokens decide.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from draftless.decoder import SpeculativeDecoder
from draftless.errors import UsageError
from draftless.models.base import Model, Tokenizer


def find_stop(text: str, sequences: Sequence[str], start: int) -> int | None:
    """Index in `text` of the earliest stop sequence that ends after `start`, or None."""
    hits = [i for s in sequences if (i := text.find(s, start)) >= 0]
    return min(hits) if hits else None


def held_back(text: str, sequences: Sequence[str]) -> int:
    """Length of the longest suffix of `text` that could start a stop sequence."""
    best = 0
    for s in sequences:
        for n in range(min(len(s) - 1, len(text)), best, -1):
            if s.startswith(text[-n:]):
                best = n
                break
    return best


def unescape(text: str) -> str:
    r"""`\n` and `\t` typed on a command line, as the characters (`\\` is a backslash)."""
    out, i = [], 0
    while i < len(text):
        pair = text[i : i + 2]
        if pair in ("\\n", "\\t", "\\\\"):
            out.append({"\\n": "\n", "\\t": "\t", "\\\\": "\\"}[pair])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


class TextStops:
    """Accumulates decoded text, finds the first stop sequence, says what is safe to show.

    `text` is everything pushed, cut before the stop sequence once one is found (`cut` is
    then where it started, and further pushes are refused).
    """

    def __init__(self, sequences: Iterable[str]) -> None:
        self.sequences = tuple(sequences)
        for s in self.sequences:
            if not isinstance(s, str) or not s:
                raise ValueError(f"a stop sequence must be non-empty text, got {s!r}")
        self._hold = max((len(s) for s in self.sequences), default=1) - 1
        self.text = ""
        self.cut: int | None = None
        self._shown = 0

    def push(self, piece: str) -> str:
        """Add decoded text; return the text that can be shown now."""
        if self.cut is not None:
            raise RuntimeError("a stop sequence was already found")
        start = max(0, len(self.text) - self._hold)
        self.text += piece
        cut = find_stop(self.text, self.sequences, start)
        if cut is not None:
            self.cut = cut
            self.text = self.text[:cut]
            return self._show(len(self.text))
        return self._show(len(self.text) - held_back(self.text, self.sequences))

    def finish(self) -> str:
        """The end of the text: what was held back is shown (no stop sequence followed)."""
        return self._show(len(self.text))

    def _show(self, upto: int) -> str:
        new = self.text[self._shown : upto] if upto > self._shown else ""
        self._shown = max(self._shown, upto)
        return new


class StreamDecoder:
    """Incremental detokenizer: feed token ids, get the new text they complete.

    Decodes a short window of recent ids and emits the difference, holding back text
    that ends in an incomplete UTF-8 sequence (U+FFFD) until the next token completes it.
    Works with any tokenizer that has `decode`.
    """

    def __init__(self, tokenizer: Tokenizer, *, skip_special: bool = True) -> None:
        self._tok = tokenizer
        self._skip = skip_special
        self._ids: list[int] = []
        self._prefix_offset = 0  # ids before this index are already emitted and stable
        self._read_offset = 0  # ids before this index have been emitted

    def push(self, token_id: int) -> str:
        self._ids.append(int(token_id))
        prefix = self._tok.decode(
            self._ids[self._prefix_offset : self._read_offset], skip_special=self._skip
        )
        full = self._tok.decode(self._ids[self._prefix_offset :], skip_special=self._skip)
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            new = full[len(prefix) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)
            return new
        return ""

    def flush(self) -> str:
        """Whatever is still held back (e.g. a trailing incomplete sequence)."""
        prefix = self._tok.decode(
            self._ids[self._prefix_offset : self._read_offset], skip_special=self._skip
        )
        full = self._tok.decode(self._ids[self._prefix_offset :], skip_special=self._skip)
        self._prefix_offset = self._read_offset = len(self._ids)
        return full[len(prefix) :]


def encode_prompt(model: Model, text: str, *, chat: bool, system: str | None = None) -> list[int]:
    """The prompt's token ids: the chat template around a user message (and a system
    message), or the raw text with the model's BOS. Raises UsageError on an empty prompt."""
    if not text.strip():
        raise UsageError("the prompt is empty")
    if chat:
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": text}
        ]
        return model.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    return model.tokenizer.encode(text, add_special=True)


@dataclass(frozen=True, slots=True)
class TextRun:
    token_ids: list[int]  # up to the token that ended the run (a stop id, or the one
    #                       that completed a stop sequence), included
    text: str  # stop ids and a stop sequence (and what follows it) left out
    stop_reason: str  # "stop", "stop_sequence", "length" or "context"
    seconds: float


def generate_text(
    dec: SpeculativeDecoder,
    max_new_tokens: int,
    stop_ids: frozenset[int],
    stop_sequences: Sequence[str] = (),
    emit: Callable[[str], None] | None = None,
    interrupt: Callable[[], bool] | None = None,
    on_token: Callable[[int], None] | None = None,
) -> TextRun:
    """Decode, detokenize and stop at a stop id, a text stop sequence, max_new_tokens or
    the end of the context; `emit` gets the text as it becomes safe to show (never the
    start of a stop sequence). `interrupt()` is polled between steps: True ends the run
    there ("interrupted"). `on_token(n)` is told each time the run takes its n-th token
    and it is text (not a stop id), before that text is emitted.

    Text stops are checked token by token, so the run ends at the token where plain decoding
    ends, also when a verify accepted tokens past it: those are left out of the output. (The
    RNG drew for them: harmless in a run that ends here; a chat, which goes on, refuses text
    stops with speculation for that reason.)
    """
    detok = StreamDecoder(dec.model.tokenizer, skip_special=True)
    stops = TextStops(stop_sequences)
    out: list[int] = []
    reason = ""
    t0 = time.perf_counter()

    def show(piece: str) -> None:
        if piece and emit is not None:
            emit(piece)

    for chunk in dec.stream(max_new_tokens, stop_ids):
        for t in chunk:
            out.append(t)
            if t in stop_ids:
                reason = "stop"
                break
            if on_token is not None:
                on_token(len(out))
            show(stops.push(detok.push(t)))
            if stops.cut is not None:
                reason = "stop_sequence"
                break
        if reason:
            break
        if interrupt is not None and interrupt():
            reason = "interrupted"
            break
    if stops.cut is None:
        show(stops.push(detok.flush()))
        if stops.cut is not None:
            reason = "stop_sequence"
        show(stops.finish())
    if not reason:
        reason = dec.stop_reason(out, max_new_tokens, stop_ids)
    return TextRun(out, stops.text, reason, time.perf_counter() - t0)
