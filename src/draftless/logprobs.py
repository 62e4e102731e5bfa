"""Log probabilities of the tokens a decoder commits, read from the rows it sampled them from.

Every committed token was sampled from one logits row (the decoder's full sampler, once per
token, whether the row came from a verify or a plain step), and a lossless decoder samples
from the rows plain decoding computes. So the log probabilities are those of plain decoding,
with or without speculation, at no cost beyond the softmax of those rows.

What is reported is the model's own distribution: the log-softmax of the raw logits row,
before logit_bias, temperature, penalties and top-k/top-p/min-p (vLLM's default, "raw logprobs").

    recorder = LogprobRecorder(decoder, top=2)   # installs itself as the decoder's row hook
    for chunk in decoder.stream(50): ...
    recorder.entries(start=len(prompt_ids))      # [TokenLogprob], one per committed token
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from draftless.decoder import SpeculativeDecoder

MAX_TOP = 20  # alternatives per token, OpenAI's bound
FLOOR = -9999.0  # what a token the row gives no mass (-inf) reports, as OpenAI's API does


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # the row's likeliest ids, best first (ties: lower id)


def log_softmax_at(row: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """log softmax(row)[ids], in float64 (row [vocab], ids [n])."""
    x = row.astype(np.float64, copy=False)
    peak = float(x.max())
    if not math.isfinite(peak):
        raise ValueError("a logits row has no finite maximum")
    norm = peak + math.log(float(np.exp(x - peak).sum()))
    return x[ids] - norm


def top_ids(row: np.ndarray, n: int) -> np.ndarray:
    """The n largest entries' ids, best first; equal values in id order."""
    if n <= 0:
        return np.empty(0, dtype=np.int64)
    n = min(n, row.shape[0])
    part = np.argpartition(-row, n - 1)[:n]
    return part[np.lexsort((part, -row[part]))]


def _finite(value: float) -> float:
    return value if value > FLOOR else FLOOR


class LogprobRecorder:
    """A decoder's row hook that keeps one TokenLogprob per committed token.

    The hook sees a row before its token is sampled; the entry is finished at the next row or
    when `entries()` is asked, from the decoder's history. It holds one row at a time.
    """

    def __init__(self, decoder: SpeculativeDecoder, top: int = 0) -> None:
        if not 0 <= top <= MAX_TOP:
            raise ValueError(f"top must be in [0, {MAX_TOP}], got {top}")
        self.top = top
        self._decoder = decoder
        self._done: dict[int, TokenLogprob] = {}  # by position in the decoder's history
        self._pending: tuple[int, np.ndarray] | None = None
        decoder.hook = self

    def __call__(self, pos: int, row: np.ndarray) -> None:
        self._finish()
        self._pending = (pos, row)

    def close(self) -> None:
        """Stop recording: the decoder's hook is removed."""
        self._finish()
        if self._decoder.hook is self:
            self._decoder.hook = None

    def entries(self, start: int, stop: int | None = None) -> list[TokenLogprob]:
        """The entries of history positions [start, stop): the tokens committed there."""
        self._finish()
        end = len(self._decoder.history) if stop is None else stop
        missing = [p for p in range(start, end) if p not in self._done]
        if missing:
            raise RuntimeError(f"no row was recorded for position {missing[0]}")
        return [self._done[p] for p in range(start, end)]

    def _finish(self) -> None:
        if self._pending is None:
            return
        pos, row = self._pending
        history = self._decoder.history
        if pos < len(history):  # else the step was undone (an error): nothing to keep
            token = int(history[pos])
            ids = np.concatenate(([token], top_ids(row, self.top)))
            lps = log_softmax_at(row, ids)
            top = tuple((int(i), _finite(float(v))) for i, v in zip(ids[1:], lps[1:], strict=True))
            self._done[pos] = TokenLogprob(token, _finite(float(lps[0])), top)
        self._pending = None
