"""SpeculationIndex: selection, budget, references, lifecycle."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import draftless.sources.sam as sam_module
from draftless.sources import CascadeOptions, Draft, DraftSource, SpeculationIndex
from oracles import continuation, prior_match, reference_match

VOCAB = 100


def suggest(index: SpeculationIndex, budget: int) -> list[int]:
    """The tokens of index.propose(budget), checking that proposing changes nothing."""
    draft = index.propose(budget)
    assert index.propose(budget) == draft  # no side effects
    return draft.tokens if draft is not None else []


def member(index: SpeculationIndex) -> str | None:
    draft = index.propose(64)
    return draft.member if draft is not None else None


def test_worked_example() -> None:
    index = SpeculationIndex(VOCAB)
    index.observe([5, 6, 7, 8])
    index.observe([9])
    index.observe([5, 6, 7])
    assert member(index) == "conversation"
    assert index.propose(16) == Draft([8, 9, 5, 6, 7, 8, 9, 5], "conversation", 3)


def test_is_a_draft_source() -> None:
    assert isinstance(SpeculationIndex(VOCAB), DraftSource)
    assert SpeculationIndex(VOCAB).wants_topk
    assert not SpeculationIndex(VOCAB, recycling=False).wants_topk


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("min_match", 0),
        ("budget_beta", 0),
        ("max_references", -1),
        ("recycling", 1),
        ("min_match", 2.0),
        ("budget_beta", True),
    ],
)
def test_bad_options_name_themselves(option: str, value: object) -> None:
    with pytest.raises(ValueError, match=option):
        SpeculationIndex(VOCAB, **{option: value})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=option):
        CascadeOptions(**{option: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("vocab", [0, -3, True, 2.5])
def test_bad_vocab_size(vocab: object) -> None:
    with pytest.raises(ValueError, match="vocab_size"):
        SpeculationIndex(vocab)  # type: ignore[arg-type]


# -- selection and budget ---------------------------------------------------------------


def test_budget_is_beta_times_one_plus_match_capped_by_max_tokens() -> None:
    index = SpeculationIndex(VOCAB, recycling=False)
    index.observe([1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2])  # match [1 2]: budget 2 * 3 = 6
    assert index.conversation.match_len == 2
    assert suggest(index, 100) == [3, 4, 5, 6, 7, 8]
    assert suggest(index, 4) == [3, 4, 5, 6]
    assert suggest(index, 0) == []
    index.observe([3, 4])  # match [1 2 3 4]: budget 10
    assert len(suggest(index, 100)) == 10
    wide = SpeculationIndex(VOCAB, recycling=False, budget_beta=3)
    wide.observe([1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2])
    assert len(suggest(wide, 100)) == 9


def test_short_matches_fall_through_to_recycling() -> None:
    index = SpeculationIndex(VOCAB)
    index.observe([3, 9, 3])  # conversation match [3]: length 1 < min_match
    index.observe_topk([3, 40], np.array([[40, 1], [41, 1]], dtype=np.int32))
    assert index.conversation.match_len == 1
    assert member(index) == "recycling"
    assert suggest(index, 16) == [40, 41]
    plain = SpeculationIndex(VOCAB, recycling=False)
    plain.observe([3, 9, 3])
    assert member(plain) is None
    assert suggest(plain, 16) == []
    strict = SpeculationIndex(VOCAB, recycling=False, min_match=3)
    strict.observe([1, 2, 9, 1, 2])
    assert suggest(strict, 16) == []


def test_cold_recycling_drafts_nothing() -> None:
    index = SpeculationIndex(VOCAB)
    index.observe([1, 2, 3])
    assert member(index) is None
    assert suggest(index, 16) == []


CONVERSATION = [7, 3, 4, 80, 1, 3, 4]  # its own match: [3 4] (length 2) -> 80


def test_the_longest_match_wins() -> None:
    index = SpeculationIndex(VOCAB)
    index.observe(CONVERSATION)
    index.add_reference([1, 3, 4, 90])  # matches [1 3 4]: length 3
    assert index.conversation.match_len == 2
    assert member(index) == "reference[0]"
    assert index.propose(16) == Draft([90], "reference[0]", 3)


def test_ties_go_to_the_conversation_then_the_first_reference() -> None:
    index = SpeculationIndex(VOCAB)
    index.observe(CONVERSATION)
    index.add_reference([0, 3, 4, 91])  # length 2: a tie with the conversation
    assert member(index) == "conversation"
    assert suggest(index, 3) == [80, 1, 3]
    index.add_reference([1, 3, 4, 92])
    index.add_reference([5, 1, 3, 4, 93])  # both length 3: the first added wins
    assert member(index) == "reference[1]"
    assert suggest(index, 16) == [92]


@st.composite
def sessions(draw: st.DrawFn) -> tuple[list[list[int]], list[list[int]], list[int]]:
    alphabet = draw(st.integers(2, 5))
    tokens = st.integers(0, alphabet - 1)
    refs = draw(st.lists(st.lists(tokens, max_size=30), max_size=3))
    chunks = draw(st.lists(st.lists(tokens, min_size=1, max_size=4), max_size=15))
    budgets = draw(st.lists(st.integers(0, 20), min_size=len(chunks), max_size=len(chunks)))
    return refs, chunks, budgets


@settings(max_examples=80, deadline=None)
@given(sessions())
def test_selection_against_brute_force(
    session: tuple[list[list[int]], list[list[int]], list[int]],
) -> None:
    refs, chunks, budgets = session
    # Selection and budget against the oracles; the edit learner, which can change a draft's
    # tokens once it has seen a departure, is tested in test_edits.py.
    index = SpeculationIndex(VOCAB, recycling=False, edits=False)
    for ref in refs:
        index.add_reference(ref)
    stream: list[int] = []
    for chunk, max_tokens in zip(chunks, budgets, strict=True):
        index.observe(chunk)
        stream += chunk
        conv_len, conv_ends = prior_match(stream)
        lengths = [conv_len] + [reference_match(ref, stream)[0] for ref in refs]
        lead = member(index)
        draft = suggest(index, max_tokens)
        best = max(lengths)
        if best < 2 or max_tokens == 0:
            assert draft == []
            assert lead is None or best >= 2
            continue
        winner = lengths.index(best)  # first in order: conversation, then references
        budget = min(max_tokens, 2 * (1 + best))
        if winner == 0:
            assert lead == "conversation"
            assert index.conversation.match_end in conv_ends
            assert draft == continuation(stream, index.conversation.match_end, budget)
        else:
            ref = refs[winner - 1]
            end = reference_match(ref, stream)[1][-1]
            assert lead == f"reference[{winner - 1}]"
            assert draft == ref[end + 1 : end + 1 + budget]


# -- references ---------------------------------------------------------------------------


def test_add_reference_mid_conversation_matches_at_once() -> None:
    index = SpeculationIndex(VOCAB)
    index.observe([40, 41, 42, 43, 1, 2, 3])
    slot = index.add_reference([9, 1, 2, 3, 4, 5, 6])
    assert slot == 0
    assert index.references[0].n_tokens == 7
    assert index.propose(5) == Draft([4, 5, 6], "reference[0]", 3)


def test_clear_references() -> None:
    index = SpeculationIndex(VOCAB, recycling=False)
    index.observe([1, 2, 3])
    for _ in range(8):
        index.add_reference([1, 2, 3, 4])
    assert suggest(index, 4) == [4]
    index.clear_references()
    assert index.references == ()
    assert index.members() == ("conversation",)
    assert suggest(index, 4) == []
    index.observe([4])
    assert index.add_reference([3, 4, 5]) == 0  # room again
    assert suggest(index, 4) == [5]


def test_empty_reference_is_allowed_and_never_matches() -> None:
    index = SpeculationIndex(VOCAB, recycling=False)
    index.add_reference([])
    index.observe([1, 2, 3, 1, 2])
    assert member(index) == "conversation"
    assert suggest(index, 8) == [3, 1, 2, 3, 1, 2]


@pytest.mark.parametrize(
    ("tokens", "message"),
    [
        ([1, 2, 3, -1], r"reference token id -1 at position 3"),
        ([5, VOCAB], rf"reference token id {VOCAB} at position 1 .*\[0, {VOCAB}\)"),
        (np.array([0, 7, 2**40]), r"id 1099511627776 at position 2"),
        ([1.0, 2.0], "integers"),
    ],
)
def test_bad_reference_is_a_clear_error(tokens: object, message: str) -> None:
    index = SpeculationIndex(VOCAB)
    with pytest.raises(ValueError, match=message):
        index.add_reference(tokens)  # type: ignore[arg-type]
    assert index.references == ()


def test_a_ninth_reference_is_a_clear_error() -> None:
    index = SpeculationIndex(VOCAB)
    for i in range(8):
        index.add_reference([i, i + 1])
    with pytest.raises(ValueError, match="at most 8 references"):
        index.add_reference([1, 2])
    assert len(index.references) == 8
    few = SpeculationIndex(VOCAB, max_references=1)
    few.add_reference([1])
    with pytest.raises(ValueError, match="at most 1 references"):
        few.add_reference([2])


# -- lifecycle ----------------------------------------------------------------------------


def test_reset_starts_a_new_conversation() -> None:
    index = SpeculationIndex(VOCAB)
    index.add_reference([1, 2, 3, 4])
    index.observe_topk([9], np.array([[8]], dtype=np.int32))
    index.observe([1, 2])
    assert suggest(index, 4) == [3, 4]
    index.observe([3, 4])
    index.reset()
    assert index.conversation.n_tokens == 0
    assert member(index) is None
    assert len(index.references) == 1
    assert suggest(index, 4) == []
    index.observe([2, 3])
    assert suggest(index, 4) == [4]  # the reference survived, its cursor restarted
    index.observe([9])
    assert suggest(index, 4) == [8]  # so did the recycling matrix


def test_bad_committed_tokens_raise() -> None:
    index = SpeculationIndex(VOCAB)
    with pytest.raises(ValueError, match=rf"committed token id {VOCAB} at position 0"):
        index.observe([VOCAB])
    with pytest.raises(ValueError, match="committed token id -1 at position 1"):
        index.observe([3, -1])
    with pytest.raises(ValueError, match="must be integers"):
        index.observe([True])
    assert index.conversation.n_tokens == 0


@settings(max_examples=60, deadline=None)
@given(sessions())
def test_a_steps_few_ids_index_as_an_array_does(
    session: tuple[list[list[int]], list[list[int]], list[int]],
) -> None:
    """observe() takes a decoder step's short list of ints through a reused buffer; the
    indexes it feeds (conversation, references, recycling) end where an array leaves them."""
    refs, chunks, budgets = session
    as_list, as_array = SpeculationIndex(VOCAB), SpeculationIndex(VOCAB)
    for index in (as_list, as_array):
        for ref in refs:
            index.add_reference(ref)
    for chunk, budget in zip(chunks, budgets, strict=True):
        as_list.observe(list(chunk))
        as_array.observe(np.array(chunk, dtype=np.int64))
        assert as_list.propose(budget) == as_array.propose(budget)
        assert as_list.recycling is not None and as_array.recycling is not None
        assert as_list.recycling.last_token == as_array.recycling.last_token
        for token in set(chunk):
            assert (as_list.recycling.row(token) == as_array.recycling.row(token)).all()
    assert as_list.conversation.n_tokens == sum(map(len, chunks))


def test_out_of_memory_degrades_to_no_conversation_drafts(monkeypatch: pytest.MonkeyPatch) -> None:
    index = SpeculationIndex(VOCAB, recycling=False)
    index.add_reference([5, 6, 7, 8])
    index.observe([1, 2, 3, 1, 2])

    def fail(*args: object) -> None:
        raise MemoryError

    monkeypatch.setattr(sam_module, "_extend", fail)
    with pytest.warns(RuntimeWarning, match="out of memory"):
        index.observe([3])
    monkeypatch.undo()
    index.observe([5, 6])  # the conversation is poisoned; the reference still follows
    assert index.conversation.poisoned
    assert suggest(index, 8) == [7, 8]
    assert index.conversation.match_len == 0
