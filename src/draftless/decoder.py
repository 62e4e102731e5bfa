"""The speculative decoder: draft -> verify -> accept -> truncate -> observe.

The cache holds every committed token but the last one, the *carried* token. One step:

    draft  = source.propose(budget)                  e.g. carried 2, draft [7 7 4]
    rows   = model.forward([carried, *draft])        [1 + len(draft), vocab]
    row i is sampled with the full sampler; tokens are committed while the sampled token
    equals draft[i]; the first mismatch is the correction, full acceptance earns the bonus
    (the sample of the last row). Rows past the first mismatch are never sampled, so the RNG
    advances exactly as in plain decoding: one draw per committed token.
    model.truncate(...) drops the rows of rejected drafts; the last committed token is carried.

A draft shorter than `min_draft`, or one whose cost gate is off, is a plain step: a forward
of the carried token alone. There is one gate per member of the source and evidence bucket
(the length of the match behind the draft; gate.py), named "conversation/9-16"; it sets the
draft's length. While a gate is off its drafts are still taken and checked against what plain
decoding commits (shadow checks), at no cost to the stream; on a steep table (an 8-token draft
lost costs 2+ plain steps) one at a time, each starting where the last settled. Plain decoding
is this loop with no source. Drafts never pass the room left in the context, and a run ends
where the context ends (stop reason "context"), exactly where plain decoding ends.

A constraint (a grammar, a JSON schema; constraint.py) masks every sampled row, plain or
verify, with what it allows after the tokens committed before that row, and cuts a draft at
its first token it refuses; it follows the committed tokens only, so the answer is still
plain's under the same constraint. Where it forces the next tokens (`constraint.Forcing`: a
schema's next key) and the source has no longer draft, those are the draft, the "grammar"
member's, under a gate of its own (a forced 1-token draft may pay: its acceptance is near 1).

Who uses a model's cache: the decoder that last stepped on it. A decoder made on a model
starts from an empty cache; every operation on the cache runs under the model's lock
(`hold(model)`), and a decoder that finds another one's stream in the cache rebuilds its own
first. `generate()` holds the lock for the whole run, so threads sharing a model take turns.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from draftless._jit import HAVE_NUMBA, njit
from draftless.constraint import Constraint, Forcing
from draftless.costs import CostTable, table_for
from draftless.errors import UserError
from draftless.gate import CostGate, GateOptions, LiveCosts, evidence_bucket, prior_acceptance
from draftless.metrics import DecodeStats
from draftless.models.base import ContextFull, Model
from draftless.sampling import SamplingOptions, best_first, make_rng, sample
from draftless.sources.base import Draft, DraftSource, check_source

TOPK = 8  # candidates per row handed to sources that want them (the recycling width)
MAX_SHADOWS = 8  # shadow drafts waiting to be settled at once
# The member whose drafts are the tokens a constraint forces (`constraint.Forcing`), and its
# gate's prior per-token acceptance. Not 1: the model may write the forced text in other
# tokens. The structured benchmark's answers wrote every forced token llguidance offered at
# their positions (316 of 316 on Qwen, 593 of 593 on SmolLM2: docs/bench/structured/
# grammar-mask.txt), so the prior is near 1 and the gate learns the rest.
GRAMMAR = "grammar"
GRAMMAR_PRIOR = 0.9

# (position in the committed stream of the token this row decides, pre-penalty row [vocab])
VerifyRowHook = Callable[[int, np.ndarray], None]


class DecoderOptionsError(UserError, ValueError):
    pass


class PromptError(UserError, ValueError):
    """Prompt ids a model cannot take: text instead of ids, non-integer ids, none at all."""


class TokenOutOfVocabulary(PromptError):
    """A prompt token id the model has no row for: ids made by another model's tokenizer, or
    a tokenizer that emits ids past its model's embeddings (a mismatched pair)."""

    def __init__(self, token_id: int, vocab: int) -> None:
        super().__init__(
            f"token id {token_id} is outside the vocabulary [0, {vocab}) of this model: the "
            "ids were not made for it, or its tokenizer does not match its weights"
        )


def token_ids_of(token_ids: Iterable[int]) -> list[int]:
    """The ids as Python ints. Raises PromptError for text (a str is a sequence too, of
    characters) and for an id that is not an integer: int() would take 1.5 as 1 and True as 1,
    and decode something the caller never asked for."""
    if isinstance(token_ids, str | bytes):
        raise PromptError(
            "the prompt must be token ids, not text: encode it first "
            "(model.tokenizer.encode(text), or apply_chat_template(messages) for a chat)"
        )
    ids: list[int] = []
    for pos, t in enumerate(token_ids):
        if isinstance(t, bool | np.bool_) or not isinstance(t, int | np.integer):
            raise PromptError(f"token ids must be integers, got {t!r} at position {pos}")
        ids.append(int(t))
    return ids


def check_ids(ids: Sequence[int], vocab: int) -> None:
    """Raise TokenOutOfVocabulary at the first id outside [0, vocab)."""
    bad = next((t for t in ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise TokenOutOfVocabulary(bad, vocab)


@dataclass(frozen=True, slots=True)
class SpecOptions:
    max_draft: int = 64  # drafted tokens per verify at most (the gate picks the length)
    min_draft: int = 2  # shorter drafts fall back to a plain step
    gate: bool = True  # False: verify every draft, whatever it costs
    gate_options: GateOptions = field(default_factory=GateOptions)

    def __post_init__(self) -> None:
        if self.max_draft < 1:
            raise DecoderOptionsError(f"max_draft must be >= 1, got {self.max_draft}")
        if self.min_draft < 1:
            raise DecoderOptionsError(f"min_draft must be >= 1, got {self.min_draft}")


@dataclass(slots=True)
class _Shadow:
    name: str  # the gate's name
    gate: CostGate
    draft: Draft
    at: int  # the stream position the draft continues
    agreed: int = 0  # draft tokens the stream has committed as drafted so far


@dataclass(frozen=True, slots=True)
class GenerationResult:
    token_ids: list[int]  # generated tokens, the stop token included if one ended the run
    stop_reason: str  # "stop" (an eos/stop id), "length" (max_new_tokens), "context" (full)
    seconds: float
    stats: DecodeStats
    seed: int


# -- who owns a model's cache ---------------------------------------------------------------


@dataclass(slots=True)
class _CacheClaim:
    lock: threading.RLock = field(default_factory=threading.RLock)
    owner: object | None = None  # the decoder whose stream the cache holds


_CLAIMS: weakref.WeakKeyDictionary[object, _CacheClaim] = weakref.WeakKeyDictionary()
_CLAIMS_LOCK = threading.Lock()


def _claim_of(model: object) -> _CacheClaim:
    with _CLAIMS_LOCK:
        claim = _CLAIMS.get(model)
        if claim is None:
            claim = _CLAIMS[model] = _CacheClaim()
        return claim


def hold(model: Model) -> contextlib.AbstractContextManager[object]:
    """The model's lock (re-entrant): `with hold(model): ...` keeps other threads' decoders
    off the model's cache until the block ends. `generate()` holds it for a whole run."""
    return _claim_of(model).lock


class SpeculativeDecoder:
    """Stateful decoding session over one model cache (a conversation).

        dec = SpeculativeDecoder(model, sampling=SamplingOptions(), source=cascade)
        dec.append(prompt_ids)
        result = dec.generate(max_new_tokens=128)

    `append` may be called again later (the next chat turn); the cache and the source keep
    the whole stream. The cost table defaults to `costs.table_for(model)`: the one `draftless
    probe` stored for this model and backend, else the backend's shipped table.
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
        constraint: Constraint | None = None,
    ) -> None:
        if source is not None:
            check_source(source)
        # What the generated tokens must follow (None: anything), and how many it consumed.
        self.constraint = constraint
        self._forcing = constraint if isinstance(constraint, Forcing) else None
        self._consumed = 0
        self.model = model
        self.sampling = sampling or SamplingOptions()
        self.source = source
        self.options = options or SpecOptions()
        self.cost_table = cost_table or table_for(model)[0]
        self.gates: dict[str, CostGate] = {}  # one per draft source member, made on first use
        # What a forward costs here, learned from every timed step; the gates share it.
        self.live_costs = LiveCosts(self.cost_table, self.options.gate_options)
        self.clock = clock
        self.hook = verify_row_hook
        self.rng, self.seed = make_rng(self.sampling.seed)
        self.vocab = model.vocab_size
        self.history: list[int] = []  # every committed token, prompt included
        self.carried: int | None = None  # last committed token, not yet in the cache
        self.stats = DecodeStats()
        # Drafts made while their gate was off, waiting for the stream to settle them.
        self._shadows: list[_Shadow] = []
        # Per member, over its settled drafts (verified or shadow-checked): [accepted draft
        # tokens, drafts that met a rejection]. A steep gate's prior follows it.
        self._pool: dict[str, list[int]] = {}
        self._since_reject: int | None = None  # tokens since the last rejection, if resyncing
        self._verified = False  # the last step verified a draft (its forward had a new shape)
        self._claim = _claim_of(model)
        with self._claim.lock:  # a new decoder starts from an empty cache, its own
            model.truncate(0)
            self._claim.owner = self

    # -- the cache -----------------------------------------------------------------------
    @contextlib.contextmanager
    def _owning(self) -> Iterator[None]:
        """Hold the model's lock; if the cache holds another stream, rebuild ours first."""
        with self._claim.lock:
            cached = max(0, len(self.history) - 1)
            if self._claim.owner is not self or self.model.n_past != cached:
                self.model.truncate(0)
                if cached:
                    self.model.prefill(self.history[:cached])
                self._claim.owner = self
            yield

    def room(self) -> int | None:
        """Tokens the cache can still take (the carried one included); None: no limit."""
        n_ctx = self.model.n_ctx
        return None if n_ctx is None else n_ctx - max(0, len(self.history) - 1)

    # -- the stream ----------------------------------------------------------------------
    def append(self, token_ids: Sequence[int]) -> None:
        """Commit tokens that come from outside (a prompt, a chat turn) and feed the cache.

        Raises ContextFull, changing nothing, if the stream would not leave room for the
        first forward."""
        ids = token_ids_of(token_ids)
        if not ids:
            return
        check_ids(ids, self.vocab)
        n_ctx = self.model.n_ctx
        if n_ctx is not None and len(self.history) + len(ids) > n_ctx:
            raise ContextFull(len(self.history), len(ids), n_ctx)
        with self._owning():
            self._shadows.clear()  # tokens from outside are not what the model would have made
            pending = ([self.carried] if self.carried is not None else []) + ids[:-1]
            if pending:
                self.model.prefill(pending)
            self.carried = ids[-1]
            self.history.extend(ids)
        if self.source is not None:
            self.source.observe(ids)

    def reset(self) -> None:
        with self._owning():
            self._shadows.clear()
            self._unconsume(len(self.history))
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
            with self._owning():
                self._shadows.clear()
                self.model.truncate(n - 1)
                self._unconsume(len(self.history) - n)
                del self.history[n:]
                self.carried = self.history[-1]

    def _unconsume(self, dropped: int) -> None:
        """The stream loses its last `dropped` tokens: the constraint forgets those of them
        it consumed (generated ones; a prompt is never consumed)."""
        n = min(dropped, self._consumed)
        if n > 0 and self.constraint is not None:
            self.constraint.rollback(n)
            self._consumed -= n

    # -- one step ------------------------------------------------------------------------
    def step(self, max_tokens: int, stop_ids: frozenset[int] = frozenset()) -> list[int]:
        """Run one forward; commit and return 1..max_tokens tokens (ending at a stop id)."""
        if self.carried is None:
            raise RuntimeError("append a prompt before decoding")
        with self._owning():
            return self._step(self.carried, max_tokens, stop_ids)

    def _step(self, carried: int, max_tokens: int, stop_ids: frozenset[int]) -> list[int]:
        room = self.room()
        if room is not None and room < 1:
            raise ContextFull(self.model.n_past, 1, self.model.n_ctx or 0)
        limit = max_tokens - 1 if room is None else min(max_tokens, room) - 1
        draft, gate = self._draft(limit, stop_ids)
        drafted = draft.tokens if draft is not None else []
        start = self.model.n_past
        inputs = [carried, *drafted]
        committed_before = len(self.history)
        # Greedy sampling draws nothing; reading the generator's state right after a forward
        # (cold caches) costs ~26 us against ~3 warm (benchmarks/step_overhead.py --cold), so
        # it is kept only when the step will draw.
        rng_state = None if self.sampling.greedy else self.rng.bit_generator.state
        t0 = self.clock() if self.clock else None
        try:
            rows = self.model.forward(inputs)  # [1 + len(draft), vocab]
            seconds = self.clock() - t0 if self.clock and t0 is not None else None
            committed = self._accept(rows, drafted, stop_ids)
        except BaseException:  # an error or Ctrl-C: the step never happened
            self.model.truncate(start)  # the cache never keeps unverified rows
            self._unconsume(len(self.history) - committed_before)
            del self.history[committed_before:]
            if rng_state is not None:
                self.rng.bit_generator.state = rng_state  # nor the draws it made
            raise
        self.model.truncate(start + len(committed))  # carried + the accepted drafts
        self.carried = committed[-1]
        self._account(draft, committed, seconds, gate)
        if self._shadows:
            self._check_shadows()
        if self.source is not None:
            if self._wants_topk():
                top = topk_rows(rows[: len(committed)], TOPK)  # [m, TOPK]
                self.source.observe_topk(inputs[: len(committed)], top)
            self.source.observe(committed)
        return committed

    def _wants_topk(self) -> bool:
        """Whether this step's rows go to the source as top-k rows. They feed one member's
        drafts (the cascade's recycling) and cost a step 60-120 us, most of it cache misses
        right after a forward (benchmarks/step_overhead.py): 1.2% of SmolLM2's step on
        llama.cpp, where recycling's short drafts never pay (its gate stays off). So they are
        computed while that member's gate is on or not yet made; while it is off the member
        still learns committed bigrams, and its shadow checks can turn it on again."""
        source = self.source
        if source is None or not source.wants_topk:
            return False
        member = source.topk_member
        if member is None or not self.options.gate:
            return True
        gate = self.gates.get(member)
        return gate is None or gate.allows()

    def _gate_for(self, draft: Draft) -> tuple[str, CostGate]:
        """The gate of a draft's member and evidence bucket, made on first use."""
        bucket = evidence_bucket(draft.match_len)
        name = draft.member if bucket is None else f"{draft.member}/{bucket}"
        gate = self.gates.get(name)
        if gate is None:
            opts = self.options
            forced = draft.member == GRAMMAR
            prior = GRAMMAR_PRIOR if forced else prior_acceptance(bucket)
            gate = self.gates[name] = CostGate(
                self.cost_table, opts.gate_options, prior, pricing=self.live_costs
            )
            gate.start(
                opts.max_draft,
                1 if forced else opts.min_draft,
                pool=self._pool.setdefault(draft.member, [0, 0]),
            )
        return name, gate

    def _draft(
        self, room: int, stop_ids: frozenset[int] = frozenset()
    ) -> tuple[Draft | None, CostGate | None]:
        """A draft cut to its gate's budget, `room` and its first stop id, and that gate.
        (None, gate): the gate is off (the draft became a shadow check); (None, None):
        nothing to draft. The source's draft, or the constraint's forced tokens where they
        are longer."""
        source, opts = self.source, self.options
        if source is None or room < 1:
            return None, None
        made: tuple[Draft | None, CostGate | None] = (None, None)
        if room >= opts.min_draft:
            proposal = source.propose(min(room, opts.max_draft))
            if proposal is not None:
                made = self._judge(proposal, room, stop_ids, opts.min_draft)
        if self._forcing is not None:
            forced = self._forcing.forced()[: min(room, opts.max_draft)]
            if forced and (made[0] is None or len(forced) > len(made[0].tokens)):
                own = self._judge(Draft(forced, GRAMMAR), room, stop_ids, 1)
                if own[0] is not None:
                    return own
        return made

    def _judge(
        self, proposal: Draft, room: int, stop_ids: frozenset[int], min_draft: int
    ) -> tuple[Draft | None, CostGate | None]:
        """`proposal` cut to its gate's budget, `room`, its first stop id and what the
        constraint allows, if its gate lets it be verified (see `_draft`)."""
        opts = self.options
        name, gate = self._gate_for(proposal)
        shadow = opts.gate and not gate.allows()
        if shadow and (
            len(self._shadows) >= MAX_SHADOWS
            or (gate.steep and any(x.gate is gate for x in self._shadows))  # one at a time
        ):
            return None, gate  # no room for another shadow check: nothing to size or build
        budget = min(room, opts.max_draft, gate.budget(opts.max_draft) if opts.gate else room)
        tokens = through_first_stop(self._valid(proposal.tokens[:budget]), stop_ids)
        if self.constraint is not None:  # a token it refuses could only be rejected
            tokens = tokens[: self.constraint.valid_prefix(tokens)]
        if len(tokens) < min_draft:
            return None, None
        draft = Draft(tokens, proposal.member, proposal.match_len)
        if shadow:
            self._shadows.append(_Shadow(name, gate, draft, len(self.history)))
            return None, gate
        if opts.gate and not gate.pays(len(tokens)):
            return None, None  # shorter than its budget, too short to pay: a plain step
        if opts.gate and self.clock is not None and self.live_costs.wants_plain_timing():
            return None, None  # a plain step now and then keeps the live cost rescale honest
        return draft, gate

    def _valid(self, proposal: Sequence[int]) -> list[int]:
        """The draft up to its first token outside the vocabulary (counted as dropped)."""
        draft: list[int] = []
        for t in proposal:
            t = int(t)
            if not 0 <= t < self.vocab:  # never reaches the model; nor does what follows it
                self.stats.dropped += 1
                break
            draft.append(t)
        return draft

    def _check_shadows(self) -> None:
        """Settle each shadow draft the committed stream has decided: at its first mismatch,
        or when every draft token has been committed. The gate learns what a verify at that
        position would have accepted (decoding is lossless, so this is exact)."""
        waiting = []
        turned_on = 0
        history = self.history
        for shadow in self._shadows:
            draft, at = shadow.draft.tokens, shadow.at
            made = min(len(history) - at, len(draft))  # committed since, up to the draft's end
            accepted = shadow.agreed  # compared at earlier steps: only the new ones are read
            while accepted < made and history[at + accepted] == draft[accepted]:
                accepted += 1
            if accepted == made < len(draft):
                shadow.agreed = accepted
                waiting.append(shadow)  # agrees so far; the next tokens decide
                continue
            before = shadow.gate.turned_on
            shadow.gate.record_shadow(len(draft) + 1, len(draft), accepted, accepted + 1)
            self._pool_add(shadow.draft.member, len(draft), accepted)
            turned_on += shadow.gate.turned_on - before
            self.stats.shadow_checks += 1
            self.stats.member(shadow.draft.member).shadow_checks += 1
            self.stats.evidence_of(shadow.name).shadow_checks += 1
        self._shadows = waiting
        if turned_on:  # a check only ever turns a gate on; the stats copy the gates' counts
            self._sync_gate_stats()

    def _accept(self, rows: np.ndarray, draft: list[int], stop_ids: frozenset[int]) -> list[int]:
        """Sample row by row; keep going while the sample equals the draft."""
        committed: list[int] = []
        constraint = self.constraint
        for i in range(len(draft) + 1):
            if self.hook is not None:
                self.hook(len(self.history), rows[i])
            allowed = None if constraint is None else constraint.allowed()
            token = sample(rows[i], self.history, self.sampling, self.rng, allowed)
            if constraint is not None:  # row i+1's mask follows it
                constraint.consume(token)
                self._consumed += 1
            committed.append(token)
            self.history.append(token)  # penalties of row i+1 see it
            if i == len(draft) or token != draft[i] or token in stop_ids:
                break
        return committed

    def _account(
        self,
        draft: Draft | None,
        committed: list[int],
        seconds: float | None,
        gate: CostGate | None,
    ) -> None:
        s = self.stats
        s.steps += 1
        s.committed += len(committed)
        if seconds is not None:
            s.forward_seconds += seconds
        # the gap measures how soon the source rejoins a text; forced tokens are not its
        self._track_resync(
            None if draft is not None and draft.member == GRAMMAR else draft, committed
        )
        after_verify, self._verified = self._verified, draft is not None
        if draft is None:
            s.plain_steps += 1
            if self.options.gate:  # what a plain step costs, for every gate
                self.live_costs.record_plain(seconds, after_verify)
            return
        tokens = draft.tokens
        n = len(committed)  # the last one is a correction or bonus unless a stop matched
        accepted = n if n <= len(tokens) and committed[-1] == tokens[n - 1] else n - 1
        s.verify_steps += 1
        s.drafted += len(tokens)
        s.accepted += accepted
        if n == len(tokens) + 1:
            s.bonus += 1
        s.draft_lengths[len(tokens)] = s.draft_lengths.get(len(tokens), 0) + 1
        name = self._gate_for(draft)[0]
        self._pool_add(draft.member, len(tokens), accepted)
        for counts in (s.member(draft.member), s.evidence_of(name)):
            counts.verifies += 1
            counts.drafted += len(tokens)
            counts.accepted += accepted
        if self.options.gate and gate is not None:
            gate.record_verify(len(tokens) + 1, len(tokens), accepted, n, seconds)
            self._sync_gate_stats()

    def _pool_add(self, member: str, drafted: int, accepted: int) -> None:
        pool = self._pool.setdefault(member, [0, 0])
        pool[0] += accepted
        pool[1] += accepted < drafted

    def _track_resync(self, draft: Draft | None, committed: list[int]) -> None:
        """The re-synchronisation gap: tokens committed after a verify that hit a rejection
        until the next verify that accepts a draft token (a histogram in stats)."""
        accepted = draft is not None and committed[0] == draft.tokens[0]
        if self._since_reject is not None and accepted:
            gaps = self.stats.resync_gaps
            gaps[self._since_reject] = gaps.get(self._since_reject, 0) + 1
            self._since_reject = None
        elif self._since_reject is not None:
            self._since_reject += len(committed)
        rejected = draft is not None and committed[: len(draft.tokens)] != draft.tokens
        if rejected and self._since_reject is None:
            self._since_reject = 0  # this verify hit a rejection: count from here

    def _sync_gate_stats(self) -> None:
        for name, g in self.gates.items():
            counts = self.stats.evidence_of(name)
            counts.gate_off, counts.gate_on = g.turned_off, g.turned_on
        self.stats.gate_off = sum(g.turned_off for g in self.gates.values())
        self.stats.gate_on = sum(g.turned_on for g in self.gates.values())

    def gate_states(self) -> dict[str, str]:
        """Each gate ("conversation/9-16", "recycling", ...): "on" or "off"."""
        return {name: g.state.value for name, g in self.gates.items()}

    # -- a whole generation --------------------------------------------------------------
    def at_context_end(self) -> bool:
        """True when the cache has no room left for another forward."""
        room = self.room()
        return room is not None and room < 1

    def stream(
        self, max_new_tokens: int, stop_ids: Iterable[int] | None = None
    ) -> Iterator[list[int]]:
        """Yield committed chunks until a stop id (included), max_new_tokens, or the end of
        the context."""
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        stops = frozenset(self.model.eos_token_ids if stop_ids is None else stop_ids)
        left = max_new_tokens
        while left > 0 and not self.at_context_end():
            chunk = self.step(left, stops)
            left -= len(chunk)
            yield chunk
            if chunk[-1] in stops:
                return

    def stop_reason(self, out: Sequence[int], max_new_tokens: int, stops: frozenset[int]) -> str:
        """Why a run that produced `out` ended: "stop", "context" or "length"."""
        if out and out[-1] in stops:
            return "stop"
        if len(out) < max_new_tokens and self.at_context_end():
            return "context"
        return "length"

    def generate(
        self, max_new_tokens: int, stop_ids: Iterable[int] | None = None
    ) -> GenerationResult:
        stops = frozenset(self.model.eos_token_ids if stop_ids is None else stop_ids)
        t0 = time.perf_counter()
        out: list[int] = []
        for chunk in self.stream(max_new_tokens, stops):
            out.extend(chunk)
        reason = self.stop_reason(out, max_new_tokens, stops)
        return GenerationResult(out, reason, time.perf_counter() - t0, self.stats, self.seed)

    def restart(
        self,
        prompt_ids: Sequence[int],
        *,
        sampling: SamplingOptions | None = None,
        source: DraftSource | None = None,
        between: Callable[[], None] | None = None,
        constraint: Constraint | None = None,
    ) -> int:
        """Begin a new generation on `prompt_ids`, keeping the cache rows of its longest common
        prefix with the stream (a server's next request, e.g. the next turn of a chat).
        `constraint`, when given, is what the generated tokens must follow (from its start).

        `between()`, when given, is called between pieces of the prefill and may raise (a
        server's cancelled request: a long prompt can take minutes on a CPU). The pieces are
        the model's own (`n_batch` tokens from the first row prefilled, where the backend
        would split one call), so the cache holds the same rows either way. What was
        prefilled before the raise stays as the stream, for the next restart to reuse. An
        error before that (e.g. ContextFull) resets the stream to empty.

        The stream is fresh, as in a new decoder: the sampling options and their RNG, the
        stats, and the source (None: plain decoding), which observes the whole prompt; so the
        tokens that follow equal a new decoder's on the same prompt. The cost gates stay: what
        a verify costs on this model and how each source member's drafts have paid is not
        knowledge about one stream, and a short request should not pay to learn it again.
        Returns the number of cache rows kept (prompt tokens not prefilled again).

        Worked example: stream [5 9 2 7 4] (cache 5 9 2 7, 4 carried); restart([5, 9, 2, 7,
        1, 3]) keeps the 4 rows of 5 9 2 7, prefills [1], carries 3 and returns 4.
        """
        ids = token_ids_of(prompt_ids)
        if not ids:
            raise PromptError("restart needs a non-empty prompt")
        check_ids(ids, self.vocab)
        if source is not None:
            check_source(source)
        n_ctx = self.model.n_ctx
        with self._owning():
            if n_ctx is not None and len(ids) > n_ctx:
                self.reset()
                raise ContextFull(0, len(ids), n_ctx)
            # The cache holds history[:-1]; the prompt's last token is carried, never cached.
            limit = min(len(ids) - 1, self.model.n_past, len(self.history))
            keep = 0
            while keep < limit and self.history[keep] == ids[keep]:
                keep += 1
            self.sampling = sampling or SamplingOptions()
            self.rng, self.seed = make_rng(self.sampling.seed)
            self.source = source
            self.constraint, self._consumed = constraint, 0
            self._forcing = constraint if isinstance(constraint, Forcing) else None
            self.stats = DecodeStats()
            self._shadows.clear()
            self._since_reject = None
            try:
                self.model.truncate(keep)
            except BaseException:
                self.reset()
                raise
            piece = getattr(self.model, "n_batch", 0) if between is not None else 0
            piece = piece if isinstance(piece, int) and piece > 0 else len(ids)
            done = keep  # rows the cache holds
            stopped = False  # between() raised
            try:
                while done < len(ids) - 1:
                    if done > keep and between is not None:
                        stopped = True
                        between()
                        stopped = False
                    end = min(done + piece, len(ids) - 1)
                    self.model.prefill(ids[done:end])
                    done = end
            except BaseException:
                if stopped:  # the rows done and the next token, carried: a stream of its own
                    self.history = ids[: done + 1]
                    self.carried = ids[done]
                    if source is not None:
                        source.observe(self.history)
                else:
                    self.reset()
                raise
            self.history = ids
            self.carried = ids[-1]
        if source is not None:
            source.observe(ids)
        return keep


def through_first_stop(tokens: list[int], stop_ids: frozenset[int]) -> list[int]:
    """A draft up to and including its first stop id. If the model accepts that token the run
    ends there, so whatever a draft holds after it can never be committed, only paid for: a
    copy's draft that runs on past the copied text's end-of-turn into the prompt's next turn
    (benchmarks/verify_trace.py on a copy: a 55-token verify that committed 21)."""
    if not stop_ids or stop_ids.isdisjoint(tokens):
        return tokens
    return tokens[: next(i for i, t in enumerate(tokens) if t in stop_ids) + 1]


def topk_rows(rows: np.ndarray, k: int) -> np.ndarray:
    """Top-k token ids of each row, best first (ties: lower id first): [m, k] int32.

    NaN ranks below every number, as in a stable sort of -row. Every step pays this for
    recycling, right after a forward has evicted the caches: with numba it is one compiled
    pass (`_top_rows_into`, ~4x faster there than `best_first`'s five numpy calls).
    """
    m, vocab = rows.shape
    k = min(k, vocab)
    out = np.empty((m, k), dtype=np.int32)  # [m, k]
    if HAVE_NUMBA:
        _top_rows_into(rows, out)
        return out
    for i in range(m):
        out[i] = best_first(rows[i], k)
    return out


@njit
def _top_rows_into(rows, out):
    """out[i] := the positions of the out.shape[1] largest values of rows[i], best first.

    One pass in blocks of 64, keeping the best k so far in order. Once k are kept, a block
    whose maximum does not beat the last kept value is skipped whole. A value enters only
    if it beats the last kept one and goes after every kept value it does not beat, so ties
    keep the lower position. NaNs are skipped (a block with one is scanned value by value),
    then fill the slots left, if any, in position order.
    """
    m, size = rows.shape
    k = out.shape[1]
    vals = np.empty(k, dtype=np.float64)  # the kept values, best first
    for i in range(m):
        n = 0  # values kept so far
        for start in range(0, size, 64):
            stop = min(size, start + 64)
            if n == k:
                best = rows[i, start]
                for j in range(start + 1, stop):
                    best = max(best, rows[i, j])
                if best == best and not best > vals[k - 1]:
                    continue
            for j in range(start, stop):
                v = rows[i, j]
                if v != v or (n == k and not v > vals[k - 1]):
                    continue
                p = n if n < k else k - 1
                while p > 0 and v > vals[p - 1]:
                    vals[p] = vals[p - 1]
                    out[i, p] = out[i, p - 1]
                    p -= 1
                vals[p] = v
                out[i, p] = j
                n = min(n + 1, k)
        j = 0
        while n < k:  # fewer numbers than k: the NaNs, lowest position first
            if rows[i, j] != rows[i, j]:
                out[i, n] = j
                n += 1
            j += 1


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
    clock: Callable[[], float] | None = time.perf_counter,
    constraint: Constraint | None = None,
) -> GenerationResult:
    """One generation from a fresh cache: plain when `source` is None, else speculative.
    `clock` times forwards for the gate's live rescale; None prices them by the table alone.
    `constraint`: what the generated tokens must follow (a grammar), from its start.

    Holds the model for the whole run: threads sharing a model take turns, and each gets
    what it would have got alone."""
    with hold(model):
        dec = SpeculativeDecoder(
            model,
            sampling=sampling,
            source=source,
            options=options,
            cost_table=cost_table,
            clock=clock,
            verify_row_hook=verify_row_hook,
            constraint=constraint,
        )
        dec.append(prompt_ids)
        if dec.carried is None:
            raise PromptError("the prompt is empty: generation starts from at least one token id")
        return dec.generate(max_new_tokens, stop_ids)
