"""A constraint (a grammar) under speculation: still plain's answer, token for token.

`Automaton` is a random finite automaton over the fake vocabulary, a stand-in for a grammar
that needs no llguidance: each state allows a random subset of the tokens. The obligations:
speculative decoding under a constraint equals plain decoding under the same constraint,
for every source, sampler and draft length; every token it commits is one the constraint
allowed; no draft token the constraint refuses reaches the model; the constraint follows the
stream when a step fails or the stream is cut. The llguidance grammars are held to the same
on real models in tests/models/test_grammar.py.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftless.constraint import Constraint, Forcing, Triggered
from draftless.costs import CostTable
from draftless.decoder import SpecOptions, SpeculativeDecoder
from draftless.decoder import generate as timed_generate
from draftless.sampling import NothingAllowed, SamplingOptions, sample
from fakes import (
    InductionModel,
    alternating_source,
    garbage_source,
    perfect_source,
    random_source,
)

VOCAB = 40
PROMPT = [3, 7, 9, 3, 7, 9, 1, 2, 3, 7]
SAMPLINGS = {
    "greedy": SamplingOptions(),
    "sampled": SamplingOptions(temperature=0.8, top_k=20, seed=1234),
    "penalised": SamplingOptions(
        temperature=0.9, top_p=0.9, repeat_penalty=1.3, frequency_penalty=0.4, seed=99
    ),
    "biased": SamplingOptions(temperature=0.9, seed=7, logit_bias=((3, -100.0), (11, 2.5))),
    "greedy-biased": SamplingOptions(logit_bias=((9, -5.0), (15, 3.0))),
}
ALWAYS = SpecOptions(gate=False, min_draft=1)  # verify every draft: the decoder under test


def generate(*args, **kwargs):
    return timed_generate(*args, clock=None, **kwargs)


class Automaton:
    """A random automaton: state s allows token t iff next[s, t] >= 0. A stack of states
    makes rollback exact."""

    def __init__(self, seed: int, states: int = 5, density: float = 0.4, vocab: int = VOCAB):
        rng = np.random.default_rng(seed)
        nxt = rng.integers(0, states, size=(states, vocab))
        nxt[rng.random((states, vocab)) > density] = -1
        nxt[np.arange(states), rng.integers(0, vocab, size=states)] = rng.integers(0, states)
        self.next = nxt  # every state allows a token at least
        self.stack = [0]

    def allowed(self) -> np.ndarray:
        return self.next[self.stack[-1]] >= 0

    def consume(self, token: int) -> None:
        to = self.next[self.stack[-1], token]
        if to < 0:
            raise ValueError(f"token {token} is not allowed in state {self.stack[-1]}")
        self.stack.append(int(to))

    def rollback(self, n: int) -> None:
        assert 0 <= n < len(self.stack)
        del self.stack[len(self.stack) - n :]

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        state = self.stack[-1]
        for i, t in enumerate(tokens):
            state = self.next[state, t]
            if state < 0:
                return i
        return len(tokens)

    def accepts(self, tokens: Sequence[int]) -> bool:
        return Automaton.valid_prefix(self.fresh(), tokens) == len(tokens)

    def fresh(self) -> Automaton:
        other = object.__new__(type(self))
        other.__dict__.update(self.__dict__)
        other.stack = [0]
        return other


class ForcingAutomaton(Automaton):
    """An automaton a share of whose states allow one token only, so it forces runs of tokens
    (`constraint.Forcing`), as a schema forces its next key. `misleading`: `forced()` also
    runs on through states that allow several tokens, taking the lowest, as llguidance
    offers forced text in tokens the model may not write it in: drafts a verify can reject."""

    def __init__(self, seed: int, forcing: float = 0.6, misleading: bool = False, **kw) -> None:
        super().__init__(seed, **kw)
        rng = np.random.default_rng(seed + 1)
        states, vocab = self.next.shape
        for state in np.nonzero(rng.random(states) < forcing)[0]:
            row = np.full(vocab, -1)
            row[rng.integers(0, vocab)] = rng.integers(0, states)
            self.next[state] = row
        self.misleading = misleading
        self.offered = 0  # forced tokens offered

    def forced(self) -> list[int]:
        out: list[int] = []
        state = self.stack[-1]
        while len(out) < 12:
            (allowed,) = np.nonzero(self.next[state] >= 0)
            if len(allowed) != 1 and not self.misleading:
                break
            out.append(int(allowed[0]))
            state = self.next[state, allowed[0]]
        self.offered += len(out)
        return out


def constrained_plain(model, sampling, automaton: Automaton, n: int) -> list[int]:
    return generate(model, PROMPT, n, sampling=sampling, constraint=automaton.fresh()).token_ids


def sources(reference: list[int]) -> dict:
    return {
        "perfect": perfect_source(reference),
        "garbage": garbage_source(VOCAB),
        "alternating": alternating_source(reference, VOCAB),
        "random": random_source(VOCAB),
    }


def test_the_automaton_is_a_constraint() -> None:
    assert isinstance(Automaton(0), Constraint) and not isinstance(Automaton(0), Forcing)
    assert isinstance(ForcingAutomaton(0), Forcing)


@pytest.mark.parametrize("kind", ["perfect", "garbage", "alternating", "random"])
@pytest.mark.parametrize("name", list(SAMPLINGS))
def test_constrained_speculation_equals_constrained_plain(kind: str, name: str) -> None:
    sampling = SAMPLINGS[name]
    model = InductionModel(VOCAB, seed=5)
    automaton = Automaton(seed=12)  # one that every sampler's free run breaks (asserted)
    expected = constrained_plain(model, sampling, automaton, 80)
    assert automaton.accepts(expected)  # plain under the constraint follows it
    free = generate(model, PROMPT, 80, sampling=sampling).token_ids
    assert not automaton.accepts(free)  # and the constraint changed something
    dec_constraint = automaton.fresh()
    source = sources(PROMPT + expected)[kind]
    got = generate(
        model, PROMPT, 80, sampling=sampling, source=source, options=ALWAYS,
        constraint=dec_constraint,
    )  # fmt: skip
    assert got.token_ids == expected
    # it consumed the committed tokens, each once, and nothing else
    assert dec_constraint.stack == [0, *_states(automaton, expected)]
    if kind == "perfect":
        assert got.stats.accepted == got.stats.drafted > 0


def _states(automaton: Automaton, tokens: Sequence[int]) -> list[int]:
    walker = automaton.fresh()
    for t in tokens:
        walker.consume(t)
    return walker.stack[1:]


@settings(max_examples=40, deadline=None)
@given(
    model_seed=st.integers(0, 10_000),
    grammar_seed=st.integers(0, 10_000),
    source_seed=st.integers(0, 10_000),
    temperature=st.sampled_from([0.0, 0.7, 1.2]),
    density=st.sampled_from([0.1, 0.4, 0.8]),
    max_draft=st.integers(1, 12),
    n=st.integers(1, 60),
    forcing=st.sampled_from([None, 0.3, 0.8]),
    misleading=st.booleans(),
    trigger=st.one_of(st.none(), st.integers(0, VOCAB - 1)),
)
def test_random_sources_never_change_the_constrained_stream(
    model_seed, grammar_seed, source_seed, temperature, density, max_draft, n, forcing,
    misleading, trigger,
):  # fmt: skip
    model = InductionModel(VOCAB, seed=model_seed)
    automaton = (
        Automaton(grammar_seed, density=density)
        if forcing is None
        else ForcingAutomaton(grammar_seed, forcing, misleading, density=density)
    )
    sampling = SamplingOptions(temperature=temperature, top_p=0.9, seed=model_seed)

    def fresh():  # the automaton, or the automaton from a trigger token on
        return automaton.fresh() if trigger is None else Triggered(automaton.fresh(), trigger)

    expected = generate(model, PROMPT, n, sampling=sampling, constraint=fresh()).token_ids
    got = generate(
        model,
        PROMPT,
        n,
        sampling=sampling,
        source=random_source(VOCAB, source_seed),
        options=SpecOptions(gate=False, max_draft=max_draft, min_draft=1),
        constraint=fresh(),
    )
    assert got.token_ids == expected
    held = got.token_ids
    if trigger is not None:  # held from the trigger on, if the automaton takes it
        held = held[held.index(trigger) :] if trigger in held else []
        held = held if automaton.accepts(held[:1]) else []
    assert automaton.accepts(held)


def test_no_draft_token_the_constraint_refuses_reaches_the_model() -> None:
    model = InductionModel(VOCAB, seed=3)
    automaton = Automaton(seed=4, density=0.3)
    expected = constrained_plain(model, SAMPLINGS["greedy"], automaton, 60)
    live = automaton.fresh()
    source = garbage_source(VOCAB)
    proposed: list[list[int]] = []  # the source's proposal of each step
    propose = source.propose

    def recording(budget: int):
        draft = propose(budget)
        proposed.append([] if draft is None else list(draft.tokens))
        return draft

    source.propose = recording  # type: ignore[method-assign]
    cuts = 0

    def check(ids: list[int]) -> None:  # the constraint stands after the carried token here
        nonlocal cuts
        draft, whole = ids[1:], proposed[-1]
        if not draft:
            return
        # the longest prefix of the proposal the constraint allows: cut at its first refusal
        assert draft == whole[: len(draft)]
        assert live.valid_prefix(whole) == len(draft), (whole, draft, live.stack[-1])
        cuts += len(draft) < len(whole)

    model.on_forward = check
    got = generate(model, PROMPT, 60, source=source, options=ALWAYS, constraint=live)
    assert got.token_ids == expected
    assert got.stats.drafted > 0 and cuts > 0  # drafts were cut, and some tokens survived


def test_a_failed_step_takes_back_what_the_constraint_consumed() -> None:
    # An interrupt inside a verify, after some of its rows were sampled and consumed: the
    # step never happened, for the constraint too, and decoding resumes exactly.
    model = InductionModel(VOCAB, seed=6)
    automaton = Automaton(seed=12)
    expected = constrained_plain(model, SAMPLINGS["sampled"], automaton, 40)
    live = automaton.fresh()
    rows: list[int] = []

    def hook(position: int, row: np.ndarray) -> None:
        rows.append(dec.stats.steps)
        if len(rows) == 12:
            raise KeyboardInterrupt

    dec = SpeculativeDecoder(
        model,
        sampling=SAMPLINGS["sampled"],
        source=perfect_source(PROMPT + expected),
        options=ALWAYS,
        verify_row_hook=hook,
        constraint=live,
    )
    dec.append(PROMPT)
    with pytest.raises(KeyboardInterrupt):
        dec.generate(40)
    assert rows[-2] == rows[-1]  # rows of this step before the interrupt were consumed
    done = len(dec.history) - len(PROMPT)
    assert live.stack[1:] == _states(automaton, dec.history[len(PROMPT) :])
    dec.generate(40 - done)
    assert dec.history[len(PROMPT) :] == expected


def test_cutting_the_stream_rolls_the_constraint_back() -> None:
    model = InductionModel(VOCAB, seed=2)
    automaton = Automaton(seed=9)
    live = automaton.fresh()
    dec = SpeculativeDecoder(model, constraint=live)
    dec.append(PROMPT)
    out = dec.generate(20).token_ids
    dec.truncate(len(PROMPT) + 7)
    assert live.stack[1:] == _states(automaton, out[:7])
    dec.truncate(3)  # into the prompt: every generated token goes, nothing more
    assert live.stack == [0]


def test_sampling_never_picks_a_token_the_mask_refuses() -> None:
    rng = np.random.default_rng(0)
    row = rng.normal(size=VOCAB).astype(np.float32)
    allowed = np.zeros(VOCAB, dtype=bool)
    allowed[[4, 17, 30]] = True
    draws = np.random.default_rng(1)
    picks = {
        sample(row, [], SamplingOptions(temperature=t, seed=1), draws, allowed)
        for t in (0.0, 0.5, 1.0, 5.0)
        for _ in range(50)
    }
    assert picks <= {4, 17, 30} and len(picks) > 1
    masked = np.where(allowed, row, -np.inf)
    assert sample(row, [], SamplingOptions(), draws, allowed) == int(np.argmax(masked))
    with pytest.raises(NothingAllowed):
        sample(row, [], SamplingOptions(), draws, np.zeros(VOCAB, dtype=bool))


@pytest.mark.parametrize("best_allowed", [True, False])
def test_greedy_under_a_mask_takes_the_first_best_allowed_token(best_allowed: bool) -> None:
    row = np.array([1.0, 5.0, 3.0, 5.0, 3.0], dtype=np.float32)  # ties: the first wins
    allowed = np.array([True, best_allowed, True, True, True])
    got = sample(row, [], SamplingOptions(), np.random.default_rng(0), allowed)
    assert got == (1 if best_allowed else 3)


# -- forced tokens as drafts ----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["garbage", "random", "perfect"])
@pytest.mark.parametrize("name", list(SAMPLINGS))
def test_forced_tokens_are_drafts_that_a_verify_commits(kind: str, name: str) -> None:
    sampling = SAMPLINGS[name]
    model = InductionModel(VOCAB, seed=5)
    automaton = ForcingAutomaton(seed=12)
    expected = constrained_plain(model, sampling, automaton, 80)
    live = automaton.fresh()
    got = generate(
        model, PROMPT, 80, sampling=sampling, source=sources(PROMPT + expected)[kind],
        options=ALWAYS, constraint=live,
    )  # fmt: skip
    assert got.token_ids == expected
    assert live.stack == [0, *_states(automaton, expected)]
    forced = got.stats.members.get("grammar")
    if kind == "perfect":  # the source's draft is never shorter: the grammar's never wins
        assert forced is None
        return
    # a token the only one its state allows is sampled whatever the row says
    assert forced is not None and forced.accepted == forced.drafted > 10


@pytest.mark.parametrize("name", list(SAMPLINGS))
def test_forced_drafts_the_model_does_not_write_are_rejected_exactly(name: str) -> None:
    sampling = SAMPLINGS[name]
    model = InductionModel(VOCAB, seed=8)
    automaton = ForcingAutomaton(seed=2, forcing=0.5, misleading=True)
    expected = constrained_plain(model, sampling, automaton, 80)
    got = generate(
        model, PROMPT, 80, sampling=sampling, source=garbage_source(VOCAB), options=ALWAYS,
        constraint=automaton.fresh(),
    )  # fmt: skip
    assert got.token_ids == expected
    forced = got.stats.members["grammar"]
    assert 0 < forced.accepted < forced.drafted


@pytest.mark.parametrize(
    ("costs", "verified"),
    [
        ((1.0, 1.38, 1.85, 2.02, 2.55), True),  # the 1.5B at two threads: C(2) = 1.38 pays
        ((1.0, 2.0, 3.0, 4.0, 5.0), False),  # k tokens cost k steps: no draft ever pays
    ],
)
def test_the_gate_decides_whether_forced_drafts_pay(costs, verified: bool) -> None:
    model = InductionModel(VOCAB, seed=5)
    automaton = ForcingAutomaton(seed=12)
    expected = constrained_plain(model, SAMPLINGS["greedy"], automaton, 80)
    live = automaton.fresh()
    got = generate(
        model, PROMPT, 80, source=garbage_source(VOCAB), constraint=live,
        cost_table=CostTable((1, 2, 3, 4, 5), costs),
    )  # fmt: skip
    assert got.token_ids == expected
    assert live.offered > 20  # the constraint offered forced runs at many steps
    forced = got.stats.members.get("grammar")
    assert (forced is not None and forced.verifies > 0) is verified


# -- a constraint held back until the model opens what it holds (auto tool calls) ----------


def _triggered_case(model_seed: int, sampling: SamplingOptions, n: int = 80):
    """(model, automaton, trigger, free run): the trigger is a token the free run writes a
    few tokens in (the automaton starts with it), so the constraint takes over mid-answer."""
    model = InductionModel(VOCAB, seed=model_seed)
    free = generate(model, PROMPT, n, sampling=sampling).token_ids
    return model, _taking(ForcingAutomaton(seed=12, forcing=0.4), free[5:6]), free[5], free


def _taking(automaton: Automaton, tokens: Sequence[int]) -> Automaton:
    """`automaton` changed so that it takes `tokens` from its start."""
    state = 0
    for t in tokens:
        if automaton.next[state, t] < 0:
            automaton.next[state, t] = (state + 1) % automaton.next.shape[0]
        state = automaton.next[state, t]
    return automaton


def _opens(prefix: Sequence[int]):
    """An `opens` that says yes to `prefix`, maybe to its proper prefixes, no to the rest."""
    prefix = list(prefix)

    def opens(tokens: Sequence[int]) -> bool | None:
        tokens = list(tokens)
        if tokens == prefix:
            return True
        return None if tokens == prefix[: len(tokens)] else False

    return opens


def test_a_triggered_constraint_is_a_forcing_constraint() -> None:
    live = Triggered(ForcingAutomaton(0), token=7)
    assert isinstance(live, Forcing) and live.allowed() is None and live.forced() == []


@pytest.mark.parametrize("kind", ["perfect", "garbage", "alternating", "random"])
@pytest.mark.parametrize("name", list(SAMPLINGS))
def test_speculation_under_a_triggered_constraint_equals_plain_under_it(kind, name) -> None:
    sampling = SAMPLINGS[name]
    model, automaton, trigger, free = _triggered_case(5, sampling)
    at = free.index(trigger)
    plain_live = Triggered(automaton.fresh(), token=trigger)
    expected = generate(model, PROMPT, 80, sampling=sampling, constraint=plain_live).token_ids
    # free up to the trigger; from it the automaton's, which changed the rest
    assert expected[: at + 1] == free[: at + 1] and plain_live.opened_at == at
    assert automaton.accepts(expected[at:]) and not automaton.accepts(free[at:])
    live = Triggered(automaton.fresh(), token=trigger)
    got = generate(
        model, PROMPT, 80, sampling=sampling, source=sources(PROMPT + expected)[kind],
        options=ALWAYS, constraint=live,
    )  # fmt: skip
    assert got.token_ids == expected
    assert live.opened_at == at and live.consumed == 80
    assert live.then.stack == [0, *_states(automaton, expected[at:])]
    if kind == "perfect":  # drafts ran across the trigger and were all accepted
        assert got.stats.accepted == got.stats.drafted > 60
    if kind == "garbage":  # once it holds, what the automaton forces is drafted
        forced = got.stats.members["grammar"]
        assert forced.accepted == forced.drafted > 5


@pytest.mark.parametrize("name", list(SAMPLINGS))
def test_a_constraint_the_first_tokens_open_holds_the_whole_text(name: str) -> None:
    sampling = SAMPLINGS[name]
    model, automaton, _, free = _triggered_case(5, sampling)
    _taking(automaton, free[:3])
    results = []
    for source in (None, garbage_source(VOCAB), perfect_source(PROMPT + free)):
        live = Triggered(automaton.fresh(), opens=_opens(free[:3]))
        results.append(generate(
            model, PROMPT, 80, sampling=sampling, source=source, options=ALWAYS, constraint=live,
        ).token_ids)  # fmt: skip
        assert live.opened_at == 0 and live.then.stack == [0, *_states(automaton, results[-1])]
    assert results[0] == results[1] == results[2]
    assert results[0][:3] == free[:3] and results[0] != free and automaton.accepts(results[0])


def test_a_way_in_the_constraint_refuses_holds_nothing() -> None:
    model, automaton, trigger, free = _triggered_case(5, SAMPLINGS["greedy"])
    automaton.next[0, free[0]] = -1  # it cannot start with what the model writes
    automaton.next[0, trigger] = -1
    for live in (
        Triggered(automaton.fresh(), opens=_opens(free[:3])),
        Triggered(automaton.fresh(), token=trigger),
    ):
        got = generate(model, PROMPT, 80, source=garbage_source(VOCAB), options=ALWAYS,
                       constraint=live)  # fmt: skip
        assert got.token_ids == free and live.opened_at is None


@settings(max_examples=300, deadline=None)
@given(
    seed=st.integers(0, 1000),
    tokens=st.lists(st.integers(0, 7), max_size=14),
    prefix=st.lists(st.integers(0, 7), min_size=1, max_size=3),
    token=st.one_of(st.none(), st.integers(0, 7)),
    consumed=st.integers(0, 14),
)
def test_valid_prefix_is_what_consuming_one_by_one_allows(seed, tokens, prefix, token, consumed):
    automaton = Automaton(seed, density=0.6, vocab=8)
    if seed % 2:
        _taking(automaton, prefix)
    live = Triggered(automaton.fresh(), token=token, opens=_opens(prefix), window=4)
    for t in tokens[:consumed]:  # some consumed first, as the stream goes
        allowed = live.allowed()
        if allowed is not None and not allowed[t]:
            break
        live.consume(t)
    rest = tokens[len(live.tokens) :]
    said = live.valid_prefix(rest)
    state = (list(live.tokens), live.opened_at)
    walked = 0
    for t in rest:
        allowed = live.allowed()
        if allowed is not None and not allowed[t]:
            break
        live.consume(t)
        walked += 1
    assert said == walked
    live.rollback(walked)  # and back to where it stood
    assert (live.tokens, live.opened_at) == state
    assert live.valid_prefix(rest) == said


def test_rolling_back_over_the_way_in_lets_the_constraint_go() -> None:
    automaton = Automaton(seed=4, density=0.9)
    live = Triggered(automaton.fresh(), token=9)
    for t in (1, 2, 9):
        live.consume(t)
    after = []
    for _ in range(4):
        t = int(np.nonzero(live.allowed())[0][-1])
        live.consume(t)
        after.append(t)
    assert live.opened_at == 2 and live.then.stack[1:] == _states(automaton, [9, *after])
    live.rollback(3)
    assert live.opened_at == 2 and live.then.stack[1:] == _states(automaton, [9, *after[:1]])
    live.rollback(2)  # the trigger and the one token after it
    assert live.opened_at is None and live.then.stack == [0] and live.allowed() is None
    assert live.consumed == 2
    with pytest.raises(ValueError):
        live.rollback(3)


def test_rolling_back_before_a_no_asks_again() -> None:
    automaton = _taking(Automaton(seed=4), [5, 6])
    live = Triggered(automaton.fresh(), opens=_opens([5, 6]))
    for t in (5, 7):  # [5, 7] cannot open: no more asking
        live.consume(t)
    live.consume(6)
    assert live.opened_at is None
    live.rollback(2)
    live.consume(6)  # [5, 6] opens
    assert live.opened_at == 0 and live.then.stack[1:] == _states(automaton, [5, 6])


def test_a_failed_step_across_the_trigger_is_taken_back_and_resumed_exactly() -> None:
    sampling = SAMPLINGS["sampled"]
    model, automaton, trigger, free = _triggered_case(6, sampling, 40)
    at = free.index(trigger)
    expected = generate(
        model, PROMPT, 40, sampling=sampling, constraint=Triggered(automaton.fresh(), token=trigger)
    ).token_ids
    for fail_at_row in range(at - 1, at + 4):  # interrupts just before, at and after it
        live = Triggered(automaton.fresh(), token=trigger)

        def hook(position: int, row: np.ndarray, fail=fail_at_row) -> None:
            if position - len(PROMPT) == fail:
                raise KeyboardInterrupt

        dec = SpeculativeDecoder(
            model, sampling=sampling, source=perfect_source(PROMPT + expected), options=ALWAYS,
            verify_row_hook=hook, constraint=live,
        )  # fmt: skip
        dec.append(PROMPT)
        with pytest.raises(KeyboardInterrupt):
            dec.generate(40)
        done = dec.history[len(PROMPT) :]
        assert live.consumed == len(done)
        assert live.opened_at == (at if at < len(done) else None)
        dec.hook = None
        dec.generate(40 - len(done))
        assert dec.history[len(PROMPT) :] == expected


def test_a_trigger_after_an_opening_so_far_is_held_with_it() -> None:
    # "```json\n" then `<tool_call>`: the constraint holds from the fence, which it takes
    automaton = _taking(_taking(Automaton(seed=4, density=0.2), [5, 9]), [9])
    live = Triggered(automaton.fresh(), token=9, opens=_opens([5, 9, 6]))
    assert live.valid_prefix([5, 9]) == 2
    live.consume(5)
    assert live.opened_at is None
    live.consume(9)
    assert live.opened_at == 0 and live.then.stack[1:] == _states(automaton, [5, 9])
    elsewhere = Triggered(automaton.fresh(), token=9, opens=_opens([6, 9]))
    for t in (5, 9):  # after text that opens nothing, from the trigger
        elsewhere.consume(t)
    assert elsewhere.opened_at == 1 and elsewhere.then.stack[1:] == _states(automaton, [9])
