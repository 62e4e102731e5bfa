"""The full sampler pipeline, one pure function shared by plain and speculative decoding.

    sample(logits, history, options, rng) -> token id

Order, as in Hugging Face's logits processors: penalties (repetition, frequency, presence,
over the last `penalty_last_n` tokens of the history) -> temperature -> top-k -> top-p ->
min-p -> one draw. Temperature <= 0 is argmax after penalties and draws nothing.

Exactly one `rng.random()` per sampled token (inverse-CDF over the kept candidates, ordered
by logit then token id), so (seed, prompt, options) determines the stream, and a decoder that
samples only the rows it commits advances the RNG exactly as plain decoding does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


class OptionsError(ValueError):
    """An option is out of range; the message names it."""


@dataclass(frozen=True, slots=True)
class SamplingOptions:
    temperature: float = 0.0  # <= 0: argmax
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # in (0, 1]; 1: off
    min_p: float = 0.0  # in [0, 1]; 0: off
    repeat_penalty: float = 1.0  # > 0; 1: off (CTRL-style: positive logits / p, negative * p)
    frequency_penalty: float = 0.0  # logit -= count * f
    presence_penalty: float = 0.0  # logit -= p if count > 0
    penalty_last_n: int = 64  # tokens of history the penalties see; -1: all; 0: none
    seed: int | None = None

    def __post_init__(self) -> None:
        for name in (
            "temperature",
            "top_p",
            "min_p",
            "repeat_penalty",
            "frequency_penalty",
            "presence_penalty",
        ):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value):
                raise OptionsError(f"{name} must be a finite number, got {value!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise OptionsError(f"top_k must be an integer >= 0 (0 disables it), got {self.top_k!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise OptionsError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not 0.0 <= self.min_p <= 1.0:
            raise OptionsError(f"min_p must be in [0, 1], got {self.min_p!r}")
        if self.repeat_penalty <= 0.0:
            raise OptionsError(
                f"repeat_penalty must be > 0 (1 disables it), got {self.repeat_penalty!r}"
            )
        if not isinstance(self.penalty_last_n, int) or self.penalty_last_n < -1:
            raise OptionsError(
                "penalty_last_n must be an integer >= -1 (-1: whole history), "
                f"got {self.penalty_last_n!r}"
            )
        if self.seed is not None and (not isinstance(self.seed, int) or self.seed < 0):
            raise OptionsError(f"seed must be a non-negative integer, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def has_penalties(self) -> bool:
        return self.penalty_last_n != 0 and (
            self.repeat_penalty != 1.0
            or self.frequency_penalty != 0.0
            or self.presence_penalty != 0.0
        )


def make_rng(seed: int | None) -> tuple[np.random.Generator, int]:
    """The generator a run draws from, and the seed that reproduces it."""
    if seed is None:
        seed = int(np.random.SeedSequence().generate_state(1)[0])
    return np.random.Generator(np.random.PCG64(seed)), seed


def apply_penalties(
    logits: np.ndarray, history: Sequence[int] | np.ndarray, options: SamplingOptions
) -> np.ndarray:
    """A penalised float64 copy of `logits` [vocab] (the input row is never modified)."""
    row = np.array(logits, dtype=np.float64)
    if not options.has_penalties or len(history) == 0:
        return row
    window = np.asarray(history, dtype=np.int64)
    if options.penalty_last_n > 0:
        window = window[-options.penalty_last_n :]
    ids, counts = np.unique(window, return_counts=True)
    if options.repeat_penalty != 1.0:
        seen = row[ids]
        row[ids] = np.where(seen > 0, seen / options.repeat_penalty, seen * options.repeat_penalty)
    if options.frequency_penalty != 0.0 or options.presence_penalty != 0.0:
        row[ids] -= counts * options.frequency_penalty + options.presence_penalty
    return row


def candidates(row: np.ndarray, options: SamplingOptions) -> tuple[np.ndarray, np.ndarray]:
    """Kept token ids, best first, and their unnormalised probabilities, after temperature,
    top-k, top-p and min-p. `row` is the penalised float64 row [vocab]."""
    scaled = row / options.temperature
    vocab = scaled.shape[0]
    if 0 < options.top_k < vocab:
        ids = np.argpartition(-scaled, options.top_k - 1)[: options.top_k]
    else:
        ids = np.arange(vocab)
    ids = np.sort(ids)  # by id, so the stable sort below breaks ties by token id
    order = np.argsort(-scaled[ids], kind="stable")
    ids = ids[order]
    logits = scaled[ids]
    probs = np.exp(logits - logits[0])  # [n], best first, probs[0] == 1
    if options.top_p < 1.0:
        cum = np.cumsum(probs)
        keep = int(np.searchsorted(cum, options.top_p * cum[-1], side="left")) + 1
        ids, probs = ids[:keep], probs[:keep]
    if options.min_p > 0.0:
        keep = int(np.count_nonzero(probs >= options.min_p))  # probs[0] is the max, == 1
        ids, probs = ids[:keep], probs[:keep]
    return ids, probs


def sample(
    logits: np.ndarray,
    history: Sequence[int] | np.ndarray,
    options: SamplingOptions,
    rng: np.random.Generator,
) -> int:
    """One token from one logits row [vocab], conditioned on the committed `history`.

    Greedy (temperature <= 0) draws nothing from `rng`; sampling draws exactly once.
    """
    if options.greedy and not options.has_penalties:
        return int(np.argmax(logits))
    row = apply_penalties(logits, history, options)
    if options.greedy:
        return int(np.argmax(row))
    ids, probs = candidates(row, options)
    cum = np.cumsum(probs)
    u = rng.random()  # the one draw
    pick = int(np.searchsorted(cum, u * cum[-1], side="right"))
    return int(ids[min(pick, len(ids) - 1)])
