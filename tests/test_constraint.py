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

from draftless.constraint import Constraint, Forcing
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
)
def test_random_sources_never_change_the_constrained_stream(
    model_seed, grammar_seed, source_seed, temperature, density, max_draft, n, forcing, misleading
):
    model = InductionModel(VOCAB, seed=model_seed)
    automaton = (
        Automaton(grammar_seed, density=density)
        if forcing is None
        else ForcingAutomaton(grammar_seed, forcing, misleading, density=density)
    )
    sampling = SamplingOptions(temperature=temperature, top_p=0.9, seed=model_seed)
    expected = constrained_plain(model, sampling, automaton, n)
    got = generate(
        model,
        PROMPT,
        n,
        sampling=sampling,
        source=random_source(VOCAB, source_seed),
        options=SpecOptions(gate=False, max_draft=max_draft, min_draft=1),
        constraint=automaton.fresh(),
    )
    assert got.token_ids == expected
    assert automaton.accepts(got.token_ids)


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
