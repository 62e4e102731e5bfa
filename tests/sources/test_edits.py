"""The edit learner: substitutions learned where the stream leaves a copy and rejoins it."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from draftless import SamplingOptions, SpecOptions, generate
from draftless.sources import SpeculationIndex
from draftless.sources.edits import EXPECT, MAX_EDIT, REJOIN, EditLearner, _Substitution
from fakes import InductionModel

VOCAB = 400


def body(n: int, seed: int) -> list[int]:
    """n distinct ids in [10, 300): a text whose every suffix matches in one place only."""
    return [int(t) for t in np.random.default_rng(seed).permutation(np.arange(10, 300))[:n]]


def with_sites(text: list[int], word: Sequence[int], sites: Sequence[int]) -> list[int]:
    """`text` with `word` inserted before each index in `sites`."""
    return with_words(text, dict.fromkeys(sites, word))


def with_words(text: list[int], words: dict[int, Sequence[int]]) -> list[int]:
    """`text` with words[i] inserted before text[i]."""
    out: list[int] = []
    for i, t in enumerate(text):
        out.extend(words.get(i, ()))
        out.append(t)
    return out


def walk(index: SpeculationIndex, prompt: list[int], stream: list[int]) -> list[int]:
    """Decodes `stream` after `prompt` one token at a time, as plain steps do (a proposal, then
    the committed token); returns the positions in `stream` where a draft backed by a match of
    4 tokens or more said something else than the stream did."""
    index.observe(prompt)
    departures = []
    for i, token in enumerate(stream):
        draft = index.propose(64)
        if draft is not None and draft.match_len >= 4 and draft.tokens[0] != token:
            departures.append(i)
        index.observe([token])
    return departures


def test_worked_example() -> None:
    learner = EditLearner()
    x, y, z = 90, 91, 92
    learner.expect(2, [x, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16], 6, [])
    learner.observe(2, [y])
    learner.observe(3, [z, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15])
    assert learner.substitutions == {(x,): (y, z)}
    assert learner.apply([9, x, 3], at=40)[0] == [9, y, z, 3]


def test_a_rename_is_drafted_as_the_model_writes_it_after_its_first_occurrence() -> None:
    """The source says `old` at four places 30 tokens apart; the model writes `new` at each.
    Without the learner every place is a departure; with it, only the first."""
    text = body(130, seed=1)
    old, new = [350, 351], [360]
    sites = [10, 40, 70, 100]
    source, edited = with_sites(text, old, sites), with_sites(text, new, sites)
    plain = walk(SpeculationIndex(VOCAB, edits=False), source, edited)
    index = SpeculationIndex(VOCAB)
    learned = walk(index, source, edited)
    assert len(plain) == len(sites)
    assert learned == plain[:1]
    stats = index.edit_stats()
    assert stats is not None and stats["learned"] == stats["in_use"] == 1
    assert stats["held"] >= len(sites) - 1 and stats["broken"] == 0
    assert SpeculationIndex(VOCAB, edits=False).edit_stats() is None


@settings(max_examples=60, deadline=None)
@given(
    old=st.lists(st.integers(300, 319), min_size=1, max_size=3),
    new=st.lists(st.integers(320, 339), min_size=0, max_size=3),
    seed=st.integers(0, 2**16),
)
def test_after_its_first_site_an_edit_is_drafted_exactly(
    old: list[int], new: list[int], seed: int
) -> None:
    """Any replacement (a deletion included) of up to 3 tokens by up to 3, at sites farther
    apart than an edit's window: from the second site on, the draft made just before the site
    is what the model writes, through the edit and REJOIN tokens past it."""
    text = body(150, seed)
    sites = [20, 60, 100]
    source, edited = with_sites(text, old, sites), with_sites(text, new, sites)
    index = SpeculationIndex(VOCAB, recycling=False)
    index.observe(source)
    later = {s + k * len(new) for k, s in enumerate(sites) if k}  # where they start in `edited`
    for i, token in enumerate(edited):
        want = edited[i : i + len(new) + REJOIN]
        draft = index.propose(len(want))  # a proposal at every step, as the decoder makes
        if i in later:
            assert draft is not None and draft.tokens == want
        index.observe([token])


def test_a_substitution_the_stream_goes_against_is_dropped() -> None:
    """Renamed at the first site and kept at the next two: the learned substitution breaks at
    the second, is no longer applied, and the third is drafted from the source as written."""
    text = body(130, seed=2)
    old, new = [350], [360]
    source = with_sites(text, old, [10, 50, 90])
    stream = with_words(text, {10: new, 50: old, 90: old})
    index = SpeculationIndex(VOCAB, recycling=False)
    assert walk(index, source, stream) == [10, 51]  # the rename, then the wrong substitution
    assert index._edits is not None and index._edits.substitutions == {}
    stats = index.edit_stats()
    assert stats is not None and stats["learned"] == 1 and stats["in_use"] == 0
    assert stats["broken"] > stats["held"] == 0
    index.reset()
    assert index.edit_stats() == {"learned": 0, "in_use": 0, "held": 0, "broken": 0}


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), cut=st.integers(0, 140), budgets=st.lists(st.integers(1, 64)))
def test_a_longer_draft_starts_with_a_shorter_one_with_edits_learned(
    seed: int, cut: int, budgets: list[int]
) -> None:
    """The source protocol's promise holds with substitutions in the drafts."""
    text = body(100, seed)
    old, new = [350, 351], [360, 361, 362]
    source, edited = with_sites(text, old, [10, 40, 70]), with_sites(text, new, [10, 40, 70])
    index = SpeculationIndex(VOCAB)
    index.observe(source)
    index.observe(edited[:cut])
    drafts = [index.propose(b) for b in sorted(budgets)]
    tokens = [d.tokens if d is not None else [] for d in drafts]
    for shorter, longer in pairwise(tokens):
        assert longer[: len(shorter)] == shorter


class Writer(InductionModel):
    """Greedy decoding writes `text` after the prompt (then repeats its last token)."""

    def __init__(self, prompt_len: int, text: list[int]) -> None:
        super().__init__(vocab=VOCAB)
        self.prompt_len, self.text = prompt_len, text

    def row(self, prefix: Sequence[int]) -> np.ndarray:
        k = min(len(prefix) - self.prompt_len, len(self.text) - 1)
        logits = np.zeros(VOCAB, dtype=np.float32)
        logits[self.text[k]] = 5.0
        return logits


def test_the_decoder_with_edits_writes_what_plain_writes_and_rejects_less() -> None:
    """A rename decoded with every draft verified: the stream is plain's, and the drafts the
    model rejected are fewer with the learner than without it."""
    text = body(200, seed=3)
    sites = [15, 45, 75, 105, 135, 165]
    source, edited = with_sites(text, [350], sites), with_sites(text, [360, 361], sites)
    model = Writer(len(source), edited)
    n = len(edited)
    rejected = {}
    for edits in (False, True):
        result = generate(
            model,
            source,
            n,
            source=SpeculationIndex(VOCAB, edits=edits),
            sampling=SamplingOptions(),
            options=SpecOptions(gate=False),
        )
        assert result.token_ids == edited
        rejected[edits] = sum(result.stats.resync_gaps.values())
    assert rejected[True] < rejected[False]


def test_constants_are_what_the_window_needs() -> None:
    assert EXPECT == MAX_EDIT + REJOIN + 1


def test_a_rename_deep_in_a_long_verified_draft_is_learned() -> None:
    """Sites 60 tokens apart, every draft verified: the drafts are long by the time a site
    comes, and its rejection lies dozens of tokens into one. The learner sees it there (the
    proposal's expectation runs past the draft), so only the first site is rejected."""
    text = body(260, seed=4)
    sites = [40, 100, 160, 220]
    source, edited = with_sites(text, [350], sites), with_sites(text, [360], sites)
    model = Writer(len(source), edited)
    index = SpeculationIndex(VOCAB, recycling=False)
    result = generate(model, source, len(edited), source=index, options=SpecOptions(gate=False))
    assert result.token_ids == edited
    assert max(result.stats.draft_lengths) > 16 + 8  # rejections deep in long drafts
    assert sum(result.stats.resync_gaps.values()) == 1


def apply_token_by_token(
    learner: EditLearner, tokens: Sequence[int], at: int
) -> tuple[list[int], list[tuple[int, tuple[int, ...], tuple[int, ...]]]]:
    """apply()'s rule read one token at a time: the oracle for its skipping version."""
    out: list[int] = []
    spans: list[tuple[int, tuple[int, ...], tuple[int, ...]]] = []
    k = 0
    while k < len(tokens):
        for old in learner._first.get(tokens[k], ()):
            sub = learner._subs[old]
            if not sub.trusted:
                continue
            here = tuple(tokens[k : k + len(old)])
            if here == old:
                spans.append((at + len(out), old, sub.new))
                out.extend(sub.new)
                k += len(old)
                break
            if len(here) < len(old) and old[: len(here)] == here:
                return out, spans
        else:
            out.append(tokens[k])
            k += 1
    return out, spans


_ids = st.integers(0, 6)  # a few ids: heads, overlaps and cut-off olds are frequent


@given(
    subs=st.lists(
        st.tuples(
            st.lists(_ids, min_size=1, max_size=3).map(tuple),
            st.lists(st.integers(7, 9), min_size=0, max_size=3).map(tuple),
            st.booleans(),
        ),
        max_size=6,
    ),
    tokens=st.lists(_ids, max_size=40),
    at=st.integers(0, 100),
)
@example(subs=[((1, 2), (7,), True), ((2,), (8,), True)], tokens=[1, 2, 2], at=0)  # inside a span
@example(subs=[((3, 4, 5), (9,), True), ((4,), (8,), True)], tokens=[4, 3, 4], at=5)  # a cut
@settings(max_examples=300)
def test_apply_skips_to_learned_heads_and_decides_as_token_by_token(
    subs: list[tuple[tuple[int, ...], tuple[int, ...], bool]], tokens: list[int], at: int
) -> None:
    learner = EditLearner()
    for old, new, trusted in subs:
        if old in learner._subs:
            continue
        learner._subs[old] = _Substitution(new, held=0, broken=0 if trusted else 1)
        learner._first.setdefault(old[0], []).append(old)
    out, spans = learner.apply(np.array(tokens, dtype=np.int64), at)
    assert all(type(t) is int for t in out)
    assert (out, [(s.start, s.old, s.new) for s in spans]) == apply_token_by_token(
        learner, tokens, at
    )
