"""The cross-request draft index (serve/history.py): bounded in bytes whatever the request
sequence, oldest evicted first, superseded turns held once, and it drafts an earlier request's
text for a new one through a SpeculationIndex reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftless.serve.history import BYTES_PER_TOKEN, OVERHEAD_BYTES, RequestHistory
from draftless.sources import SamIndex, SpeculationIndex

streams = st.lists(st.lists(st.integers(0, 30), min_size=0, max_size=300), min_size=1, max_size=25)


@given(
    requests=streams,
    budget=st.integers(0, 40_000),
    extend=st.lists(st.booleans(), min_size=25, max_size=25),
)
@settings(max_examples=150, deadline=None)
def test_the_index_never_passes_its_budget(requests, budget, extend) -> None:
    h = RequestHistory(budget)
    kept: list[list[int]] = []  # brute force: the same policy on plain lists
    previous: list[int] = []
    for tokens, grow in zip(requests, extend, strict=False):
        if grow and previous:
            tokens = previous + tokens  # the next turn of the same conversation
        h.add(tokens)
        previous = tokens
        if tokens and h.max_tokens:
            t = tokens[-h.max_tokens :]
            kept = [e for e in kept if t[: len(e)] != e] + [t]
            while sum(map(len, kept)) > h.max_tokens:
                kept.pop(0)
        assert h.charged_bytes <= budget
        ref = h.reference()
        want = [t for e in kept for t in e]
        assert (ref.tolist() if ref is not None else []) == want
        assert h.n_tokens == len(want) and h.n_entries == len(kept)
        if ref is not None and ref.size:
            # What the charge stands for: the held copies plus the frozen automaton the
            # engine builds from reference() (SpeculationIndex.add_reference does the same).
            frozen = SamIndex.frozen_from(ref)
            assert h.stored_bytes + frozen.nbytes <= h.charged_bytes


def test_bytes_per_token_bounds_a_frozen_index_of_real_sizes() -> None:
    rng = np.random.default_rng(0)
    for n, vocab in ((5_000, 50), (20_000, 49_152), (70_000, 3000)):
        tokens = rng.integers(0, vocab, size=n)
        frozen = SamIndex.frozen_from(tokens)
        held = 2 * 4 * n  # the entries and the cached concatenation
        assert held + frozen.nbytes <= OVERHEAD_BYTES + BYTES_PER_TOKEN * n


def test_oldest_first_and_superseded_turns() -> None:
    h = RequestHistory(OVERHEAD_BYTES + BYTES_PER_TOKEN * 10)  # room for 10 tokens
    assert h.max_tokens == 10
    h.add([1, 2, 3])
    h.add([1, 2, 3, 4, 5])  # the next turn: the first is superseded, not evicted
    assert h.reference().tolist() == [1, 2, 3, 4, 5] and h.evicted == 0
    h.add([7, 7, 7, 7])
    assert h.reference().tolist() == [1, 2, 3, 4, 5, 7, 7, 7, 7]
    h.add([8, 8])  # 11 tokens: the oldest goes
    assert h.reference().tolist() == [7, 7, 7, 7, 8, 8] and h.evicted == 1
    h.add(list(range(20)))  # larger than the budget: its newest 10 tokens
    assert h.reference().tolist() == list(range(10, 20))
    assert RequestHistory(0).reference() is None
    with pytest.raises(ValueError, match="budget"):
        RequestHistory(-1)


def test_a_new_request_drafts_an_earlier_requests_answer() -> None:
    rng = np.random.default_rng(1)
    prompt_a = rng.integers(0, 1000, size=40).tolist()
    answer_a = rng.integers(0, 1000, size=60).tolist()
    h = RequestHistory(1 << 20)
    h.add(prompt_a + answer_a)
    # A new request whose prompt ends with the start of that answer (an agent quoting it).
    index = SpeculationIndex(1000, recycling=False)
    index.add_reference(h.reference())
    other = rng.integers(0, 1000, size=30).tolist()
    index.observe([*other, *answer_a[:5]])
    draft = index.propose(16)  # the cascade's budget: 2 x (1 + match length 5) = 12 tokens
    assert draft is not None and draft.tokens == answer_a[5:17]
    assert draft.member == "reference[0]"
