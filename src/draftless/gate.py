"""The cost gate: speculate only while it pays.

A verify forward of k new tokens costs C(k) plain-step equivalents (`costs.CostTable`) and
commits a + 1 tokens (a accepted drafts, plus the correction or bonus token). The gate keeps

    est_speedup = sum(committed) / sum(verify cost)      over a rolling window of verifies

and turns speculation off below `min_speedup`. Plain steps taken because the source had no
draft cost what plain decoding costs and never enter the window.

The table is rescaled by live timings through a clamped EWMA multiplier (`LiveCosts`): one
scheduler stall moves the estimate by at most `scale_alpha` of its clamped deviation, while a
machine whose economics differ from the table is learned within a few verifies. The decoder's
gates share one: what a forward costs is the machine's, not a bucket's, so every verify of the
stream teaches every gate (a bucket's gate makes a verify or three in an answer, too few to
learn a scale of its own).

One gate per draft-source member *and* evidence bucket: the length of the match behind the
draft, bucketed 1, 2, 3-4, 5-8, 9-16, 17+ (none for drafts that are not a match, such as
recycling's). A copy at 99% acceptance and a paraphrase at 40% then no longer feed one
acceptance estimate: a member can be on for long matches and off for short ones, and each
bucket sizes its own drafts. Before any evidence a bucket assumes a per-token acceptance that
grows with the match (`prior_acceptance`), worth PRIOR_WEIGHT draft tokens, lowered by what
the member's drafts in its other buckets did in this stream (`pooled_prior`).

Coming back on: while the gate is off, the decoder still takes a draft and, instead of
verifying it, checks it against the tokens plain decoding commits next (a *shadow check*).
Decoding is lossless, so those are the tokens a verify would have committed: the check says
exactly how many draft tokens a verify would have accepted, at no cost. The gate turns on
once its last `probe_steps` checks would have paid min_speedup + probe_margin, and the drafts
its budget would make under every check it holds (up to `window`, with the prior) would too:
a short run of passing checks after many failing ones is the best of many, and the verifies
that follow it lose (free-form text repeats a phrase now and then). A turn-on that
is undone before `window` real verifies have held it doubles the checks the next one needs
(up to `window`): acceptance at the break-even would otherwise flap on and off.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import InitVar, dataclass, field
from enum import Enum

from draftless.costs import CostTable
from draftless.errors import UserError


class GateOptionsError(UserError, ValueError):
    """A gate option out of its range; the message names it."""


@dataclass(frozen=True, slots=True)
class GateOptions:
    min_speedup: float = 1.0  # speculate while est_speedup >= this
    probe_margin: float = 0.10  # shadow checks turn the gate on at >= min_speedup + margin
    window: int = 16  # verifies in the rolling window
    # Drafted tokens before the gate may act. The record's 8, with its long first drafts,
    # meant "two verifies"; drafts capped at the cost-optimal length are 2 tokens on a steep
    # table, where 8 would take four losing verifies per source before the gate acts.
    min_window_drafted: int = 4
    min_window_verifies: int = 2  # verifies before the gate may act
    probe_steps: int = 4  # passing shadow checks that turn the gate on
    scale_alpha: float = 0.2  # EWMA weight of one live timing
    scale_min: float = 0.25  # clamp of the live multiplier
    scale_max: float = 4.0

    def __post_init__(self) -> None:
        if self.window < 2 or self.window < self.min_window_verifies:
            raise GateOptionsError(
                "gate window must hold >= 2 verifies (and >= min_window_verifies), "
                f"got {self.window}"
            )
        if self.probe_steps <= 0:
            raise GateOptionsError("gate probe_steps must be >= 1")
        if not 0.0 < self.scale_alpha <= 1.0:
            raise GateOptionsError(f"gate scale_alpha must be in (0, 1], got {self.scale_alpha}")
        if not 0.0 < self.scale_min <= 1.0 <= self.scale_max:
            raise GateOptionsError("gate scale clamp must satisfy 0 < scale_min <= 1 <= scale_max")
        if self.min_speedup <= 0 or self.probe_margin < 0:
            raise GateOptionsError("gate min_speedup must be > 0 and probe_margin >= 0")


CALIBRATE_EVERY = 32  # timed verifies between two plain steps taken to time a plain step
# Per-token acceptance assumed before any evidence for a draft that is not a match (Token
# Recycling's): the evidence behind it is one token, as behind a 1-token match. At 0.8 it
# started recycling ON on llama.cpp's table once verifies got cheap (patches 0003, 0004), and
# those first verifies lost: benchmarks/gate_policy.py, 0.8 -> 0.5, SmolLM2, worst prompt of
# free-form 0.917 -> 0.953, held-out 0.972 -> 0.986, RAG 0.888 -> 0.956, no family's median
# lower; on transformers' table (--table hf) no family's median lower either.
PRIOR_TOKEN_ACCEPTANCE = 0.5
PRIOR_WEIGHT = 4.0  # draft tokens' worth of evidence the prior counts for

# Evidence buckets of the match length behind a draft: (smallest length, label).
BUCKETS = ((17, "17+"), (9, "9-16"), (5, "5-8"), (3, "3-4"), (2, "2"), (1, "1"))
# Prior per-token acceptance of a bucket: a longer match is likelier to go on. Evidence
# replaces it within a few verifies or shadow checks.
BUCKET_PRIORS = {"1": 0.5, "2": 0.6, "3-4": 0.7, "5-8": 0.8, "9-16": 0.9, "17+": 0.95}


def evidence_bucket(match_len: int) -> str | None:
    """The bucket of a match length; None for a draft that is not a match (0)."""
    if 0 <= match_len < len(_BUCKET_OF):
        return _BUCKET_OF[match_len]  # asked every step: a lookup, not a search
    return next((label for low, label in BUCKETS if match_len >= low), None)


_BUCKET_OF = [next((label for low, label in BUCKETS if n >= low), None) for n in range(18)]


def prior_acceptance(bucket: str | None) -> float:
    return PRIOR_TOKEN_ACCEPTANCE if bucket is None else BUCKET_PRIORS[bucket]


# What a bucket's prior counts for, in draft tokens, against its member's pooled evidence.
POOL_WEIGHT = 8.0
# A table is steep where an 8-token draft, all lost, costs this many plain steps or more
# (C(9) - 1; llama.cpp on CPU: 3.2-6.2); on a flat one (transformers: ~1) exploring with a real
# verify is cheap. Only a steep table's gates take their prior from the member's pool (on a
# flat table the pool's lower prior cost copies more than it saved, in the replay) and their
# shadow checks one at a time.
STEEP_DRAFT, STEEP_LOSS = 8, 2.0
# Passing shadow checks that turn a steep gate on. Its checks do not overlap (see
# `CostGate.steep`), so each is a verify the gate would have made, independent evidence; four
# such at a 16-token draft would take 64 tokens of a copy to gather.
STEEP_PROBE_STEPS = 2


def pooled_prior(prior: float, accepted: int, rejections: int) -> float:
    """A new bucket's prior, lowered by what its member's drafts in the other buckets did in
    this stream: `accepted` draft tokens and `rejections` drafts that met a rejection, over
    every draft of the member settled so far (verified, or shadow-checked while off).

    A bucket's gate otherwise starts on its fixed prior (0.8 for a 5-8 token match), and on
    free-form text, where a near-repeat rarely goes on, its first verify is a 7-token draft
    that loses C(8) - 1 plain steps, 2% of a 190-token answer on the 1.5B. The member's own
    record in the stream is evidence about that: when its shadow checks at short matches keep
    failing, the longer-match bucket starts lower, and off when its drafts would not pay on
    the lower prior. The pool only ever lowers the prior: a member that does well in its
    other buckets says nothing more about this one than the bucket's prior does (raising it
    was tried in a scratch change: longer first drafts, which lost on copies and references
    in the replay). A steep gate (`CostGate.start`) applies it, and follows the pool as it
    grows: a bucket made early in a stream learns what its member did since."""
    pooled = (accepted + prior * POOL_WEIGHT) / (accepted + rejections + POOL_WEIGHT)
    return min(prior, pooled)


class LiveCosts:
    """The cost table rescaled by live timings: verify_cost(k) = max(1, scale x C(k)) +
    switch, with scale a clamped EWMA of (a verify's seconds / a plain step's seconds / C(k))
    and switch what the plain step right after a verify costs beyond a plain step, in plain
    steps. llama.cpp keeps a compute graph only for a batch of the shape it was built for, so
    a verify between plain steps builds one going in (in the verify's own time) and one
    coming out, in the next plain step's (SmolLM2, both cores: 0.12-0.15 plain steps a verify,
    `benchmarks/shape_switch.py`); charged to the plain steps, it made every verify look
    cheaper than it is. One per decoder, shared by its gates (passed as `CostGate(...,
    pricing=)`, kept as `.live`)."""

    def __init__(self, table: CostTable, options: GateOptions | None = None) -> None:
        self.table = table
        self.options = options or GateOptions()
        self.scale = 1.0
        self.switch = 0.0  # plain steps a verify costs the plain step after it
        self._plain_seconds: float | None = None  # EWMA of a plain step's wall time
        self._switch_seconds = 0.0  # EWMA of the step after a verify, beyond a plain step
        self._timed_verifies = 0  # timed verifies since the last plain timing
        self._costs: list[float] = []  # draft_costs() at _costs_key
        self._costs_key = (self.scale, self.switch)

    def verify_cost(self, k: int) -> float:
        """Cost of a forward of k new tokens in plain-step equivalents (never below 1)."""
        costs = self._costs
        if 0 < k <= len(costs) and self._costs_key == (self.scale, self.switch):
            return costs[k - 1]  # draft_costs() has it at this scale
        return max(1.0, self.scale * self.table.cost(k)) + (self.switch if k > 1 else 0.0)

    def draft_costs(self, max_draft: int) -> list[float]:
        """[verify_cost(d + 1) for d in 0..max_draft], kept while the scale holds: the
        budget asks for it every step, and the table's interpolation is not free."""
        costs = self._costs
        key = (self.scale, self.switch)
        if len(costs) <= max_draft or self._costs_key != key:
            scale, cost, switch = self.scale, self.table.cost, self.switch
            costs = self._costs = [
                max(1.0, scale * cost(d + 1)) + (switch if d else 0.0) for d in range(max_draft + 1)
            ]
            self._costs_key = key
        return costs

    def wants_plain_timing(self) -> bool:
        """True when the rescale has no recent plain step to compare verifies with: none yet
        after a timed verify, or none in the last CALIBRATE_EVERY timed verifies. A decoder
        that always verifies would otherwise never learn that its table is wrong."""
        if self._timed_verifies == 0:
            return False
        return self._plain_seconds is None or self._timed_verifies >= CALIBRATE_EVERY

    def record_plain(self, seconds: float | None, after_verify: bool = False) -> None:
        """A plain step's wall time: what a plain step costs now. The step right after a
        verify also says what that verify cost it (`switch`): its excess over a plain step,
        clamped to half a plain step either way (a stall is not a switch), is learned as
        such and the rest as a plain step. Where every plain step follows a verify the two
        cannot be told apart, and the switch stays where it was. The switch is priced in
        plain steps only at a step after a verify: the plain steps between verifies leave
        the prices (and the budget's kept costs) as they are."""
        if seconds is None or seconds <= 0:
            return
        self._timed_verifies = 0
        plain = self._plain_seconds
        if plain is None:
            self._plain_seconds = seconds
            return
        alpha = self.options.scale_alpha
        if after_verify:
            excess = min(0.5 * plain, max(-0.5 * plain, seconds - plain))
            self._switch_seconds += alpha * (excess - self._switch_seconds)
            seconds = max(0.5 * plain, seconds - self._switch_seconds)
        self._plain_seconds = plain = plain + alpha * (seconds - plain)
        if after_verify:  # repriced here only: between verifies the prices stay put
            self.switch = max(0.0, self._switch_seconds / plain)

    def record_verify(self, k: int, seconds: float | None) -> None:
        """A verify forward of k tokens took `seconds`: move the scale toward what it says."""
        if seconds is None:
            return
        self._timed_verifies += 1
        if self._plain_seconds:
            opts = self.options
            observed = seconds / self._plain_seconds / self.table.cost(k)
            observed = min(opts.scale_max, max(opts.scale_min, observed))
            self.scale += opts.scale_alpha * (observed - self.scale)


class GateState(Enum):
    ON = "on"
    OFF = "off"


@dataclass(slots=True)
class _Verify:
    drafted: int
    accepted: int
    committed: int
    cost: float  # plain-step equivalents


@dataclass
class CostGate:
    """Decides, step by step, whether the decoder should verify a draft.

    Per decoder step:
        if gate.allows():   verify; gate.record_verify(k, drafted, accepted, committed, seconds)
        else:               plain step; gate.record_plain(seconds); shadow-check a draft with
                            gate.record_shadow(k, drafted, accepted, committed)
    and a plain step taken because there was no draft: gate.record_plain(seconds).
    """

    table: CostTable
    options: GateOptions = field(default_factory=GateOptions)
    prior: float = PRIOR_TOKEN_ACCEPTANCE  # per-token acceptance before any evidence
    pricing: InitVar[LiveCosts | None] = None  # shared live costs (the decoder's); else its own

    def __post_init__(self, pricing: LiveCosts | None) -> None:
        self.live = pricing if pricing is not None else LiveCosts(self.table, self.options)
        if not 0.0 < self.prior < 1.0:
            raise GateOptionsError(f"gate prior must be in (0, 1), got {self.prior}")
        self.state = GateState.ON
        self._window: deque[_Verify] = deque(maxlen=self.options.window)
        self._shadow: deque[_Verify] = deque(maxlen=self.options.window)  # checks while OFF
        # Bumped at every change of either: the budget reads the evidence's sums every step.
        self._version = 0
        self._tally_key: tuple[GateState, int] | None = None
        self._tally_sums = (0, 0, 0)
        # Shadow checks needed to turn on: probe_steps, doubled (up to the window) each time
        # a shadow turn-on is undone before the window has filled with real verifies.
        self._need = self.options.probe_steps
        self._since_on = -1  # real verifies since a shadow turn-on still on trial; -1: none
        self._on_prior = False  # ON with no evidence but the prior (start() may set it)
        self._best_key: tuple[float, int, int, float, float] | None = None  # best_draft's last
        self._best: tuple[int, float] = (0, 0.0)
        self._max_draft = 64  # the longest draft it budgets for (start() sets it)
        self._min_draft = 2  # the shortest draft the decoder verifies (start() sets it)
        # Steep: an 8-token draft lost costs STEEP_LOSS plain steps or more (start() decides).
        # The decoder then takes this gate's shadow checks one at a time: a check starts only
        # once the last has settled, where a verify that accepted what it did would have put
        # the next draft. Checks at every step overlap: a 10-token phrase said twice passes
        # four 7-token checks in a row and turns the gate on, and the next draft runs past
        # the phrase (free-form on the 1.5B: a 7-token verify lost, 2% of the answer).
        self.steep = False
        self._pool: list[int] | None = None  # [accepted, rejections] of the member, live
        self.turned_off = 0
        self.turned_on = 0
        self.shadow_checks = 0

    # -- queries -------------------------------------------------------------------------
    def allows(self) -> bool:
        return self.state is GateState.ON

    def verify_cost(self, k: int) -> float:
        """Cost of a forward of k new tokens in plain-step equivalents (never below 1)."""
        return self.live.verify_cost(k)

    @property
    def scale(self) -> float:
        return self.live.scale

    def est_speedup(self) -> float | None:
        cost = sum(v.cost for v in self._window)
        return sum(v.committed for v in self._window) / cost if cost > 0 else None

    def _evidence(self) -> deque[_Verify]:
        """Verifies the budget learns from: the window, or the shadow checks while OFF."""
        return self._shadow if self.state is GateState.OFF else self._window

    def _tally(self) -> tuple[int, int, int]:
        """(drafted, accepted, verifies that hit a rejection) over the evidence."""
        key = (self.state, self._version)
        if key != self._tally_key:
            drafted = accepted = rejections = 0
            for v in self._evidence():
                drafted += v.drafted
                accepted += v.accepted
                rejections += v.accepted < v.drafted
            self._tally_key, self._tally_sums = key, (drafted, accepted, rejections)
        return self._tally_sums

    def acceptance(self) -> float | None:
        drafted, accepted, _ = self._tally()
        return accepted / drafted if drafted else None

    def token_acceptance(self) -> float:
        """Per-token acceptance p, as if each draft token were accepted with probability p
        until the first rejection: accepted / (accepted + verifies that hit a rejection).
        The gate's prior, worth PRIOR_WEIGHT draft tokens, keeps it sane on little evidence."""
        _, accepted, rejections = self._tally()
        p = self.current_prior()
        return (accepted + p * PRIOR_WEIGHT) / (accepted + rejections + PRIOR_WEIGHT)

    def current_prior(self) -> float:
        """The bucket's prior; on a steep gate, lowered by its member's record so far."""
        pool = self._pool
        return self.prior if pool is None else pooled_prior(self.prior, pool[0], pool[1])

    def best_draft(self, p: float, max_draft: int) -> tuple[int, float]:
        """(d, rate): the draft length d, between the shortest draft the decoder verifies and
        max_draft, that maximises expected committed tokens per unit of verify cost, E(d) /
        C(d + 1) with E(d) = 1 + p + ... + p^d, and that rate. Steep tables (llama.cpp on CPU)
        favour short drafts, flat ones long. A draft shorter than the decoder's min_draft is
        never verified, so its rate must not turn a gate on: on the 1.5B at one thread a
        1-token draft at recycling's prior pays 1.17x and the 2-token one it gets 1.04x."""
        top = max(1, max_draft)
        low = min(self._min_draft, top)
        costs = self.live.draft_costs(top)
        key = (p, top, low, self.live.scale, self.live.switch)
        if key == self._best_key:  # asked every step; the evidence moves far less often
            return self._best
        best_d, best_rate, expected, term = top, -1.0, 1.0, 1.0
        for d in range(1, top + 1):
            term *= p
            expected += term
            rate = expected / costs[d]
            if d >= low and rate > best_rate + 1e-12:
                best_d, best_rate = d, rate
        self._best_key, self._best = key, (best_d, best_rate)
        return best_d, best_rate

    def pays(self, drafted: int) -> bool:
        """Whether a verify of this many draft tokens is expected to commit at least
        min_speedup tokens per plain step of its cost, at the per-token acceptance the gate
        holds. The budget sizes the drafts the gate wants; a source can hand over fewer (its
        match ends there), and a 2-token draft that a longer budget's rate cleared can lose
        where the longer one would not (docs/bench/avx512/smollm2-pays-ab: replay and bench)."""
        p, expected, term = self.token_acceptance(), 1.0, 1.0
        for _ in range(drafted):
            term *= p
            expected += term
        return expected >= self.options.min_speedup * self.verify_cost(drafted + 1)

    def start(self, max_draft: int, min_draft: int = 2, pool: list[int] | None = None) -> None:
        """Choose the first state, before any evidence. A gate whose drafts would not clear
        the turn-on bar even at the prior acceptance (a steep table: llama.cpp on an AVX2
        CPU, ~1.07x at best) starts OFF, and its source earns its first verify with shadow
        checks; on a flat table (~2x) exploring with real verifies is cheap, so it starts ON.
        A gate started ON holds nothing but the prior, a guess: its first verify that commits
        less than it cost turns it OFF at once, to earn the next one with free shadow checks,
        where evidence would take `min_window_verifies` losing verifies. The drafts judged are
        the ones the decoder verifies, `min_draft` tokens or more.

        The gate is steep where a STEEP_DRAFT-token draft, lost, would cost STEEP_LOSS plain
        steps or more. A steep gate keeps `pool`, the member's [accepted draft tokens, drafts
        that met a rejection] over its settled drafts in this stream (the decoder's list,
        which it keeps adding to), and its prior follows it (`pooled_prior`); its shadow
        checks do not overlap, and STEEP_PROBE_STEPS of them turn it on."""
        self._max_draft, self._min_draft = max_draft, max(1, min_draft)
        self.steep = self.table.cost(STEEP_DRAFT + 1) - 1 >= STEEP_LOSS
        if self.steep:
            self._pool = pool
            self._need = self._probe_steps()
        bar = self.options.min_speedup + self.options.probe_margin
        if self.best_draft(self.current_prior(), max_draft)[1] < bar:
            self.state = GateState.OFF
        else:
            self._on_prior = True

    def budget(self, max_draft: int) -> int:
        """Draft budget: the record's acceptance-adaptive max(2, 2 + ceil(acceptance x
        max_draft)) (max_draft while there is no evidence), capped at `best_draft`."""
        acc = self.acceptance()
        low = self._min_draft
        limit = (
            max_draft if acc is None else min(max_draft, max(low, 2 + math.ceil(acc * max_draft)))
        )
        best_d, _ = self.best_draft(self.token_acceptance(), limit)
        return max(low, min(limit, best_d)) if limit >= low else limit

    def wants_plain_timing(self) -> bool:
        """See `LiveCosts.wants_plain_timing`."""
        return self.live.wants_plain_timing()

    # -- updates -------------------------------------------------------------------------
    def record_plain(self, seconds: float | None = None, after_verify: bool = False) -> None:
        """A plain step (no draft, or the gate was off): what a plain step costs now (and,
        right after a verify, what the verify cost it). Gates that share their live costs
        learn it once, from the decoder (`LiveCosts`)."""
        self.live.record_plain(seconds, after_verify)

    def record_verify(
        self, k: int, drafted: int, accepted: int, committed: int, seconds: float | None = None
    ) -> None:
        """One verify forward of k new tokens that committed `committed` tokens."""
        self.live.record_verify(k, seconds)
        self._window.append(_Verify(drafted, accepted, committed, self.verify_cost(k)))
        self._version += 1
        if self._since_on >= 0:
            self._since_on += 1
            if self._since_on >= self.options.window:  # the turn-on held: back to the base
                self._need, self._since_on = self._probe_steps(), -1
        on_prior, self._on_prior = self._on_prior, False
        if on_prior and committed < self._window[-1].cost:
            self._turn_off()  # the prior's guess met its first evidence and lost
        elif self._ready():
            window_est = self.est_speedup()
            if window_est is not None and window_est < self.options.min_speedup:
                self._turn_off()

    def record_shadow(self, k: int, drafted: int, accepted: int, committed: int) -> None:
        """What a verify of k tokens would have done, had the gate allowed it: a draft of
        `drafted` tokens checked against the tokens plain decoding committed after it.
        Ignored unless the gate is OFF."""
        if self.state is not GateState.OFF:
            return
        self.shadow_checks += 1
        self._shadow.append(_Verify(drafted, accepted, committed, self.verify_cost(k)))
        self._version += 1
        if len(self._shadow) < self._need:
            return
        recent = list(self._shadow)[-self._need :]
        est = sum(v.committed for v in recent) / sum(v.cost for v in recent)
        bar = self.options.min_speedup + self.options.probe_margin
        # A run of passing checks is the few best of many: the drafts the budget would make
        # under all the shadow evidence and the prior must also clear the bar.
        if est >= bar and self.best_draft(self.token_acceptance(), self._max_draft)[1] >= bar:
            self.state = GateState.ON
            self.turned_on += 1
            self._window.extend(recent)  # the evidence that turned it on
            self._shadow.clear()
            self._version += 1
            self._since_on = 0

    # -- internals -----------------------------------------------------------------------
    def _probe_steps(self) -> int:
        """Passing shadow checks that turn the gate on, before any turn-on failed."""
        steps = self.options.probe_steps
        return min(steps, STEEP_PROBE_STEPS) if self.steep else steps

    def _ready(self) -> bool:
        drafted = sum(v.drafted for v in self._window)
        return (
            len(self._window) >= self.options.min_window_verifies
            and drafted >= self.options.min_window_drafted
        )

    def _turn_off(self) -> None:
        if self._since_on >= 0:  # a shadow turn-on that did not hold: ask for more evidence
            self._need = min(self.options.window, self._need * 2)
            self._since_on = -1
        self.turned_off += 1
        self.state = GateState.OFF
        self._window.clear()
        self._shadow.clear()
        self._version += 1
