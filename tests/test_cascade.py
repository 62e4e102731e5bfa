"""SpeculationIndex: selection, budget, muting, references, the seam accounting."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import draftless.sources.sam as sam_module
from draftless.sources import (
    CascadeOptions,
    DraftSource,
    SamIndex,
    SourceStats,
    SpeculationIndex,
)
from oracles import continuation, prior_match, reference_match

VOCAB = 100


def stats_of(index: SpeculationIndex, name: str) -> SourceStats:
    return next(s for s in index.stats() if s.name == name)


def test_worked_example() -> None:
    index = SpeculationIndex(VOCAB)
    index.observe([5, 6, 7, 8])
    index.observe([9])
    index.observe([5, 6, 7])
    assert index.suggest(16) == [8, 9, 5, 6, 7, 8, 9, 5]
    assert index.last_source == "conversation"
    index.observe([8, 9, 4])
    conv = stats_of(index, "conversation")
    assert (conv.accepted, conv.drafted, conv.muted) == (2, 8, False)


def test_is_a_draft_source() -> None:
    assert isinstance(SpeculationIndex(VOCAB), DraftSource)
    assert SpeculationIndex(VOCAB).wants_topk
    assert not SpeculationIndex(VOCAB, recycling=False).wants_topk


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("min_match", 0),
        ("budget_beta", 0),
        ("window", 0),
        ("mute_for", 0),
        ("max_references", -1),
        ("mute_below", 1.5),
        ("mute_below", -0.1),
        ("recycling", 1),
        ("min_match", 2.0),
        ("window", True),
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
    assert index.suggest(100) == [3, 4, 5, 6, 7, 8]
    assert index.suggest(4) == [3, 4, 5, 6]
    assert index.suggest(0) == []
    index.observe([3, 4])  # match [1 2 3 4]: budget 10
    assert len(index.suggest(100)) == 10
    wide = SpeculationIndex(VOCAB, recycling=False, budget_beta=3)
    wide.observe([1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2])
    assert len(wide.suggest(100)) == 9


def test_short_matches_fall_through_to_recycling() -> None:
    index = SpeculationIndex(VOCAB)
    index.observe([3, 9, 3])  # conversation match [3]: length 1 < min_match
    index.observe_topk([3, 40], np.array([[40, 1], [41, 1]], dtype=np.int32))
    assert index.conversation.match_len == 1
    assert index.suggest(16) == [40, 41]
    assert index.last_source == "recycling"
    plain = SpeculationIndex(VOCAB, recycling=False)
    plain.observe([3, 9, 3])
    assert plain.suggest(16) == []
    assert plain.last_source is None
    strict = SpeculationIndex(VOCAB, recycling=False, min_match=3)
    strict.observe([1, 2, 9, 1, 2])
    assert strict.suggest(16) == []


def test_cold_recycling_drafts_nothing() -> None:
    index = SpeculationIndex(VOCAB)
    index.observe([1, 2, 3])
    assert index.suggest(16) == []
    assert index.last_source is None


CONVERSATION = [7, 3, 4, 80, 1, 3, 4]  # its own match: [3 4] (length 2) -> 80


def test_the_longest_match_wins() -> None:
    index = SpeculationIndex(VOCAB)
    index.observe(CONVERSATION)
    index.add_reference([1, 3, 4, 90])  # matches [1 3 4]: length 3
    assert [s.match_len for s in index.stats()] == [2, 3, 0]
    assert index.suggest(16) == [90]
    assert index.last_source == "reference[0]"


def test_ties_go_to_the_conversation_then_the_first_reference() -> None:
    index = SpeculationIndex(VOCAB)
    index.observe(CONVERSATION)
    index.add_reference([0, 3, 4, 91])  # length 2: a tie with the conversation
    assert index.suggest(3) == [80, 1, 3]
    assert index.last_source == "conversation"
    index.add_reference([1, 3, 4, 92])
    index.add_reference([5, 1, 3, 4, 93])  # both length 3: the first added wins
    assert index.suggest(16) == [92]
    assert index.last_source == "reference[1]"


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
    index = SpeculationIndex(VOCAB, recycling=False, mute_below=0.0)  # never mutes
    for ref in refs:
        index.add_reference(ref)
    stream: list[int] = []
    for chunk, max_tokens in zip(chunks, budgets, strict=True):
        index.observe(chunk)
        stream += chunk
        conv_len, conv_ends = prior_match(stream)
        lengths = [conv_len] + [reference_match(ref, stream)[0] for ref in refs]
        draft = index.suggest(max_tokens)
        best = max(lengths)
        if best < 2 or max_tokens == 0:
            assert draft == []
            continue
        winner = lengths.index(best)  # first in order: conversation, then references
        budget = min(max_tokens, 2 * (1 + best))
        if winner == 0:
            assert index.last_source == "conversation"
            assert index.conversation.match_end in conv_ends
            assert draft == continuation(stream, index.conversation.match_end, budget)
        else:
            ref = refs[winner - 1]
            end = reference_match(ref, stream)[1][-1]
            assert index.last_source == f"reference[{winner - 1}]"
            assert draft == ref[end + 1 : end + 1 + budget]


# -- muting -------------------------------------------------------------------------------

DE_BRUIJN_3 = [0, 0, 0, 1, 0, 0, 2, 0, 1, 1, 0, 1, 2, 0, 2, 1, 0, 2, 2, 1, 1, 1, 2, 1, 2, 2, 2]


def reject_everything(index: SpeculationIndex, steps: int) -> None:
    """Commits, at each step, one token that differs from the draft's first token."""
    for _ in range(steps):
        draft = index.suggest(8)
        assert len(draft) == 8
        index.observe([(draft[0] + 1) % 3])


def test_a_source_under_20_percent_is_muted_for_128_tokens_then_reprobed() -> None:
    index = SpeculationIndex(VOCAB, recycling=False)
    index.observe(DE_BRUIJN_3 * 2)  # every suffix of length 3 has occurred: always drafts
    reject_everything(index, 7)  # 56 drafted: the window is not full yet
    assert not stats_of(index, "conversation").muted
    reject_everything(index, 1)  # 64 drafted, 0 accepted
    conv = stats_of(index, "conversation")
    assert (conv.accepted, conv.drafted, conv.muted, conv.times_muted) == (0, 64, True, 1)
    shadow = SamIndex()  # what the conversation index should know, muted or not
    shadow.extend(index.conversation.tokens)
    rng = np.random.default_rng(0)
    for _ in range(127):
        assert index.suggest(8) == []
        token = int(rng.integers(0, 3))
        index.observe([token])
        shadow.extend([token])
    assert stats_of(index, "conversation").muted
    index.observe([1])
    shadow.extend([1])
    assert not stats_of(index, "conversation").muted
    expected = shadow.draft(min(8, 2 * (1 + shadow.match_len)))  # in sync at the re-probe
    assert index.suggest(8) == expected
    assert index.last_source == "conversation"
    reject_everything(index, 6)  # a fresh window: the 8 + 48 rejections do not mute yet
    assert not stats_of(index, "conversation").muted
    reject_everything(index, 1)
    conv = stats_of(index, "conversation")
    assert (conv.accepted, conv.drafted, conv.muted, conv.times_muted) == (0, 128, True, 2)


def test_exactly_the_threshold_does_not_mute() -> None:
    def run(accept: int) -> SourceStats:
        index = SpeculationIndex(VOCAB, recycling=False, window=10, mute_below=0.2)
        index.observe([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 1, 2, 3, 4])
        draft = index.suggest(10)
        assert draft == [5, 6, 7, 8, 9, 10, 11, 12, 1, 2]
        index.observe([*draft[:accept], 99])
        return stats_of(index, "conversation")

    assert not run(2).muted  # 2 / 10 = 20%
    assert run(1).muted


def test_muted_recycling_keeps_learning() -> None:
    index = SpeculationIndex(VOCAB, window=8, mute_for=5)
    index.observe_topk([50], np.array([[51]], dtype=np.int32))
    for step in range(4):
        index.observe_topk([10 + step], np.array([[50, 1]], dtype=np.int32))
        index.observe([10 + step])
        assert index.suggest(2) == [50, 51]
        assert index.last_source == "recycling"
        index.observe([60])  # 0 of 2 accepted
    assert stats_of(index, "recycling").muted
    assert index.wants_topk
    index.observe_topk([61], np.array([[62]], dtype=np.int32))
    index.observe([61])
    assert index.suggest(4) == []  # muted
    index.observe([70, 71, 72, 61])  # 5 committed tokens since the mute
    assert not stats_of(index, "recycling").muted
    assert index.suggest(4) == [70, 71, 72, 61]  # bigrams learnt while muted
    assert index.recycling is not None
    assert index.recycling.row(61).tolist()[:2] == [70, 62]  # and top-K rows


def test_muted_source_is_skipped_for_the_next_best() -> None:
    index = SpeculationIndex(VOCAB, recycling=False, window=8)
    index.observe(DE_BRUIJN_3 * 2)
    index.add_reference(DE_BRUIJN_3)
    reject_everything(index, 1)
    assert stats_of(index, "conversation").muted
    assert stats_of(index, "conversation").match_len >= 2
    assert index.suggest(8) != []
    assert index.last_source == "reference[0]"


# -- references ---------------------------------------------------------------------------


def test_add_reference_mid_conversation_matches_at_once() -> None:
    index = SpeculationIndex(VOCAB)
    index.observe([40, 41, 42, 43, 1, 2, 3])
    slot = index.add_reference([9, 1, 2, 3, 4, 5, 6])
    assert slot == 0
    assert stats_of(index, "reference[0]").match_len == 3
    assert index.suggest(5) == [4, 5, 6]
    index.observe([4, 5, 6])
    assert stats_of(index, "reference[0]").accepted == 3


def test_clear_references() -> None:
    index = SpeculationIndex(VOCAB, recycling=False)
    index.observe([1, 2, 3])
    for _ in range(8):
        index.add_reference([1, 2, 3, 4])
    assert index.suggest(4) == [4]
    index.clear_references()
    assert index.references == ()
    assert [s.name for s in index.stats()] == ["conversation"]
    assert index.suggest(4) == []
    index.observe([4])  # the dropped draft is not accounted to anyone
    assert stats_of(index, "conversation").drafted == 0
    assert index.add_reference([3, 4, 5]) == 0  # room again
    assert index.suggest(4) == [5]


def test_empty_reference_is_allowed_and_never_matches() -> None:
    index = SpeculationIndex(VOCAB, recycling=False)
    index.add_reference([])
    index.observe([1, 2, 3, 1, 2])
    assert stats_of(index, "reference[0]").match_len == 0
    assert index.suggest(8) == [3, 1, 2, 3, 1, 2]
    assert index.last_source == "conversation"


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


# -- the seam: acceptance accounting -------------------------------------------------------


def drafting_index() -> tuple[SpeculationIndex, list[int]]:
    index = SpeculationIndex(VOCAB, recycling=False)
    index.observe([1, 2, 3, 4, 5, 9, 1, 2])
    draft = index.suggest(4)
    assert draft == [3, 4, 5, 9]
    return index, draft


def test_split_observes_are_accounted_as_one_step() -> None:
    index, _ = drafting_index()
    index.observe([3])
    index.observe([4, 5, 7])
    conv = stats_of(index, "conversation")
    assert (conv.accepted, conv.drafted) == (3, 4)


def test_full_acceptance_and_the_bonus_token() -> None:
    index, draft = drafting_index()
    index.observe([*draft, 42])
    conv = stats_of(index, "conversation")
    assert (conv.accepted, conv.drafted) == (4, 4)


def test_truncate_pending_keeps_the_accounting_aligned() -> None:
    # The decoder committed [3 4 5 x]; a stop trims the turn after [3 4].
    index, _ = drafting_index()
    index.truncate_pending(2)
    index.observe([3, 4])
    index.observe([60, 61])  # the next turn's tokens are not judged against the draft
    conv = stats_of(index, "conversation")
    assert (conv.accepted, conv.drafted) == (2, 2)
    # Without it, the trimmed draft tokens would be blamed.
    index, _ = drafting_index()
    index.observe([3, 4])
    index.observe([60, 61])
    conv = stats_of(index, "conversation")
    assert (conv.accepted, conv.drafted) == (2, 4)


def test_truncate_pending_zero_drops_the_accounting() -> None:
    index, _ = drafting_index()
    index.truncate_pending()
    index.observe([60])
    assert stats_of(index, "conversation").drafted == 0
    index.truncate_pending(3)  # nothing pending: a no-op
    with pytest.raises(ValueError, match="n must be"):
        index.truncate_pending(-1)


def test_truncate_pending_after_a_partial_observe() -> None:
    index, _ = drafting_index()
    index.observe([3])
    index.truncate_pending(1)
    index.observe([4])
    conv = stats_of(index, "conversation")
    assert (conv.accepted, conv.drafted) == (2, 2)


def test_a_new_suggest_settles_the_previous_draft() -> None:
    index, _ = drafting_index()
    index.observe([3, 4])
    index.suggest(4)
    conv = stats_of(index, "conversation")
    assert (conv.accepted, conv.drafted) == (2, 4)


# -- lifecycle ----------------------------------------------------------------------------


def test_reset_starts_a_new_conversation() -> None:
    index = SpeculationIndex(VOCAB)
    index.add_reference([1, 2, 3, 4])
    index.observe_topk([9], np.array([[8]], dtype=np.int32))
    index.observe([1, 2])
    index.suggest(4)
    index.observe([3, 4])
    assert stats_of(index, "reference[0]").accepted == 2
    index.reset()
    assert index.conversation.n_tokens == 0
    assert all((s.accepted, s.drafted, s.match_len) == (0, 0, 0) for s in index.stats())
    assert len(index.references) == 1
    assert index.suggest(4) == []
    index.observe([2, 3])
    assert index.suggest(4) == [4]  # the reference survived, its cursor restarted
    index.observe([9])
    assert index.suggest(4) == [8]  # so did the recycling matrix


def test_bad_committed_tokens_raise() -> None:
    index = SpeculationIndex(VOCAB)
    with pytest.raises(ValueError, match=rf"committed token id {VOCAB} at position 0"):
        index.observe([VOCAB])
    assert index.conversation.n_tokens == 0


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
    assert index.suggest(8) == [7, 8]
    assert stats_of(index, "conversation").match_len == 0
