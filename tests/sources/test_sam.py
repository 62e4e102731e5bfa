"""SamIndex and Cursor against brute force (tests/oracles.py), after every append."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import draftless.sources.sam as sam_module
from draftless.sources import Cursor, FrozenIndexError, SamIndex
from oracles import PriorMatchOracle, continuation, prior_match, reference_match

ALPHABETS = (2, 5, 31)
SETTINGS = settings(max_examples=150, deadline=None)


@st.composite
def streams(draw: st.DrawFn, max_size: int = 70) -> list[int]:
    alphabet = draw(st.sampled_from(ALPHABETS))
    return draw(st.lists(st.integers(0, alphabet - 1), max_size=max_size))


def check_bounds(index: SamIndex) -> None:
    n = index.n_tokens
    assert index.n_states <= 2 * n + 1
    assert index.n_transitions <= 3 * n


def check_step(index: SamIndex, stream: list[int], history: list[int], ends: list[int]) -> None:
    """The index after appending stream[-1], against the oracle's (match_len, ends)."""
    length = history[-1]
    assert index.match_len == length
    if length == 0:
        assert index.match_end == -1
        assert index.draft(4) == []
        return
    end = index.match_end
    assert end in ends  # a genuine earlier occurrence of the matched suffix
    for n in (1, 3, 2 * (1 + length), 17):
        assert index.draft(n) == continuation(stream, end, n)
    latest = ends[-1]
    if history[latest] == length:  # recency: it was the whole match back then, too
        assert end == latest
    assert index.draft(0) == []


def run_incrementally(stream: Sequence[int], *, oracle: str = "dp") -> SamIndex:
    index = SamIndex()
    dp = PriorMatchOracle()
    seen: list[int] = []
    history: list[int] = []
    for t in stream:
        index.extend([t])
        seen.append(t)
        if oracle == "dp":
            length, ends = dp.append(t)
        else:
            length, ends = prior_match(seen)
        history.append(length)
        check_step(index, seen, history, ends)
        check_bounds(index)
    return index


# -- the oracle itself -------------------------------------------------------------------


@SETTINGS
@given(streams(max_size=40))
def test_incremental_oracle_agrees_with_the_definition(stream: list[int]) -> None:
    dp = PriorMatchOracle()
    for i, t in enumerate(stream):
        assert dp.append(t) == prior_match(stream[: i + 1])


# -- the internal match: stream against its own past ---------------------------------------


def test_worked_examples() -> None:
    index = SamIndex()
    index.extend([7, 1, 2, 9, 1, 2])
    assert (index.match_len, index.match_end) == (2, 2)
    assert index.draft(3) == [9, 1, 2]
    assert index.draft(7) == [9, 1, 2, 9, 1, 2, 9]
    same = SamIndex()
    same.extend([5, 5, 5])
    assert (same.match_len, same.match_end, same.draft(4)) == (2, 1, [5, 5, 5, 5])


def test_empty_and_single_token() -> None:
    index = SamIndex()
    assert (index.match_len, index.match_end, index.draft(5)) == (0, -1, [])
    index.extend([])
    assert index.n_tokens == 0
    index.extend([3])
    assert (index.match_len, index.draft(5)) == (0, [])
    index.check_integrity(deep=True)


@SETTINGS
@given(streams())
def test_random_streams_after_every_append(stream: list[int]) -> None:
    index = run_incrementally(stream, oracle="naive")
    index.check_integrity(deep=True)


def fibonacci_word(n: int) -> list[int]:
    a, b = [0], [0, 1]
    while len(b) < n:
        a, b = b, b + a
    return b[:n]


def thue_morse(n: int) -> list[int]:
    return [bin(i).count("1") % 2 for i in range(n)]


def relabel(stream: list[int], alphabet: int, seed: int) -> list[int]:
    """Maps symbols to distinct random letters of a larger alphabet."""
    rng = np.random.default_rng(seed)
    letters = rng.permutation(alphabet).tolist()
    return [letters[t % alphabet] for t in stream]


def periodic(period: int, n: int, alphabet: int, seed: int) -> list[int]:
    base = np.random.default_rng(seed).integers(0, alphabet, period).tolist()
    return [base[i % period] for i in range(n)]


def long_repeats(n: int, alphabet: int, seed: int) -> list[int]:
    """A random block copied over and over, each copy with a few point mutations."""
    rng = np.random.default_rng(seed)
    block = rng.integers(0, alphabet, 60).tolist()
    out: list[int] = []
    while len(out) < n:
        copy = list(block)
        for _ in range(2):
            copy[int(rng.integers(0, len(copy)))] = int(rng.integers(0, alphabet))
        out += copy
        if rng.random() < 0.3:
            out += rng.integers(0, alphabet, 7).tolist()
    return out[:n]


ADVERSARIAL = {
    "all-same": [4] * 300,
    "alternating": [0, 1] * 150,
    "fibonacci/2": fibonacci_word(377),
    "fibonacci/5": relabel(fibonacci_word(300), 5, 1),
    "thue-morse/2": thue_morse(300),
    "thue-morse/31": relabel(thue_morse(256), 31, 2),
    "periodic-3/2": periodic(3, 300, 2, 3),
    "periodic-7/5": periodic(7, 300, 5, 4),
    "periodic-13/31": periodic(13, 300, 31, 5),
    "repeats/2": long_repeats(300, 2, 6),
    "repeats/5": long_repeats(400, 5, 7),
    "repeats/31": long_repeats(500, 31, 8),
    "square-then-noise/31": (lambda b: b + b + b[:50] + [30] * 20)(
        np.random.default_rng(9).integers(0, 31, 120).tolist()
    ),
}


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_adversarial_streams_after_every_append(name: str) -> None:
    index = run_incrementally(ADVERSARIAL[name])
    index.check_integrity(deep=True)


@st.composite
def adversarial_streams(draw: st.DrawFn) -> list[int]:
    """Periodic strings and long repeats with mutations, spliced with noise."""
    alphabet = draw(st.sampled_from(ALPHABETS))
    token = st.integers(0, alphabet - 1)
    out: list[int] = []
    for _ in range(draw(st.integers(1, 4))):
        block = draw(st.lists(token, min_size=1, max_size=draw(st.sampled_from([3, 12, 40]))))
        copies = draw(st.integers(2, max(2, 120 // len(block))))
        piece = block * copies
        for _ in range(draw(st.integers(0, 3))):  # point mutations
            piece[draw(st.integers(0, len(piece) - 1))] = draw(token)
        out += piece + draw(st.lists(token, max_size=5))
    return out[:300]


@settings(max_examples=40, deadline=None)
@given(adversarial_streams())
def test_generated_adversarial_streams_after_every_append(stream: list[int]) -> None:
    run_incrementally(stream).check_integrity()


@SETTINGS
@given(streams(), st.lists(st.integers(1, 9), min_size=1, max_size=10))
def test_batched_extend_equals_token_by_token(stream: list[int], cuts: list[int]) -> None:
    one, batched = SamIndex(), SamIndex()
    for t in stream:
        one.extend([t])
    start, k = 0, 0
    while start < len(stream):
        size = cuts[k % len(cuts)]
        batched.extend(np.asarray(stream[start : start + size], dtype=np.int64))
        start, k = start + size, k + 1
    for attr in ("match_len", "match_end", "n_states", "n_transitions", "n_tokens"):
        assert getattr(batched, attr) == getattr(one, attr)
    assert batched.draft(9) == one.draft(9)
    assert batched.tokens.tolist() == stream


def test_recency_follows_the_latest_copy() -> None:
    # "a b" occurs three times; the draft after the 4th "a b" follows the 3rd: [y].
    a, b, x, y, z, w = 1, 2, 3, 4, 5, 6
    index = SamIndex()
    index.extend([x, a, b, z, a, b, y, a, b, w, a, b])
    assert index.match_len == 2
    assert index.match_end == 8
    assert index.draft(1) == [w]
    # An edited passage: the longer context picks the revision being copied (v2 here).
    v1 = [10, 11, 12, 13, 14, 15]
    v2 = [10, 11, 12, 23, 14, 15]
    index = SamIndex()
    index.extend([*v1, 0, *v2, 0, 10, 11, 12])
    assert index.draft(3) == [23, 14, 15]


def test_bounds_and_integrity_on_a_long_random_stream() -> None:
    rng = np.random.default_rng(0)
    stream = rng.integers(0, 50, 20_000)
    stream[10_000:12_000] = stream[2_000:4_000]  # a long repeat
    index = SamIndex()
    for start in range(0, len(stream), 997):
        index.extend(stream[start : start + 997])
    check_bounds(index)
    index.check_integrity()
    length, ends = prior_match(stream.tolist())
    assert index.match_len == length
    assert index.match_end in ends
    assert index.nbytes < 200 * len(stream)


def test_bad_tokens_raise_and_do_not_poison() -> None:
    index = SamIndex()
    index.extend([1, 2, 1])
    with pytest.raises(ValueError, match=r"id -4 at position 2"):
        index.extend([1, 2, -4])
    with pytest.raises(ValueError, match="integers"):
        index.extend([1.5])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="1-D"):
        index.extend(np.zeros((2, 2), dtype=np.int32))
    with pytest.raises(ValueError, match="out of range"):
        index.extend(np.array([2**31], dtype=np.int64))
    assert not index.poisoned
    assert index.n_tokens == 3
    index.extend([2])
    assert (index.match_len, index.draft(2)) == (2, [1, 2])


def test_failed_append_poisons_the_index(monkeypatch: pytest.MonkeyPatch) -> None:
    index = SamIndex()
    index.extend([1, 2, 3, 1, 2])
    assert index.match_len == 2
    real = sam_module._extend

    def half_then_fail(*arrays: np.ndarray) -> None:
        st, ed, ht, stream, meta, tokens = arrays
        real(st, ed, ht, stream, meta, tokens[: len(tokens) // 2])
        raise MemoryError("out of memory half-way")

    monkeypatch.setattr(sam_module, "_extend", half_then_fail)
    with pytest.raises(MemoryError):
        index.extend([3, 1, 2, 3])
    monkeypatch.undo()
    assert index.poisoned
    index.extend([1, 2, 3, 1, 2, 3])  # ignored, not an error
    assert (index.match_len, index.match_end, index.draft(8)) == (0, -1, [])
    index.freeze()
    cursor = index.cursor()
    cursor.advance([1, 2, 3])
    assert (cursor.match_len, cursor.draft(4)) == (0, [])


@given(st.lists(st.integers(0, 3), max_size=120))
def test_the_transitions_a_token_adds_are_counted_before_any_is_added(stream: list[int]) -> None:
    # _extend stops before a token whose transitions lack room, so its count must never be
    # short; it may be one over (a cloned state on the walk)
    index = SamIndex()
    for t in stream:
        last = int(index._meta[3])
        need = sam_module._new_transitions(index._st, index._ed, index._ht, last, t)
        before = index.n_transitions
        index.extend([t])
        assert index.n_transitions - before <= need <= index.n_transitions - before + 1


def test_an_append_without_room_stops_before_the_token_and_the_index_grows() -> None:
    index = SamIndex()
    index.extend([1, 2, 1])
    n_edges = index.n_transitions
    meta = index._meta.copy()
    full = index._ed[:n_edges]  # no room for one more transition
    tokens = np.array([3, 1, 2], dtype=np.int32)
    done = sam_module._extend(index._st, full, index._ht, index._stream, index._meta, tokens)
    assert done == 0
    assert (index._meta == meta).all()  # the automaton of [1, 2, 1], untouched
    index.check_integrity()
    for _ in range(200):  # past the initial tables, a few regrowths, three tokens an append
        index.extend(tokens)
    assert not index.poisoned
    index.check_integrity()
    length, ends = prior_match([1, 2, 1, *[3, 1, 2] * 200])
    assert (index.match_len, index.match_end in ends) == (length, True)


# -- frozen mode and external cursors -----------------------------------------------------


def test_frozen_index_refuses_appends_and_cursors_need_it() -> None:
    index = SamIndex()
    index.extend([1, 2, 3])
    with pytest.raises(FrozenIndexError):
        index.cursor()
    index.freeze()
    index.freeze()  # idempotent
    with pytest.raises(FrozenIndexError):
        index.extend([4])
    assert index.frozen
    assert isinstance(index.cursor(), Cursor)


def test_cursor_worked_example() -> None:
    ref = SamIndex.frozen_from([4, 1, 2, 3, 1, 2, 8])
    cursor = ref.cursor()
    cursor.advance([9, 1, 2])
    assert (cursor.match_len, cursor.match_end, cursor.draft(4)) == (2, 5, [8])
    cursor.advance([8])  # [1 2 8] only ends the document: nothing follows it
    assert (cursor.match_len, cursor.draft(4)) == (0, [])
    cursor.reset()
    assert (cursor.match_len, cursor.draft(4)) == (0, [])


def test_empty_reference_never_matches() -> None:
    ref = SamIndex.frozen_from([])
    cursor = ref.cursor()
    for t in [1, 1, 2, 1]:
        cursor.advance([t])
        assert (cursor.match_len, cursor.match_end, cursor.draft(3)) == (0, -1, [])
    ref.check_integrity(deep=True)


@SETTINGS
@given(
    st.sampled_from(ALPHABETS).flatmap(
        lambda a: st.tuples(
            st.lists(st.integers(0, a - 1), max_size=60),
            st.lists(st.integers(0, a - 1), max_size=40),
        )
    )
)
def test_cursor_against_brute_force(pair: tuple[list[int], list[int]]) -> None:
    reference, conversation = pair
    index = SamIndex.frozen_from(reference)
    index.check_integrity(deep=True)
    stepwise, batched = index.cursor(), index.cursor()
    for i, t in enumerate(conversation):
        stepwise.advance([t])
        length, ends = reference_match(reference, conversation[: i + 1])
        assert stepwise.match_len == length
        if length == 0:
            assert (stepwise.match_end, stepwise.draft(3)) == (-1, [])
            continue
        assert stepwise.match_end == ends[-1]  # the last occurrence that has a successor
        for n in (1, 4, 2 * (1 + length)):
            assert stepwise.draft(n) == reference[ends[-1] + 1 : ends[-1] + 1 + n]
    batched.advance(conversation)
    assert (batched.match_len, batched.match_end) == (stepwise.match_len, stepwise.match_end)


def test_freeze_keeps_the_internal_match() -> None:
    index = SamIndex()
    index.extend([7, 1, 2, 9, 1, 2])
    index.freeze()
    assert (index.match_len, index.match_end, index.draft(3)) == (2, 2, [9, 1, 2])
    index.check_integrity(deep=True)


def test_many_cursors_are_independent() -> None:
    ref = SamIndex.frozen_from([1, 2, 3, 4, 5, 1, 2, 6])
    cursors = [ref.cursor() for _ in range(3)]
    cursors[0].advance([1, 2])
    cursors[1].advance([4])
    assert cursors[0].draft(2) == [6]
    assert cursors[1].draft(2) == [5, 1]
    assert cursors[2].match_len == 0
    with pytest.raises(ValueError, match="position 1"):
        cursors[2].advance([1, -1])


# -- numba is optional ----------------------------------------------------------------------


def test_imports_and_matches_without_numba() -> None:
    """The plain-Python core, in a process where numba cannot be imported."""
    code = """
import sys
sys.modules["numba"] = None
import draftless.sources as sources
from draftless import _jit
assert not _jit.HAVE_NUMBA
sys.path.insert(0, "tests")
from oracles import PriorMatchOracle, continuation
stream = [0, 1, 0, 0, 1, 0, 1, 0, 0, 1, 0, 0, 1, 2, 0, 1, 0, 0] * 3
index, oracle = sources.SamIndex(), PriorMatchOracle()
for i, t in enumerate(stream):
    index.extend([t])
    length, ends = oracle.append(t)
    assert index.match_len == length, i
    if length:
        assert index.match_end in ends
        assert index.draft(5) == continuation(stream[: i + 1], index.match_end, 5)
index.check_integrity(deep=True)
cascade = sources.SpeculationIndex(10)
cascade.observe(stream)
assert cascade.propose(4).tokens
print("ok")
"""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root / "src")}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
