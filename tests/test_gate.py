"""The cost gate: table interpolation, live rescale, shadow checks, budget, options."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from draftless.costs import DEFAULT_COST_TABLES, CostTable, CostTableError
from draftless.errors import UserError
from draftless.gate import (
    CostGate,
    GateOptions,
    GateOptionsError,
    GateState,
    LiveCosts,
    evidence_bucket,
    pooled_prior,
    prior_acceptance,
)

TABLE = CostTable((1, 2, 4, 8, 16), (1.0, 1.65, 1.42, 2.84, 4.5))
# llama.cpp on an AVX2 CPU without batched kernels (SmolLM2's Q4_1 before patch 0003): a forward
# of k costs ~0.6 k plain steps, so short drafts cannot pay and long ones barely do
STEEP = CostTable((1, 2, 4, 8, 16, 32), (1.0, 1.7, 2.85, 5.1, 10.0, 19.7))


def test_cost_table_interpolates_and_extends() -> None:
    assert TABLE.cost(2) == 1.65
    assert TABLE.cost(4) == 1.42  # non-monotonic tables are kept as measured
    assert TABLE.cost(6) == pytest.approx((1.42 + 2.84) / 2)
    assert TABLE.cost(12) == pytest.approx((2.84 + 4.5) / 2)
    assert TABLE.cost(32) == pytest.approx(4.5 + (4.5 - 2.84) / 8 * 16)
    assert CostTable((8,), (0.5,)).cost(8) == 1.0  # never below one plain step
    assert CostTable((4,), (2.0,)).cost(8) == 4.0  # one entry: proportional


def test_cost_table_round_trips_json(tmp_path) -> None:
    path = tmp_path / "t.json"
    path.write_text(TABLE.to_json())
    assert CostTable.load(path) == TABLE


@pytest.mark.parametrize(
    ("build", "error"),
    [
        (lambda: CostTable((), ()), CostTableError),
        (lambda: GateOptions(window=1), GateOptionsError),
        (lambda: GateOptions(probe_steps=0), GateOptionsError),
        (lambda: GateOptions(scale_alpha=0), GateOptionsError),
    ],
)
def test_invalid_options_raise_named_errors(build, error) -> None:
    assert issubclass(error, UserError)  # the CLI prints them as one line
    with pytest.raises(error):
        build()


def losing_verify(gate: CostGate) -> None:
    gate.record_verify(k=9, drafted=8, accepted=0, committed=1)  # 1 token for 2.84+ steps


def winning_verify(gate: CostGate) -> None:
    gate.record_verify(k=9, drafted=8, accepted=8, committed=9)


def test_gate_waits_for_enough_evidence_then_trips() -> None:
    gate = CostGate(TABLE, GateOptions(min_window_drafted=8, min_window_verifies=2))
    gate.record_verify(k=3, drafted=2, accepted=0, committed=1)
    assert gate.allows()  # one verify is too noisy to act on
    gate.record_verify(k=3, drafted=2, accepted=0, committed=1)
    assert gate.allows()  # only 4 drafted tokens
    gate.record_verify(k=5, drafted=4, accepted=0, committed=1)
    assert not gate.allows() and gate.turned_off == 1


def test_default_gate_acts_after_two_short_losing_verifies() -> None:
    # Two 2-token drafts, nothing accepted: 2 tokens for 2 x C(3) plain steps.
    gate = CostGate(TABLE, GateOptions())
    gate.record_verify(k=3, drafted=2, accepted=0, committed=1)
    assert gate.allows()  # one verify is too noisy to act on
    gate.record_verify(k=3, drafted=2, accepted=0, committed=1)
    assert not gate.allows() and gate.turned_off == 1


def off_gate(**options: object) -> CostGate:
    gate = CostGate(TABLE, GateOptions(probe_steps=3, **options))  # type: ignore[arg-type]
    losing_verify(gate)
    losing_verify(gate)
    assert gate.state is GateState.OFF
    return gate


def test_shadow_checks_turn_an_off_gate_back_on_and_time_alone_never_does() -> None:
    gate = off_gate()
    for _ in range(5000):  # no blind probe, however long it waits
        gate.record_plain()
    assert gate.state is GateState.OFF
    cost = gate.verify_cost(9)  # 3.05: 8 of 8 accepted commits 9 (3x); 1 of 8, 2 (0.66x)
    gate.record_shadow(k=9, drafted=8, accepted=8, committed=9)
    gate.record_shadow(k=9, drafted=8, accepted=8, committed=9)
    assert gate.state is GateState.OFF  # probe_steps (3) checks are needed
    gate.record_shadow(k=9, drafted=8, accepted=1, committed=2)  # 20 / 9.14 = 2.2x
    assert gate.allows() and gate.turned_on == 1 and gate.shadow_checks == 3
    assert gate.est_speedup() == pytest.approx(20 / (3 * cost))  # the checks seed the window
    gate.record_shadow(k=9, drafted=8, accepted=0, committed=1)  # ignored while ON
    assert gate.shadow_checks == 3


def test_shadow_checks_need_the_probe_margin_over_a_rolling_window() -> None:
    gate = off_gate()
    for _ in range(3):  # k = 3 costs 1.65: 2 tokens are 1.21x, 1 token 0.61x
        gate.record_shadow(k=3, drafted=2, accepted=0, committed=1)
    assert gate.state is GateState.OFF
    gate.record_shadow(k=3, drafted=2, accepted=1, committed=2)  # window 4/4.95: off
    gate.record_shadow(k=3, drafted=2, accepted=1, committed=2)  # 5/4.95 = 1.01 < 1.1
    assert gate.state is GateState.OFF
    gate.record_shadow(k=3, drafted=2, accepted=2, committed=3)  # 7/4.95 = 1.41
    assert gate.state is GateState.ON


def test_a_lucky_run_of_checks_after_many_failures_does_not_turn_the_gate_on() -> None:
    """Free-form text repeats a short phrase now and then: four passing checks in a row
    after a dozen failing ones are the best of sixteen, and verifies after them lose. The
    turn-on also needs the drafts the budget would make under all the checks and the prior
    to clear the bar; a source that keeps passing gets there as the failures age out."""
    steep = STEEP  # C(3) ~ 2.3: a 2-token draft must be accepted whole
    gate = CostGate(steep, prior=prior_acceptance("3-4"))
    gate.start(64)
    assert gate.state is GateState.OFF
    for _ in range(12):
        gate.record_shadow(k=3, drafted=2, accepted=0, committed=1)
    passing = 0
    while not gate.allows() and passing < 32:
        gate.record_shadow(k=3, drafted=2, accepted=2, committed=3)  # 3 / 2.3 = 1.3x each
        passing += 1
    assert gate.allows() and 4 < passing <= 16  # not after the first 4 (probe_steps)
    fresh = CostGate(steep, prior=prior_acceptance("3-4"))
    fresh.start(64)
    for _ in range(4):  # the same four with no failures before them: on at once
        fresh.record_shadow(k=3, drafted=2, accepted=2, committed=3)
    assert fresh.allows()


def test_shadow_evidence_sets_the_budget_while_off() -> None:
    steep = CostTable((1, 2, 4, 8, 16), (1.0, 1.4, 2.2, 3.5, 6.2))
    budgets = []
    for accepted in (16, 0):
        gate = CostGate(steep, GateOptions())
        for _ in range(2):
            gate.record_verify(k=17, drafted=16, accepted=0, committed=1)
        assert gate.state is GateState.OFF and gate.budget(16) == 2  # the window was cleared
        for _ in range(3):  # fewer than probe_steps: still off
            gate.record_shadow(k=17, drafted=16, accepted=accepted, committed=accepted + 1)
        assert gate.state is GateState.OFF
        budgets.append(gate.budget(16))
    assert budgets[0] > 4 and budgets[1] == 2


def test_live_rescale_is_clamped_and_damped() -> None:
    gate = CostGate(TABLE, GateOptions())
    gate.record_plain(seconds=0.010)
    gate.record_verify(k=8, drafted=7, accepted=7, committed=8, seconds=1.0)  # 35x the table
    assert gate.scale == pytest.approx(1.0 + 0.2 * (4.0 - 1.0))  # clamped to 4, 20% of it
    gate2 = CostGate(TABLE, GateOptions())
    gate2.record_plain(seconds=0.010)
    gate2.record_verify(k=8, drafted=7, accepted=7, committed=8, seconds=0.0284)  # as the table
    assert gate2.scale == pytest.approx(1.0)
    assert gate.verify_cost(1) >= 1.0
    no_clock = CostGate(TABLE, GateOptions())
    no_clock.record_verify(k=8, drafted=7, accepted=7, committed=8, seconds=None)
    assert no_clock.scale == 1.0


def test_gates_that_share_live_costs_learn_from_each_others_verifies() -> None:
    """What a forward costs is the machine's: a verify timed under one bucket's gate rescales
    the table for every gate of the decoder, and a gate made later starts from it."""
    live = LiveCosts(TABLE, GateOptions())
    short = CostGate(TABLE, GateOptions(), 0.6, pricing=live)
    live.record_plain(0.010)
    for _ in range(5):  # twice what the table says
        short.record_verify(k=3, drafted=2, accepted=2, committed=3, seconds=0.020 * TABLE.cost(3))
    late = CostGate(TABLE, GateOptions(), 0.95, pricing=live)
    assert late.scale == short.scale == live.scale > 1.5
    assert late.verify_cost(17) == pytest.approx(live.scale * TABLE.cost(17))
    alone = CostGate(TABLE, GateOptions(), 0.95)
    assert alone.scale == 1.0 and alone.verify_cost(17) < late.verify_cost(17)
    # a gate made after the stream learned that verifies are dear starts off, earning its
    # first verify with shadow checks; on the table alone it would start on
    dear, blind = (
        CostGate(TABLE, GateOptions(), 0.6, pricing=live),
        CostGate(TABLE, GateOptions(), 0.6),
    )
    for gate in (dear, blind):
        gate.start(max_draft=16)
    assert dear.state is GateState.OFF and blind.state is GateState.ON


def test_a_verify_cost_follows_the_scale_past_the_costs_the_budget_keeps() -> None:
    live = LiveCosts(TABLE, GateOptions())
    kept = live.draft_costs(32)  # [verify_cost(d + 1)], kept while the scale holds
    assert [live.verify_cost(d + 1) for d in range(33)] == kept
    live.record_plain(0.010)
    live.record_verify(8, 0.010 * 2 * TABLE.cost(8))  # verifies cost twice the table
    assert live.scale > 1.0
    for k in (1, 2, 9, 33, 80):  # kept widths and wider ones, at the new scale
        assert live.verify_cost(k) == max(1.0, live.scale * TABLE.cost(k))


def _switched(live: LiveCosts, rounds: int = 40) -> LiveCosts:
    """Plain steps of 10 ms, a verify at the table, a plain step of 11.3 ms after it."""
    for _ in range(rounds):
        for _ in range(5):
            live.record_plain(0.010)
        live.record_verify(4, 0.010 * TABLE.cost(4))
        live.record_plain(0.0113, after_verify=True)
    return live


def test_the_plain_step_after_a_verify_charges_its_excess_to_the_verify() -> None:
    """llama.cpp builds a graph back for one token after a verify: the plain step after it
    runs dear. That is a verify's cost, not a plain step's, and it is priced so."""
    live = _switched(LiveCosts(TABLE, GateOptions()))
    assert live.switch == pytest.approx(0.13, abs=0.005)
    assert live.scale == pytest.approx(1.0, abs=0.005)  # the plain step is still 10 ms
    assert live.verify_cost(1) == 1.0
    assert live.verify_cost(4) == pytest.approx(TABLE.cost(4) + 0.13, abs=0.01)
    costs = live.draft_costs(8)
    assert costs == [live.verify_cost(d + 1) for d in range(9)]


def test_a_stall_after_a_verify_is_not_a_switch() -> None:
    live = _switched(LiveCosts(TABLE, GateOptions()))
    live.record_plain(0.5, after_verify=True)  # 50 plain steps: it moves by half a step at most
    assert live.switch < 0.13 + GateOptions().scale_alpha * 0.5 + 1e-9


def test_the_switch_stays_where_every_plain_step_follows_a_verify() -> None:
    live = _switched(LiveCosts(TABLE, GateOptions()))
    for _ in range(40):  # no plain step alone: the excess cannot be told from the step
        live.record_verify(4, 0.010 * TABLE.cost(4))
        live.record_plain(0.0113, after_verify=True)
    assert live.switch == pytest.approx(0.13, abs=0.005)


def test_plain_steps_between_verifies_keep_the_prices() -> None:
    """The budget asks for the draft costs every step; a plain step that is not after a
    verify does not reprice them (nor the switch), so they are not built again."""
    live = _switched(LiveCosts(TABLE, GateOptions()))
    costs, switch = live.draft_costs(16), live.switch
    for seconds in (0.009, 0.012, 0.0101):
        live.record_plain(seconds)
        assert live.switch == switch and live.draft_costs(16) is costs
    live.record_verify(4, 0.010 * TABLE.cost(4))
    live.record_plain(0.0113, after_verify=True)  # the next step after a verify reprices
    assert live.switch != switch and live.draft_costs(16) is not costs


def test_the_best_draft_follows_the_switch() -> None:
    live = LiveCosts(TABLE, GateOptions())
    gate = CostGate(TABLE, GateOptions(), 0.7, pricing=live)
    gate.start(16)
    before = gate.best_draft(0.7, 16)  # kept until the prices move
    live.record_plain(0.010)
    live.record_verify(4, 0.010 * TABLE.cost(4))
    live.record_plain(0.015, after_verify=True)
    assert live.switch > 0 and live.scale == 1.0
    costs = live.draft_costs(16)
    rate, d = max((sum(0.7**i for i in range(d + 1)) / costs[d], d) for d in range(2, 17))
    assert gate.best_draft(0.7, 16) == (d, pytest.approx(rate))
    assert rate < before[1]


@given(st.integers(0, 12), st.integers(0, 12), st.integers(1, 40))
def test_pays_is_expected_tokens_over_the_drafts_own_cost(accepted, rejected, drafted) -> None:
    gate = CostGate(TABLE, GateOptions(), 0.7)
    for _ in range(rejected):  # evidence moves the acceptance the check uses
        gate.record_verify(k=3, drafted=2, accepted=0, committed=1)
    for _ in range(accepted):
        gate.record_verify(k=3, drafted=2, accepted=2, committed=3)
    p = gate.token_acceptance()
    expected = sum(p**i for i in range(drafted + 1))
    assert gate.pays(drafted) == (expected >= gate.verify_cost(drafted + 1))


def test_one_noisy_sample_cannot_flip_a_winning_gate() -> None:
    gate = CostGate(TABLE, GateOptions())
    gate.record_plain(seconds=0.01)
    for _ in range(4):
        gate.record_verify(k=9, drafted=8, accepted=8, committed=9, seconds=0.03)
    gate.record_verify(k=9, drafted=8, accepted=8, committed=9, seconds=5.0)  # a stall
    assert gate.allows()


def test_adaptive_budget_formula_on_a_flat_table() -> None:
    """With verifies as cheap as plain steps, longer is always better: the record's formula
    max(2, 2 + ceil(acceptance x max_draft)) is what limits the budget."""
    flat = CostTable((1, 64), (1.0, 1.0))
    gate = CostGate(flat, GateOptions())
    assert gate.budget(16) == 16  # nothing measured yet
    gate.record_verify(k=9, drafted=8, accepted=2, committed=3)  # acceptance 0.25
    assert gate.budget(16) == 2 + 4
    gate2 = CostGate(flat, GateOptions())
    gate2.record_verify(k=9, drafted=8, accepted=0, committed=1)
    assert gate2.budget(16) == 2


def expected_rate(p: float, d: int, gate: CostGate) -> float:
    return sum(p**i for i in range(d + 1)) / gate.verify_cost(d + 1)


@pytest.mark.parametrize("accepted", [0, 3, 6, 8])
@pytest.mark.parametrize(
    "table",
    [
        CostTable((1, 2, 4, 8, 16, 32), (1.0, 1.4, 2.2, 3.5, 6.2, 11.0)),  # llama.cpp-like
        CostTable((1, 2, 4, 8, 16, 32), (1.0, 1.08, 1.5, 2.0, 2.0, 2.5)),  # transformers-like
        TABLE,
    ],
)
def test_budget_maximises_expected_tokens_per_cost(accepted: int, table: CostTable) -> None:
    """Oracle: brute force over every length the formula allows."""
    gate = CostGate(table, GateOptions(min_window_drafted=10**6))  # never trips here
    for _ in range(3):
        gate.record_verify(k=9, drafted=8, accepted=accepted, committed=accepted + 1)
    p = gate.token_acceptance()
    limit = min(16, max(2, 2 + -(-accepted * 16 // 8)))
    best = max(range(1, limit + 1), key=lambda d: (expected_rate(p, d, gate), -d))
    assert gate.budget(16) == max(2, best)


@given(
    p=st.floats(0.0, 0.999),
    steps=st.lists(st.floats(0.01, 3.0), min_size=1, max_size=8),
    top=st.integers(1, 64),
    low=st.integers(1, 4),
)
def test_best_draft_is_the_brute_force_optimum(
    p: float, steps: list[float], top: int, low: int
) -> None:
    """Oracle: every length from min_draft to max_draft tried, on tables that rise in steps
    of any size, flat stretches and dips included (the early stop must not skip a later
    optimum)."""
    ks = tuple(2**i for i in range(len(steps) + 1))
    costs = [1.0]
    for i, step in enumerate(steps):
        costs.append(max(0.5, costs[-1] + (step - 1.0) * (1 + i)))  # dips below the last too
    gate = CostGate(CostTable(ks, tuple(costs)), GateOptions())
    gate.start(top, low)
    d, rate = gate.best_draft(p, top)
    lo = min(low, top)
    rates = {k: expected_rate(p, k, gate) for k in range(lo, top + 1)}
    best = max(rates.values())
    assert rate == pytest.approx(best, rel=1e-9)
    assert lo <= d <= top and rates[d] == pytest.approx(rate, rel=1e-12)


def test_a_kept_budget_follows_the_pool_and_the_evidence() -> None:
    """budget() keeps its last answer; a new verify, shadow check or pool count changes it."""
    pool = [0, 0]
    gate = CostGate(STEEP, GateOptions(), prior=prior_acceptance("9-16"))
    gate.start(32, 2, pool=pool)
    fresh = CostGate(STEEP, GateOptions(), prior=prior_acceptance("9-16"))
    before = gate.budget(32)
    pool[:] = [0, 40]  # forty drafts of the member failed at their first token
    fresh.start(32, 2, pool=[0, 40])
    assert gate.budget(32) == fresh.budget(32) < before
    for g in (gate, fresh):
        g.record_shadow(k=3, drafted=2, accepted=2, committed=3)
    assert gate.budget(32) == fresh.budget(32)


def test_steep_costs_draft_short_and_flat_costs_draft_long() -> None:
    steep = CostGate(CostTable((1, 2, 4, 8, 16), (1.0, 1.4, 2.2, 3.5, 6.2)), GateOptions())
    flat = CostGate(CostTable((1, 2, 4, 8, 16), (1.0, 1.08, 1.5, 2.0, 2.0)), GateOptions())
    for gate in (steep, flat):
        for _ in range(4):
            gate.record_verify(k=9, drafted=8, accepted=7, committed=8)
    assert steep.budget(16) < 8 < flat.budget(16)


def test_an_always_on_gate_asks_for_plain_timings_to_rescale() -> None:
    gate = CostGate(TABLE, GateOptions())
    assert not gate.wants_plain_timing()  # nothing timed yet
    gate.record_verify(k=9, drafted=8, accepted=8, committed=9, seconds=0.05)
    assert gate.wants_plain_timing()  # a verify time means nothing without a plain one
    gate.record_plain(seconds=0.01)
    assert not gate.wants_plain_timing()
    for _ in range(31):
        gate.record_verify(k=9, drafted=8, accepted=8, committed=9, seconds=0.05)
    assert not gate.wants_plain_timing()
    gate.record_verify(k=9, drafted=8, accepted=8, committed=9, seconds=0.05)
    assert gate.wants_plain_timing()
    assert gate.scale > 1.0  # 0.05 s verifies against 0.01 s plain steps: dearer than C(9)


def test_a_gate_starts_off_where_even_the_prior_would_not_clear_the_probe_bar() -> None:
    steep, flat = STEEP, DEFAULT_COST_TABLES["hf"]
    prior = prior_acceptance("5-8")
    assert CostGate(steep).best_draft(prior, 16)[1] < 1.1 < CostGate(flat).best_draft(prior, 16)[1]
    for table, state in ((steep, GateState.OFF), (flat, GateState.ON)):
        gate = CostGate(table, prior=prior)
        gate.start(16)
        assert gate.state is state and gate.turned_off == 0
    gate = CostGate(steep, prior=prior)
    gate.start(16)
    for _ in range(4):  # a copying source earns its first verify
        gate.record_shadow(k=3, drafted=2, accepted=2, committed=3)
    assert gate.allows() and gate.turned_on == 1


def test_the_start_judges_the_drafts_the_decoder_verifies_not_shorter_ones() -> None:
    # the 1.5B at one thread (draftless probe): a 1-token draft is cheap, a 2-token one is not
    probed = CostTable((1, 2, 4, 8, 16, 32), (1.0, 1.28, 2.10, 4.12, 8.13, 16.33))
    prior = prior_acceptance(None)  # recycling's
    assert (1 + prior) / probed.cost(2) > 1.1 > (1 + prior + prior**2) / probed.cost(3)
    for min_draft, state in ((1, GateState.ON), (2, GateState.OFF)):
        gate = CostGate(probed, prior=prior)
        gate.start(16, min_draft)
        assert gate.state is state
        assert gate.best_draft(prior, 16)[0] >= min_draft
    gate = CostGate(probed, prior=0.99)
    gate.start(16, min_draft=3)
    assert gate.budget(16) >= 3 and gate.budget(2) == 2  # no room for 3: what there is


def test_a_gate_started_on_its_prior_turns_off_at_its_first_losing_verify() -> None:
    flat = DEFAULT_COST_TABLES["hf"]

    def started() -> CostGate:
        gate = CostGate(flat, GateOptions(probe_steps=3), prior=prior_acceptance("5-8"))
        gate.start(16)
        assert gate.allows()
        return gate

    gate = started()
    gate.record_verify(k=5, drafted=4, accepted=0, committed=1)
    assert not gate.allows() and gate.turned_off == 1  # the guess lost: back to shadow checks
    gate = started()
    gate.record_verify(k=5, drafted=4, accepted=4, committed=5)
    gate.record_verify(k=5, drafted=4, accepted=0, committed=1)
    assert gate.allows()  # past the first verify the window's evidence decides
    gate = started()
    gate.record_verify(k=5, drafted=4, accepted=0, committed=1)
    for _ in range(3):  # earned back by shadow checks: a turn-on with evidence
        gate.record_shadow(k=5, drafted=4, accepted=4, committed=5)
    assert gate.allows()
    gate.record_verify(k=5, drafted=4, accepted=0, committed=1)
    assert gate.allows()


def test_a_shadow_turn_on_that_does_not_hold_doubles_the_evidence_needed() -> None:
    gate = off_gate()  # probe_steps 3, window 16

    def turn_on_with_passing_checks() -> int:
        n = 0
        while not gate.allows():
            gate.record_shadow(k=9, drafted=8, accepted=8, committed=9)
            n += 1
        return n

    def lose_until_off() -> None:
        while gate.allows():
            losing_verify(gate)

    needs = []
    for _ in range(4):
        needs.append(turn_on_with_passing_checks())
        lose_until_off()
    assert needs == [3, 6, 12, 16]  # doubled up to the window
    turn_on_with_passing_checks()
    for _ in range(16):  # the turn-on holds for a window of real verifies
        winning_verify(gate)
    lose_until_off()
    assert turn_on_with_passing_checks() == 3  # back to the base


# -- evidence buckets -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("match_len", "bucket"),
    [(0, None), (1, "1"), (2, "2"), (3, "3-4"), (4, "3-4"), (5, "5-8"), (8, "5-8"),
     (9, "9-16"), (16, "9-16"), (17, "17+"), (500, "17+")],
)  # fmt: skip
def test_evidence_buckets(match_len: int, bucket: str | None) -> None:
    assert evidence_bucket(match_len) == bucket


def test_priors_grow_with_the_match_and_a_long_match_starts_on_where_a_short_one_does_not() -> None:
    priors = [prior_acceptance(b) for b in (None, "1", "2", "3-4", "5-8", "9-16", "17+")][1:]
    assert priors == sorted(priors) and all(0 < p < 1 for p in priors)
    steep = STEEP
    long_match = CostGate(steep, prior=prior_acceptance("17+"))
    short_match = CostGate(steep, prior=prior_acceptance("2"))
    long_match.start(64)
    short_match.start(64)
    assert long_match.allows() and not short_match.allows()
    assert long_match.budget(64) > short_match.budget(64) >= 2
    with pytest.raises(GateOptionsError, match="prior"):
        CostGate(steep, prior=1.0)


@given(
    prior=st.floats(0.05, 0.95),
    accepted=st.integers(0, 500),
    rejections=st.integers(0, 500),
)
def test_a_pooled_prior_only_lowers_and_follows_the_evidence(prior, accepted, rejections) -> None:
    p = pooled_prior(prior, accepted, rejections)
    assert 0 < p <= prior
    assert pooled_prior(prior, 0, 0) == prior  # no evidence: the bucket's own prior
    assert pooled_prior(prior, accepted, rejections + 1) <= p  # one more failure: not higher
    if rejections > 0:
        assert pooled_prior(prior, accepted + 50, rejections) >= p  # successes: not lower


def test_a_pooled_prior_falls_with_failures_and_turns_a_gate_off_at_start() -> None:
    flat = CostTable((1, 2, 4, 8, 16, 32), (1.0, 1.2, 1.5, 2.2, 3.5, 6.0))
    on = CostGate(flat, prior=prior_acceptance("5-8"))
    on.start(16)
    low = pooled_prior(prior_acceptance("5-8"), accepted=2, rejections=30)
    off = CostGate(flat, prior=low)
    off.start(16)
    assert on.allows() and not off.allows() and low < 0.3
