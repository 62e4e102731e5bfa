"""The cost gate: speculate only while it pays.

A verify forward of k new tokens costs C(k) plain-step equivalents and commits a + 1 tokens
(a accepted drafts, plus the correction or bonus token, which is free). The gate estimates

    est_speedup = sum(committed) / sum(verify cost)      over a rolling window of verifies

and turns speculation off below `min_speedup`. Plain steps that happen because the source had
no draft (fallback steps) cost what plain decoding costs and never enter the window.

C(k) is a measured table (`CostTable`, interpolated), rescaled by live timings through a
clamped EWMA multiplier: a noisy timing moves the estimate by at most `scale_alpha` of its
clamped deviation, so one scheduler stall cannot flip the gate, while a machine whose
economics differ from the table is learned within a few verifies.

States: ON -> (est < min_speedup) -> OFF. How an OFF gate comes back depends on
`shadow_probe`:

- shadow (the default): while the gate is off, the decoder still asks the source for a draft
  and, instead of verifying it, checks it against the tokens plain decoding commits next.
  Decoding is lossless, so those tokens are the ones a verify would have committed: the check
  says exactly how many draft tokens a verify would have accepted, at no cost. The gate turns
  ON once its last `probe_steps` shadow checks would have paid at least min_speedup +
  probe_margin, priced with the current cost estimate.
- blind (the design record's): OFF for `reprobe_after` plain steps -> PROBE of `probe_steps`
  real verifies -> ON if est >= min_speedup + probe_margin (wait resets to the base), else
  OFF again with the wait doubled, up to `reprobe_max`.

A blind probe that fails costs up to probe_steps x (C(k) - 1) plain steps; where verifies are
dear (llama.cpp on an AVX2 CPU, C(3) ~ 2.3) that is ~5 steps every 128, ~4% of a run that
cannot gain, per draft source. The shadow check costs a draft lookup per plain step (tens of
microseconds) and re-enables as soon as drafts would pay, not at the next probe.

Shadow turn-ons back off in evidence rather than in time: when a turn-on is undone before
`window` real verifies have held it, the next one needs twice as many passing checks (up to
`window`); one that holds resets the need to `probe_steps`. Acceptance that hovers at the
break-even would otherwise flap on and off, paying two losing verifies per cycle.
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path


class GateOptionsError(ValueError):
    """Base of the gate's named option errors."""


class RateWindowTooSmall(GateOptionsError):
    pass


class ProbeStepsZero(GateOptionsError):
    pass


class CostTableEmpty(GateOptionsError):
    pass


class ReprobeAfterZero(GateOptionsError):
    pass


@dataclass(frozen=True, slots=True)
class CostTable:
    """Verify cost of a forward of k new tokens, in plain-step equivalents (C(1) is 1)."""

    ks: tuple[int, ...]  # strictly increasing forward widths
    costs: tuple[float, ...]  # plain-step equivalents, one per k

    def __post_init__(self) -> None:
        if not self.ks:
            raise CostTableEmpty("the cost table is empty: it needs at least one (k, cost) entry")
        if len(self.ks) != len(self.costs):
            raise GateOptionsError("cost table: ks and costs differ in length")
        if any(k < 1 for k in self.ks) or any(
            b <= a for a, b in zip(self.ks, self.ks[1:], strict=False)
        ):
            raise GateOptionsError(
                f"cost table: ks must be increasing integers >= 1, got {self.ks}"
            )
        if any(not math.isfinite(c) or c <= 0 for c in self.costs):
            raise GateOptionsError(f"cost table: costs must be positive numbers, got {self.costs}")

    @classmethod
    def from_mapping(cls, table: Mapping[int, float]) -> CostTable:
        items = sorted((int(k), float(c)) for k, c in table.items())
        return cls(tuple(k for k, _ in items), tuple(c for _, c in items))

    def cost(self, k: int) -> float:
        """C(k), linearly interpolated; past the last entry, extended at the last slope
        (or proportionally when the table has one entry); never below 1."""
        ks, cs = self.ks, self.costs
        if k <= ks[0]:
            value = cs[0] if len(ks) > 1 or k == ks[0] else cs[0] * k / ks[0]
        elif k >= ks[-1]:
            if len(ks) == 1:
                value = cs[0] * k / ks[0]
            else:
                slope = max(0.0, (cs[-1] - cs[-2]) / (ks[-1] - ks[-2]))
                value = cs[-1] + slope * (k - ks[-1])
        else:
            i = next(i for i, kk in enumerate(ks) if kk >= k)
            k0, k1, c0, c1 = ks[i - 1], ks[i], cs[i - 1], cs[i]
            value = c0 + (c1 - c0) * (k - k0) / (k1 - k0)
        return max(1.0, value)

    def to_json(self) -> str:
        return json.dumps({"ks": list(self.ks), "costs": list(self.costs)})

    @classmethod
    def load(cls, path: Path) -> CostTable:
        data = json.loads(path.read_text())
        return cls(tuple(int(k) for k in data["ks"]), tuple(float(c) for c in data["costs"]))


# Shipped defaults, used until `draftless probe` stores a table for the model and machine.
# Measured with SmolLM2-135M on a 2-core x86 machine: transformers fp32; llama.cpp Q4_1 built
# for AVX2, where a batch costs nearly k single steps (no batched kernel for Q4_1 there).
DEFAULT_COST_TABLES: dict[str, CostTable] = {
    "hf": CostTable((1, 2, 4, 8, 16, 32), (1.0, 1.47, 1.7, 2.0, 2.5, 3.7)),
    "llamacpp": CostTable((1, 2, 4, 8, 16, 32), (1.0, 1.7, 2.85, 5.1, 10.0, 19.7)),
}


@dataclass(frozen=True, slots=True)
class GateOptions:
    min_speedup: float = 1.0  # speculate while est_speedup >= this
    probe_margin: float = 0.10  # a probe re-enables only at >= min_speedup + margin
    window: int = 16  # verify steps in the rolling window
    # Drafted tokens before the gate may act. The record's 8, with its long first drafts,
    # meant "two verifies"; our drafts are capped at the cost-optimal length, 2 tokens on a
    # steep table, where 8 would take four losing verifies per source before the gate acts.
    min_window_drafted: int = 4
    min_window_verifies: int = 2  # verifies before the gate may act
    reprobe_after: int = 128  # disabled steps before the first probe
    reprobe_max: int = 1024  # cap of the doubling wait
    probe_steps: int = 4  # verifies in one probe
    scale_alpha: float = 0.2  # EWMA weight of one live timing
    scale_min: float = 0.25  # clamp of the live multiplier
    scale_max: float = 4.0
    shadow_probe: bool = True  # an OFF gate comes back on shadow checks, not blind probes

    def __post_init__(self) -> None:
        if self.window < 2 or self.window < self.min_window_verifies:
            raise RateWindowTooSmall(
                "gate window must hold >= 2 verifies (and >= min_window_verifies), "
                f"got {self.window}"
            )
        if self.probe_steps <= 0:
            raise ProbeStepsZero("gate probe_steps must be >= 1")
        if self.reprobe_after <= 0:
            raise ReprobeAfterZero("gate reprobe_after must be >= 1")
        if self.reprobe_max < self.reprobe_after:
            raise GateOptionsError("gate reprobe_max must be >= reprobe_after")
        if not 0.0 < self.scale_alpha <= 1.0:
            raise GateOptionsError(f"gate scale_alpha must be in (0, 1], got {self.scale_alpha}")
        if not 0.0 < self.scale_min <= 1.0 <= self.scale_max:
            raise GateOptionsError("gate scale clamp must satisfy 0 < scale_min <= 1 <= scale_max")
        if self.min_speedup <= 0 or self.probe_margin < 0:
            raise GateOptionsError("gate min_speedup must be > 0 and probe_margin >= 0")


CALIBRATE_EVERY = 32  # timed verifies between two plain steps taken to time a plain step
PRIOR_TOKEN_ACCEPTANCE = 0.8  # per-token acceptance assumed before any evidence
PRIOR_WEIGHT = 4.0  # draft tokens' worth of evidence the prior counts for


class GateState(Enum):
    ON = "on"
    OFF = "off"
    PROBE = "probe"


@dataclass(slots=True)
class _Verify:
    drafted: int
    accepted: int
    committed: int
    cost: float  # plain-step equivalents


@dataclass
class CostGate:
    """Decides, step by step, whether the decoder should verify a draft.

    Usage per decoder step:
        if gate.allows():   verify; gate.record_verify(k, drafted, accepted, committed, seconds)
        else:               plain step; gate.record_disabled_step(seconds)
    and for a plain step taken because there was no draft: gate.record_plain(seconds).
    """

    table: CostTable
    options: GateOptions = field(default_factory=GateOptions)

    def __post_init__(self) -> None:
        self.state = GateState.ON
        self._window: deque[_Verify] = deque(maxlen=self.options.window)
        self._shadow: deque[_Verify] = deque(maxlen=self.options.window)  # checks while OFF
        # Shadow checks needed to turn on: probe_steps, doubled (up to the window) each time
        # a shadow turn-on is undone before the window has filled with real verifies.
        self._need = self.options.probe_steps
        self._since_on = -1  # real verifies since a shadow turn-on still on trial; -1: none
        self._scale = 1.0  # live multiplier on the table
        self._plain_seconds: float | None = None  # EWMA of a plain step's wall time
        self._timed_verifies = 0  # timed verifies since the last plain timing
        self._wait = self.options.reprobe_after  # disabled steps before the next probe
        self._left = 0  # disabled steps left, or probe verifies left
        self.turned_off = 0
        self.turned_on = 0
        self.probes = 0
        self.shadow_checks = 0

    # -- queries -------------------------------------------------------------------------
    def allows(self) -> bool:
        return self.state is not GateState.OFF

    def verify_cost(self, k: int) -> float:
        """Cost of a forward of k new tokens in plain-step equivalents (never below 1)."""
        return max(1.0, self._scale * self.table.cost(k))

    @property
    def scale(self) -> float:
        return self._scale

    def est_speedup(self) -> float | None:
        cost = sum(v.cost for v in self._window)
        return sum(v.committed for v in self._window) / cost if cost > 0 else None

    def _evidence(self) -> deque[_Verify]:
        """Verifies the budget learns from: the window, or the shadow checks while OFF."""
        return self._shadow if self.state is GateState.OFF else self._window

    def acceptance(self) -> float | None:
        evidence = self._evidence()
        drafted = sum(v.drafted for v in evidence)
        return sum(v.accepted for v in evidence) / drafted if drafted else None

    def token_acceptance(self) -> float:
        """Per-token acceptance p, as if each draft token were accepted with probability p
        until the first rejection: accepted / (accepted + verifies that hit a rejection).
        A prior of PRIOR_TOKEN_ACCEPTANCE, worth PRIOR_WEIGHT draft tokens, keeps it sane
        on little evidence."""
        evidence = self._evidence()
        accepted = sum(v.accepted for v in evidence)
        rejections = sum(1 for v in evidence if v.accepted < v.drafted)
        p = PRIOR_TOKEN_ACCEPTANCE
        return (accepted + p * PRIOR_WEIGHT) / (accepted + rejections + PRIOR_WEIGHT)

    def prior_rate(self, max_draft: int) -> float:
        """Tokens per plain-step equivalent the best draft is expected to commit before any
        evidence: max over d <= max_draft of E(d) / C(d + 1) at PRIOR_TOKEN_ACCEPTANCE."""
        p, expected, term, best = PRIOR_TOKEN_ACCEPTANCE, 1.0, 1.0, 0.0
        for d in range(1, max(1, max_draft) + 1):
            term *= p
            expected += term
            best = max(best, expected / self.verify_cost(d + 1))
        return best

    def start(self, max_draft: int) -> None:
        """Choose the first state, before any evidence. With shadow probes, a gate whose
        drafts would not clear the probe bar even at the prior acceptance (a steep table:
        llama.cpp on an AVX2 CPU, ~1.07x at best) starts OFF, and its source earns its first
        verify with shadow checks; on a flat table (~2x) exploring with real verifies is
        cheap and the gains are large, so it starts ON, as in the record."""
        bar = self.options.min_speedup + self.options.probe_margin
        if self.options.shadow_probe and self.prior_rate(max_draft) < bar:
            self.state = GateState.OFF
            self._left = self._wait

    def budget(self, max_draft: int) -> int:
        """Draft budget: the record's acceptance-adaptive max(2, 2 + ceil(acceptance x
        max_draft)) (max_draft while the window is empty), capped at the draft length that
        maximises expected committed tokens per unit of verify cost.

        With per-token acceptance p, a draft of d tokens commits E(d) = 1 + p + ... + p^d
        tokens for C(d + 1) plain steps. Steep tables (llama.cpp on CPU: C(17) ~ 6) favour
        short drafts; flat ones (transformers: C(17) ~ 2) favour long ones.
        """
        acc = self.acceptance()
        limit = max_draft if acc is None else min(max_draft, max(2, 2 + math.ceil(acc * max_draft)))
        p = self.token_acceptance()
        best_d, best_rate, expected, term = limit, -1.0, 1.0, 1.0
        for d in range(1, limit + 1):
            term *= p
            expected += term  # E(d)
            rate = expected / self.verify_cost(d + 1)
            if rate > best_rate + 1e-12:
                best_d, best_rate = d, rate
        return max(2, min(limit, best_d)) if limit >= 2 else limit

    # -- updates -------------------------------------------------------------------------
    def wants_plain_timing(self) -> bool:
        """True when the live rescale has no recent plain step to compare verifies with: none
        yet after a timed verify, or none in the last CALIBRATE_EVERY timed verifies. A gate
        that is always on would otherwise never learn that its table is wrong."""
        if self._timed_verifies == 0:
            return False
        return self._plain_seconds is None or self._timed_verifies >= CALIBRATE_EVERY

    def record_plain(self, seconds: float | None = None) -> None:
        """A plain step taken while the gate allowed speculation (no draft to verify)."""
        self._time_plain(seconds)

    def record_disabled_step(self, seconds: float | None = None) -> None:
        """A plain step taken because the gate is off."""
        self._time_plain(seconds)
        if self.state is GateState.OFF and not self.options.shadow_probe:
            self._left -= 1
            if self._left <= 0:
                self.state = GateState.PROBE
                self.probes += 1
                self._left = self.options.probe_steps
                self._window.clear()

    def record_verify(
        self, k: int, drafted: int, accepted: int, committed: int, seconds: float | None = None
    ) -> None:
        """One verify forward of k new tokens that committed `committed` tokens."""
        if seconds is not None:
            self._timed_verifies += 1
        if seconds is not None and self._plain_seconds:
            observed = seconds / self._plain_seconds / self.table.cost(k)
            observed = min(self.options.scale_max, max(self.options.scale_min, observed))
            self._scale += self.options.scale_alpha * (observed - self._scale)
        self._window.append(_Verify(drafted, accepted, committed, self.verify_cost(k)))
        if self._since_on >= 0:
            self._since_on += 1
            if self._since_on >= self.options.window:  # the turn-on held: back to the base
                self._need, self._since_on = self.options.probe_steps, -1
        if self.state is GateState.PROBE:
            self._left -= 1
            if self._left <= 0:
                probe_est = self.est_speedup() or 0.0
                if probe_est >= self.options.min_speedup + self.options.probe_margin:
                    self._turn_on()
                else:
                    self._wait = min(self.options.reprobe_max, self._wait * 2)
                    self._turn_off(count=False)
            return
        if self._ready():
            window_est = self.est_speedup()
            if window_est is not None and window_est < self.options.min_speedup:
                self._turn_off(count=True)

    def record_shadow(self, k: int, drafted: int, accepted: int, committed: int) -> None:
        """What a verify of k tokens would have done, had the gate allowed it: a draft of
        `drafted` tokens checked against the tokens plain decoding committed after it.
        Ignored unless the gate is OFF and shadow_probe is set."""
        if self.state is not GateState.OFF or not self.options.shadow_probe:
            return
        self.shadow_checks += 1
        self._shadow.append(_Verify(drafted, accepted, committed, self.verify_cost(k)))
        if len(self._shadow) < self._need:
            return
        recent = list(self._shadow)[-self._need :]
        est = sum(v.committed for v in recent) / sum(v.cost for v in recent)
        if est >= self.options.min_speedup + self.options.probe_margin:
            self._turn_on()
            self._window.extend(recent)  # the evidence that turned it on
            self._shadow.clear()
            self._since_on = 0

    def reset_window(self) -> None:
        self._window.clear()

    # -- internals -----------------------------------------------------------------------
    def _ready(self) -> bool:
        drafted = sum(v.drafted for v in self._window)
        return (
            len(self._window) >= self.options.min_window_verifies
            and drafted >= self.options.min_window_drafted
        )

    def _time_plain(self, seconds: float | None) -> None:
        if seconds is None or seconds <= 0:
            return
        self._timed_verifies = 0
        if self._plain_seconds is None:
            self._plain_seconds = seconds
        else:
            self._plain_seconds += self.options.scale_alpha * (seconds - self._plain_seconds)

    def _turn_off(self, *, count: bool) -> None:
        if self._since_on >= 0:  # a shadow turn-on that did not hold: ask for more evidence
            self._need = min(self.options.window, self._need * 2)
            self._since_on = -1
        if count:
            self.turned_off += 1
            self._wait = self.options.reprobe_after
        self.state = GateState.OFF
        self._left = self._wait
        self._window.clear()
        self._shadow.clear()

    def _turn_on(self) -> None:
        self.state = GateState.ON
        self.turned_on += 1
        self._wait = self.options.reprobe_after
