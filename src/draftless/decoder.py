"""The speculative decoder: draft -> verify -> accept -> truncate -> observe.

The cache holds every committed token but the last one, the *carried* token. One step:

    draft  = source.suggest(budget)                  e.g. carried 2, draft [7 7 4]
    rows   = model.forward([carried, *draft])        [1 + len(draft), vocab]
    row i is sampled with the full sampler; tokens are committed while the sampled token
    equals draft[i]; the first mismatch is the correction, full acceptance earns the bonus
    (the sample of the last row). Rows past the first mismatch are never sampled, so the RNG
    advances exactly as in plain decoding: one draw per committed token.
    model.truncate(...) drops the rows of rejected drafts; the last committed token is carried.

A draft shorter than `min_draft`, or a step the cost gate refuses, is a plain step: forward
of the carried token alone. Plain decoding is this loop with no source.

The cost gate is kept per draft source: a source that can say which of its members would
draft (`select()`, as the cascade does) gets one gate per member, so a cold recycling matrix
whose drafts lose time is switched off without switching off conversation or reference drafts
that pay. A source without `select()` has one gate.

While a gate is off, the decoder still asks its source for a draft now and then and checks it
against the tokens plain decoding commits next (a *shadow check*, see gate.py): the committed
stream is the one a verify would have produced, so the check is exact, and it costs no forward.
A shadow draft never reaches the model, the cache or the RNG; only the gate sees it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from draftless.gate import DEFAULT_COST_TABLES, CostGate, CostTable, GateOptions
from draftless.models.base import Model
from draftless.sampling import SamplingOptions, make_rng, sample
from draftless.sources.base import DraftSource

TOPK = 8  # candidates per row handed to sources that want them (the recycling width)
DEFAULT_SOURCE = "draft"  # gate name for a source that cannot say which member drafts

# (position in the committed stream of the token this row decides, pre-penalty row [vocab])
VerifyRowHook = Callable[[int, np.ndarray], None]


class DecoderOptionsError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class SpecOptions:
    max_draft: int = 16  # drafted tokens per verify at most
    min_draft: int = 2  # shorter drafts fall back to a plain step
    gate: bool = True  # False: verify every draft, whatever it costs
    gate_options: GateOptions = field(default_factory=GateOptions)

    def __post_init__(self) -> None:
        if self.max_draft < 1:
            raise DecoderOptionsError(f"max_draft must be >= 1, got {self.max_draft}")
        if self.min_draft < 1:
            raise DecoderOptionsError(f"min_draft must be >= 1, got {self.min_draft}")


@dataclass(slots=True)
class DecodeStats:
    steps: int = 0  # forwards after the prompt
    verify_steps: int = 0  # forwards that checked a draft
    plain_steps: int = 0  # forwards of the carried token alone
    committed: int = 0  # tokens committed (every step commits >= 1)
    drafted: int = 0  # draft tokens sent to the model
    accepted: int = 0  # draft tokens the model agreed with
    bonus: int = 0  # verifies whose whole draft was accepted (the last row is free)
    dropped: int = 0  # draft tokens outside the vocabulary, never sent
    gate_off: int = 0  # times the gate turned speculation off
    gate_on: int = 0  # times a probe turned it back on
    gate_probes: int = 0
    shadow_checks: int = 0  # drafts checked against plain output while a gate was off
    forward_seconds: float = 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.committed / self.steps if self.steps else 0.0

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


@dataclass(frozen=True, slots=True)
class GenerationResult:
    token_ids: list[int]  # generated tokens, the stop token included if one ended the run
    stop_reason: str  # "stop" (an eos/stop id), "length"
    seconds: float
    stats: DecodeStats
    seed: int


class SpeculativeDecoder:
    """Stateful decoding session over one model cache (a conversation).

        dec = SpeculativeDecoder(model, sampling=SamplingOptions(), source=cascade)
        dec.append(prompt_ids)
        result = dec.generate(max_new_tokens=128)

    `append` may be called again later (the next chat turn); the cache and the source keep
    the whole stream.
    """

    def __init__(
        self,
        model: Model,
        *,
        sampling: SamplingOptions | None = None,
        source: DraftSource | None = None,
        options: SpecOptions | None = None,
        cost_table: CostTable | None = None,
        clock: Callable[[], float] | None = time.perf_counter,
        verify_row_hook: VerifyRowHook | None = None,
    ) -> None:
        self.model = model
        self.sampling = sampling or SamplingOptions()
        self.source = source
        self.options = options or SpecOptions()
        self.cost_table = cost_table or DEFAULT_COST_TABLES.get(
            model.backend, DEFAULT_COST_TABLES["hf"]
        )
        self.gates: dict[str, CostGate] = {}  # one per draft source member, made on first use
        self.clock = clock
        self.hook = verify_row_hook
        self.rng, self.seed = make_rng(self.sampling.seed)
        self.vocab = model.vocab_size
        self.history: list[int] = []  # every committed token, prompt included
        self.carried: int | None = None  # last committed token, not yet in the cache
        self.stats = DecodeStats()
        # A draft made while its gate was off: (gate, draft, stream position it continues).
        self._shadow: tuple[CostGate, list[int], int] | None = None

    # -- the stream ----------------------------------------------------------------------
    def append(self, token_ids: Sequence[int]) -> None:
        """Commit tokens that come from outside (a prompt, a chat turn) and feed the cache."""
        ids = [int(t) for t in token_ids]
        if not ids:
            return
        bad = [t for t in ids if not 0 <= t < self.vocab]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary [0, {self.vocab})")
        self._shadow = None  # tokens from outside are not what the model would have made
        pending = ([self.carried] if self.carried is not None else []) + ids[:-1]
        if pending:
            self.model.prefill(pending)
        self.carried = ids[-1]
        self.history.extend(ids)
        if self.source is not None:
            self.source.observe(ids)

    def reset(self) -> None:
        self._shadow = None
        self.model.truncate(0)
        self.history.clear()
        self.carried = None

    def truncate(self, n: int) -> None:
        """Keep the first n committed tokens (the cache holds n - 1, the n-th is carried).

        The source is not told: it cannot forget; a caller that cuts the stream rebuilds it.
        """
        if not 0 <= n <= len(self.history):
            raise ValueError(f"truncate({n}): the stream has {len(self.history)} tokens")
        if n == 0:
            self.reset()
        elif n < len(self.history):
            self._shadow = None
            self.model.truncate(n - 1)
            del self.history[n:]
            self.carried = self.history[-1]

    # -- one step ------------------------------------------------------------------------
    def step(self, max_tokens: int, stop_ids: frozenset[int] = frozenset()) -> list[int]:
        """Run one forward; commit and return 1..max_tokens tokens (ending at a stop id)."""
        if self.carried is None:
            raise RuntimeError("append a prompt before decoding")
        draft, gate = self._draft(max_tokens - 1)
        start = self.model.n_past
        inputs = [self.carried, *draft]
        committed_before = len(self.history)
        rng_state = self.rng.bit_generator.state
        t0 = self.clock() if self.clock else None
        try:
            rows = self.model.forward(inputs)  # [1 + len(draft), vocab]
            seconds = self.clock() - t0 if self.clock and t0 is not None else None
            committed = self._accept(rows, draft, stop_ids)
        except BaseException:  # an error or Ctrl-C: the step never happened
            self.model.truncate(start)  # the cache never keeps unverified rows
            del self.history[committed_before:]
            self.rng.bit_generator.state = rng_state  # nor the draws it made
            raise
        self.model.truncate(start + len(committed))  # carried + the accepted drafts
        self.carried = committed[-1]
        self._account(draft, committed, seconds, gate)
        if self._shadow is not None:
            self._check_shadow()
        if self.source is not None:
            if self.source.wants_topk:
                top = topk_rows(rows[: len(committed)], TOPK)  # [m, TOPK]
                self.source.observe_topk(inputs[: len(committed)], top)
            self.source.observe(committed)
        return committed

    def _gate_for(self, name: str) -> CostGate:
        gate = self.gates.get(name)
        if gate is None:
            gate = self.gates[name] = CostGate(self.cost_table, self.options.gate_options)
            gate.start(self.options.max_draft)
        return gate

    def _draft(self, room: int) -> tuple[list[int], CostGate | None]:
        """A draft that fits the gate's budget and `room`, and the gate of the member that
        drafted it. ([], gate): the gate refused; ([], None): nothing to draft."""
        source, opts = self.source, self.options
        if source is None or room < opts.min_draft:
            return [], None
        select = getattr(source, "select", None)
        name = select() if select is not None else DEFAULT_SOURCE
        if name is None:
            return [], None
        gate = self._gate_for(name)
        if opts.gate and not gate.allows():
            self._shadow_draft(gate)
            return [], gate
        if opts.gate and self.clock is not None and gate.wants_plain_timing():
            return [], None  # a plain step now and then keeps the live cost rescale honest
        budget = min(room, opts.max_draft, gate.budget(opts.max_draft) if opts.gate else room)
        proposal = source.suggest(budget)[:budget]
        actual = getattr(source, "last_source", None) or name
        if actual != name:  # the selected member had nothing, another one drafted
            gate = self._gate_for(actual)
            if opts.gate and not gate.allows():
                self._discard()
                self._shadow_draft(gate, proposal)
                return [], gate
        draft = self._valid(proposal)
        if len(draft) < opts.min_draft:
            if len(proposal):
                self._discard()
            return [], None
        return draft, gate

    def _valid(self, proposal: Sequence[int] | np.ndarray) -> list[int]:
        """The draft up to its first token outside the vocabulary (counted as dropped)."""
        draft: list[int] = []
        for t in proposal:
            t = int(t)
            if not 0 <= t < self.vocab:  # never reaches the model; nor does what follows it
                self.stats.dropped += 1
                break
            draft.append(t)
        return draft

    def _shadow_draft(
        self, gate: CostGate, proposal: Sequence[int] | np.ndarray | None = None
    ) -> None:
        """Keep a draft to check against plain output, for a gate that is off (see gate.py).
        One at a time; the source is told it will not be verified."""
        if self._shadow is not None or not gate.options.shadow_probe or self.source is None:
            return
        if proposal is None:
            budget = min(self.options.max_draft, gate.budget(self.options.max_draft))
            proposal = self.source.suggest(budget)[:budget]
            if len(proposal):
                self._discard()
            actual = getattr(self.source, "last_source", None)
            if actual is not None and self._gate_for(actual) is not gate:
                return  # another member drafted: not evidence about this gate
        draft = self._valid(proposal)
        if len(draft) >= self.options.min_draft:
            self._shadow = (gate, draft, len(self.history))

    def _check_shadow(self) -> None:
        """Settle the shadow draft once the committed stream decides it: at its first
        mismatch, or when every draft token has been committed."""
        assert self._shadow is not None
        gate, draft, at = self._shadow
        made = self.history[at : at + len(draft)]
        pairs = enumerate(zip(made, draft, strict=False))  # made may still be shorter
        accepted = next((i for i, (a, b) in pairs if a != b), len(made))
        if accepted == len(made) and len(made) < len(draft):
            return  # agrees so far; the next tokens decide
        self._shadow = None
        gate.record_shadow(len(draft) + 1, len(draft), accepted, accepted + 1)
        self.stats.shadow_checks += 1
        self._sync_gate_stats()

    def _discard(self) -> None:
        """Tell the source its last suggestion will not be verified."""
        discard = getattr(self.source, "truncate_pending", None)
        if discard is not None:
            discard(0)

    def _accept(self, rows: np.ndarray, draft: list[int], stop_ids: frozenset[int]) -> list[int]:
        """Sample row by row; keep going while the sample equals the draft."""
        committed: list[int] = []
        for i in range(len(draft) + 1):
            if self.hook is not None:
                self.hook(len(self.history), rows[i])
            token = sample(rows[i], self.history, self.sampling, self.rng)
            committed.append(token)
            self.history.append(token)  # penalties of row i+1 see it
            if i == len(draft) or token != draft[i] or token in stop_ids:
                break
        return committed

    def _account(
        self, draft: list[int], committed: list[int], seconds: float | None, gate: CostGate | None
    ) -> None:
        s = self.stats
        s.steps += 1
        s.committed += len(committed)
        if seconds is not None:
            s.forward_seconds += seconds
        if not draft:
            s.plain_steps += 1
            if self.options.gate:
                for g in self.gates.values():  # every gate learns what a plain step costs
                    if g is gate and not g.allows():
                        g.record_disabled_step(seconds)
                    else:
                        g.record_plain(seconds)
                self._sync_gate_stats()
            return
        n = len(committed)  # the last one is a correction or bonus unless a stop matched
        accepted = n if n <= len(draft) and committed[-1] == draft[n - 1] else n - 1
        s.verify_steps += 1
        s.drafted += len(draft)
        s.accepted += accepted
        if len(committed) == len(draft) + 1:
            s.bonus += 1
        if self.options.gate and gate is not None:
            gate.record_verify(len(draft) + 1, len(draft), accepted, len(committed), seconds)
            self._sync_gate_stats()

    def _sync_gate_stats(self) -> None:
        gates = self.gates.values()
        self.stats.gate_off = sum(g.turned_off for g in gates)
        self.stats.gate_on = sum(g.turned_on for g in gates)
        self.stats.gate_probes = sum(g.probes for g in gates)

    def gate_states(self) -> dict[str, str]:
        """Each draft source member's gate: "on", "off" or "probe"."""
        return {name: g.state.value for name, g in self.gates.items()}

    # -- a whole generation --------------------------------------------------------------
    def stream(
        self, max_new_tokens: int, stop_ids: Iterable[int] | None = None
    ) -> Iterator[list[int]]:
        """Yield committed chunks until a stop id (included) or max_new_tokens."""
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        stops = frozenset(self.model.eos_token_ids if stop_ids is None else stop_ids)
        left = max_new_tokens
        while left > 0:
            chunk = self.step(left, stops)
            left -= len(chunk)
            yield chunk
            if chunk[-1] in stops:
                return

    def generate(
        self, max_new_tokens: int, stop_ids: Iterable[int] | None = None
    ) -> GenerationResult:
        stops = frozenset(self.model.eos_token_ids if stop_ids is None else stop_ids)
        t0 = time.perf_counter()
        out: list[int] = []
        for chunk in self.stream(max_new_tokens, stops):
            out.extend(chunk)
        reason = "stop" if out and out[-1] in stops else "length"
        return GenerationResult(out, reason, time.perf_counter() - t0, self.stats, self.seed)

    def restart(
        self,
        prompt_ids: Sequence[int],
        *,
        sampling: SamplingOptions | None = None,
        source: DraftSource | None = None,
    ) -> int:
        """Begin a new generation on `prompt_ids`, keeping the cache rows of its longest common
        prefix with the stream (a server's next request, e.g. the next turn of a chat).

        The stream is fresh, as in a new decoder: the sampling options and their RNG, the
        stats, and the source (None: plain decoding), which observes the whole prompt; so the
        tokens that follow equal a new decoder's on the same prompt. The cost gates stay: what
        a verify costs on this model and how each source member's drafts have paid is not
        knowledge about one stream, and a short request should not pay to learn it again.
        Returns the number of cache rows kept (prompt tokens not prefilled again).

        Worked example: stream [5 9 2 7 4] (cache 5 9 2 7, 4 carried); restart([5, 9, 2, 7,
        1, 3]) keeps the 4 rows of 5 9 2 7, prefills [1], carries 3 and returns 4.
        On an error (e.g. ContextFull) the stream is reset to empty.
        """
        ids = [int(t) for t in prompt_ids]
        if not ids:
            raise ValueError("restart needs a non-empty prompt")
        bad = [t for t in ids if not 0 <= t < self.vocab]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary [0, {self.vocab})")
        # The cache holds history[:-1]; the prompt's last token is carried, never cached.
        limit = min(len(ids) - 1, self.model.n_past, len(self.history))
        keep = 0
        while keep < limit and self.history[keep] == ids[keep]:
            keep += 1
        self.sampling = sampling or SamplingOptions()
        self.rng, self.seed = make_rng(self.sampling.seed)
        self.source = source
        self.stats = DecodeStats()
        self._shadow = None
        try:
            self.model.truncate(keep)
            if keep < len(ids) - 1:
                self.model.prefill(ids[keep:-1])
        except BaseException:
            self.reset()
            raise
        self.history = ids
        self.carried = ids[-1]
        if source is not None:
            source.observe(ids)
        return keep


def topk_rows(rows: np.ndarray, k: int) -> np.ndarray:
    """Top-k token ids of each row, best first (ties: lower id first): [m, k] int32.

    Never sorts a whole row. The k-th largest value of a strided sample of the row is a lower
    bound of the row's k-th largest value, so every true top-k entry passes `row >= bound`;
    only those few candidates are sorted. ~10x cheaper than argpartition on a 49k-row.
    """
    m, vocab = rows.shape
    k = min(k, vocab)
    out = np.empty((m, k), dtype=np.int32)
    if vocab <= 4 * _TOPK_SAMPLE:  # small rows: a full sort is cheap enough
        out[:] = np.argsort(-rows, axis=1, kind="stable")[:, :k]
        return out
    stride = vocab // _TOPK_SAMPLE
    bounds = np.partition(rows[:, ::stride], -k, axis=1)[:, -k]  # [m]
    for i in range(m):
        cand = np.flatnonzero(rows[i] >= bounds[i])  # ascending ids, true top-k among them
        out[i] = cand[np.argsort(-rows[i, cand], kind="stable")[:k]]
    return out


_TOPK_SAMPLE = 1024  # strided sample size that bounds the k-th largest value


def generate(
    model: Model,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    *,
    sampling: SamplingOptions | None = None,
    source: DraftSource | None = None,
    options: SpecOptions | None = None,
    stop_ids: Iterable[int] | None = None,
    cost_table: CostTable | None = None,
    verify_row_hook: VerifyRowHook | None = None,
) -> GenerationResult:
    """One generation from a fresh cache: plain when `source` is None, else speculative."""
    model.truncate(0)
    dec = SpeculativeDecoder(
        model,
        sampling=sampling,
        source=source,
        options=options,
        cost_table=cost_table,
        verify_row_hook=verify_row_hook,
    )
    dec.append(prompt_ids)
    return dec.generate(max_new_tokens, stop_ids)
