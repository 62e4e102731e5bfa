"""The full sampler pipeline, one pure function shared by plain and speculative decoding.

    sample(logits, history, options, rng) -> token id

Order, as in Hugging Face's logits processors: penalties (repetition, frequency, presence,
over the last `penalty_last_n` tokens of the history) -> a constraint's mask, if any (the
tokens a grammar allows next) -> temperature -> top-k -> top-p -> min-p -> one draw.
Temperature <= 0 is argmax after penalties and draws nothing.

Exactly one `rng.random()` per sampled token (inverse-CDF over the kept candidates, ordered
by logit then token id), so (seed, prompt, options) determines the stream, and a decoder that
samples only the rows it commits advances the RNG exactly as plain decoding does.

The draw sorts only the head of the row (the best 64 tokens, 8x more when the top-p cut or
the draw reaches further), not all of a 49k- or 262k-token vocabulary: a full sort cost
over 10x the partial one at 49k and at 262k tokens (benchmarks/bench_sources.py, section 4),
more than a llama.cpp step of SmolLM2.
`candidates` is the same definition with the full sort; tests hold the two to the same
token for every uniform.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from draftless.errors import UserError


class OptionsError(UserError, ValueError):
    """An option is out of range; the message names it."""


class NothingAllowed(UserError, RuntimeError):
    """A constraint left no token to sample: the grammar the user gave cannot go on."""


MAX_BIAS = 100.0  # logit_bias values, as OpenAI bounds them


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
    # (token id, bias) pairs added to those logits before anything else (OpenAI's
    # logit_bias; -100 all but bans a token, +100 all but forces it)
    logit_bias: tuple[tuple[int, float], ...] = ()

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
        for pair in self.logit_bias:
            token, bias = pair if isinstance(pair, tuple) and len(pair) == 2 else (None, None)
            if isinstance(token, bool) or not isinstance(token, int) or token < 0:
                raise OptionsError(f"logit_bias: {pair!r} is not a (token id, bias) pair")
            if not isinstance(bias, int | float) or not -MAX_BIAS <= bias <= MAX_BIAS:
                raise OptionsError(
                    f"logit_bias of token {token} must be in [-{MAX_BIAS:g}, {MAX_BIAS:g}], "
                    f"got {bias!r}"
                )

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
    logits: np.ndarray,
    history: Sequence[int] | np.ndarray,
    options: SamplingOptions,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """A biased, penalised float64 copy of `logits` [vocab], in `out` if given (the input row
    is never modified). The bias goes first, as in llama.cpp's sampler chain."""
    if out is None:
        row = np.array(logits, dtype=np.float64)
    else:
        row = out
        np.copyto(row, logits)
    for token, bias in options.logit_bias:
        if token >= row.shape[0]:
            raise OptionsError(f"logit_bias: {token} is not a token id of this model")
        row[token] += bias
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


class Candidates(NamedTuple):
    ids: np.ndarray  # kept token ids, best first (ties: lower id first)
    probs: np.ndarray  # their unnormalised probabilities, exp(logit - best logit)
    mass: float  # the total the draw scales by (see `candidates`)


def candidates(row: np.ndarray, options: SamplingOptions) -> Candidates:
    """What the filters keep, by sorting the whole row: the definition `sample` follows
    without the sort (tests compare the two draw for draw).

    `row` is the penalised float64 row [vocab]. Temperature scales it; top-k keeps the k
    best (the pool); top-p the shortest best-first prefix of the pool holding top_p of its
    mass; min-p the tokens at least min_p as probable as the best. The draw is inverse-CDF
    best first: the first token whose cumulative probability exceeds u * mass. `mass` is
    the pool's mass when nothing was cut, the cumulative sum at the cut when top-p cut
    (also when min-p cut at the same token), and the min-p survivors' mass when only
    min-p cut; each computed the way `draw` computes it, so the two agree bitwise.
    """
    pool, x = _pool(row, options)
    p = np.exp(x - x.max())  # [P] in pool (id) order
    order = np.argsort(-x, kind="stable")  # best first, ties by lower id
    cum = np.cumsum(p[order])
    keep, mass = _cut(p, cum, float(np.sum(p)), options)
    ids = order[:keep] if pool is None else pool[order[:keep]]
    return Candidates(ids, p[order[:keep]], mass)


def _pool(
    row: np.ndarray, options: SamplingOptions, out: np.ndarray | None = None
) -> tuple[np.ndarray | None, np.ndarray]:
    """The ids top-k keeps, ascending (None: the whole vocabulary), and their scaled logits
    (in `out` if given)."""
    scaled = np.divide(row, options.temperature, out=out)
    vocab = scaled.shape[0]
    if not 0 < options.top_k < vocab:
        return None, scaled
    pool = np.sort(best_first(scaled, options.top_k))  # ties at the k-th: lower ids
    return pool, scaled[pool]


def _cut(
    p: np.ndarray, cum: np.ndarray, total: float, options: SamplingOptions
) -> tuple[int, float]:
    """How many best-first tokens of the pool are kept, and the mass the draw scales by.
    `p` is the pool's probabilities (`total` their sum), `cum` their best-first cumulative
    sum, of the whole pool or of a prefix long enough to hold the top-p cut (`draw` makes
    sure)."""
    size = p.shape[0]
    keep_p = size
    if options.top_p < 1.0:
        keep_p = min(size, int(np.searchsorted(cum, options.top_p * total, side="left")) + 1)
    keep_min = size if options.min_p <= 0.0 else int(np.count_nonzero(p >= options.min_p))
    keep = min(keep_p, keep_min)
    if keep == size:
        return keep, total
    if keep == keep_p:
        return keep, float(cum[keep - 1])
    return keep, float(np.sum(p[p >= options.min_p]))


def best_first(x: np.ndarray, n: int) -> np.ndarray:
    """Positions of the n largest values of `x`, best first, ties by lower position.

    Without sorting the row: the n-th largest value of a strided sample (every 16th value
    at most) bounds the n-th largest of the row from below, so `x >= bound` holds every one
    of the n; only those candidates (~16n) are sorted (stable, so ties keep position order).
    NaN ranks below every number; a row with NaNs may take the full sort.
    """
    size = x.shape[0]
    if n >= size // 4:
        return np.argsort(-x, kind="stable")[:n]
    stride = max(1, min(size // (8 * n), 16))  # a dense sample: a tight bound, few candidates
    bound = np.partition(x[::stride], -n)[-n]
    cand = np.flatnonzero(x >= bound)
    if cand.shape[0] < n:  # NaNs in the sample (partition ranks them highest)
        return np.argsort(-x, kind="stable")[:n]
    return cand[np.argsort(-x[cand], kind="stable")[:n]]


def draw(row: np.ndarray, options: SamplingOptions, u: float) -> int:
    """The token `candidates` + inverse CDF give for the uniform u, sorting only as much of
    the row as the top-p cut and the draw reach: the best 64 tokens, then 8x more as needed.
    A model's rows put most of their mass on a few tokens, so one round usually does."""
    scratch = _scratch(row.shape[0])
    pool, x = _pool(row, options, out=scratch[1])
    size = x.shape[0]
    p = np.subtract(x, x.max(), out=scratch[2] if pool is None else None)
    np.exp(p, out=p)  # [P] in pool (id) order
    total = float(np.sum(p))
    n = min(size, 64)
    while True:
        order = best_first(x, n)  # [n] best first
        cum = np.cumsum(p[order])
        if n < size and options.top_p < 1.0 and cum[-1] < options.top_p * total:
            n = min(size, 8 * n)  # the top-p cut lies further down
            continue
        keep, mass = _cut(p, cum, total, options)
        target = u * mass
        if keep <= n or cum[-1] > target:
            pick = int(np.searchsorted(cum[:keep], target, side="right"))
            pos = int(order[min(pick, keep - 1)])
            return pos if pool is None else int(pool[pos])
        n = min(size, 8 * n)  # the draw lands further down


def sample(
    logits: np.ndarray,
    history: Sequence[int] | np.ndarray,
    options: SamplingOptions,
    rng: np.random.Generator,
    allowed: np.ndarray | None = None,
) -> int:
    """One token from one logits row [vocab], conditioned on the committed `history`.

    `allowed` (bool [vocab]), when given, is what a constraint (a grammar, a JSON schema)
    lets come next: every other token's logit is -inf before temperature and the cuts, so
    the draw is over the allowed tokens alone. Raises NothingAllowed if it allows none.

    Greedy (temperature <= 0) draws nothing from `rng`; sampling draws exactly once.
    """
    plain = options.greedy and not options.has_penalties and not options.logit_bias
    if plain:
        best = int(np.argmax(logits))
        # the first best of the whole row is the first best of the allowed ones if allowed
        if allowed is None or allowed[best]:
            return best
    row = apply_penalties(logits, history, options, out=_scratch(logits.shape[0])[0])
    if allowed is not None:
        np.putmask(row, ~allowed, -np.inf)
        if not allowed.any():
            raise NothingAllowed("the constraint allows no token here")
    if options.greedy:
        return int(np.argmax(row))
    return draw(row, options, rng.random())  # the one draw


def rewind(rng: np.random.Generator, draws: int) -> None:
    """Undo the last `draws` draws of `rng`, as if they never happened: a run that keeps
    fewer sampled tokens than it drew for (a speculative batch cut by a text stop) goes on
    from where plain decoding, which drew one per kept token, would be. PCG64 (`make_rng`'s)
    steps once per `random()` and can step back: its period is 2**128."""
    if draws <= 0:
        return
    bits = rng.bit_generator
    if not isinstance(bits, np.random.PCG64):
        raise TypeError(f"only a PCG64 generator can be rewound, got {type(bits).__name__}")
    bits.advance(-draws % 2**128)


_local = threading.local()


def _scratch(size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Three float64 rows of `size`, reused by this thread's draws, so a draw allocates no
    vocabulary-sized array (a fresh one is page-faulted in on every call)."""
    bufs = getattr(_local, "bufs", None)
    if bufs is None or bufs[0].shape[0] != size:
        bufs = _local.bufs = (np.empty(size), np.empty(size), np.empty(size))
    return bufs
