"""Recycling against a list-of-lists oracle (tests/oracles.py) and by hand-set examples."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftless.sources import Recycling
from draftless.sources.recycling import HOLD
from oracles import RecyclingOracle

VOCAB = 12


def topk(*rows: list[int]) -> np.ndarray:
    return np.array(rows, dtype=np.int32)


def test_worked_example() -> None:
    rec = Recycling(10)
    rec.observe_topk([3], topk([5, 1]))
    assert rec.row(3).tolist() == [5, 1, -1, -1, -1, -1, -1, -1]
    rec.observe([2, 3])
    assert rec.row(2).tolist() == [3, -1, -1, -1, -1, -1, -1, -1]
    assert rec.suggest(4) == [5]
    rec.observe([7])
    assert rec.row(3).tolist() == [7, 5, 1, -1, -1, -1, -1, -1]
    assert rec.suggest(4) == []


@pytest.mark.parametrize("vocab", [1, 151_936, 262_144])
def test_memory_is_exactly_vocab_x_8_x_4_bytes(vocab: int) -> None:
    rec = Recycling(vocab)
    assert rec.nbytes == vocab * 8 * 4
    assert rec.row(vocab - 1).tolist() == [-1] * 8  # cold: sentinel fill


def test_cold_rows_draft_nothing() -> None:
    rec = Recycling(VOCAB)
    assert rec.suggest(8) == []  # nothing committed yet
    rec.observe([4])
    assert rec.suggest(8) == []  # row 4 is cold


def test_chain_is_capped_at_8_and_at_max_tokens() -> None:
    rec = Recycling(VOCAB)
    rec.observe_topk([1, 2], topk([2, 0], [1, 0]))  # 1 -> 2 -> 1 -> ... a cycle
    rec.observe([1])
    assert rec.suggest(100) == [2, 1, 2, 1, 2, 1, 2, 1]
    assert rec.suggest(3) == [2, 1, 2]
    assert rec.suggest(0) == []
    assert rec.suggest(-1) == []


def test_topk_rows_replace_and_short_k_leaves_a_cold_tail() -> None:
    rec = Recycling(VOCAB)
    rec.observe_topk([5], topk(list(range(8))))
    assert rec.row(5).tolist() == list(range(8))
    rec.observe_topk([5], topk([9, 8, 7]))
    assert rec.row(5).tolist() == [9, 8, 7, -1, -1, -1, -1, -1]
    rec.observe_topk([5], topk(list(range(11, -1, -1))))  # K > 8 is cut to 8
    assert rec.row(5).tolist() == [11, 10, 9, 8, 7, 6, 5, 4]
    rec.observe_topk([6, 6], topk([1, 2], [3, 4]))  # the later row wins
    assert rec.row(6).tolist()[:2] == [3, 4]
    rec.observe_topk([], np.zeros((0, 8), dtype=np.int32))


def test_bigram_move_to_front() -> None:
    rec = Recycling(VOCAB)
    rec.observe_topk([0], topk([1, 2, 3, 4, 5, 6, 7, 8]))
    rec.observe([0, 4])  # present: moves to the front
    assert rec.row(0).tolist() == [4, 1, 2, 3, 5, 6, 7, 8]
    rec.observe([0])  # bigram (4, 0)
    rec.observe([9])  # absent: inserted, the last (8) dropped; spans observe() calls
    assert rec.row(0).tolist() == [9, 4, 1, 2, 3, 5, 6, 7]
    assert rec.row(4).tolist() == [0, -1, -1, -1, -1, -1, -1, -1]
    assert rec.last_token == 9


def test_reset_forgets_the_last_token_and_clear_the_rows() -> None:
    rec = Recycling(VOCAB)
    rec.observe_topk([1], topk([2]))
    rec.observe([1])
    assert rec.suggest(4) == [2]
    rec.reset()
    assert rec.suggest(4) == []
    rec.observe([1])
    assert rec.suggest(4) == [2]  # the matrix survived reset()
    rec.clear()
    assert rec.suggest(4) == []
    assert rec.row(1).tolist() == [-1] * 8


def test_bad_input_raises() -> None:
    with pytest.raises(ValueError, match="vocab_size"):
        Recycling(0)
    rec = Recycling(VOCAB)
    with pytest.raises(ValueError, match=r"id 12 at position 1"):
        rec.observe([3, 12])
    with pytest.raises(ValueError, match=r"id -1 at position 0"):
        rec.observe_topk([-1], topk([1]))
    with pytest.raises(ValueError, match=r"candidate id 99 at row 1, column 1"):
        rec.observe_topk([1, 2], topk([3, 4], [2, 99]))  # row 1 is not written either
    with pytest.raises(ValueError, match=r"candidate id -5 at row 0, column 0"):
        rec.observe_topk([1], topk([-5]))
    with pytest.raises(ValueError, match=r"candidate id 8589934592 at position 1"):
        rec.observe_topk([1], np.array([[2, 2**33]]))  # int64: no silent wrap to int32
    with pytest.raises(ValueError, match="integers"):
        rec.observe_topk([1], np.array([[2.0, 3.0]]))
    with pytest.raises(ValueError, match="shape"):
        rec.observe_topk([1, 2], topk([2, 3]))
    assert rec.suggest(8) == [] and rec.last_token == -1  # nothing was applied
    assert rec.row(1).tolist() == [-1] * 8
    rec.observe_topk([1], np.array([[2, 3]], dtype=np.int64))  # any integer dtype
    assert rec.row(1).tolist()[:3] == [2, 3, -1]


@dataclass(frozen=True)
class Op:
    kind: str  # "observe", "topk", "suggest" or "would" (would_draft)
    tokens: list[int]  # observe: committed tokens; topk: row tokens
    candidates: list[list[int]]  # topk: [k, K] successors, best first
    max_tokens: int = 0  # suggest


@st.composite
def operations(draw: st.DrawFn) -> list[Op]:
    ids = st.integers(0, VOCAB - 1)
    ops: list[Op] = []
    for _ in range(draw(st.integers(1, 30))):
        kind = draw(st.sampled_from(["observe", "topk", "suggest", "would"]))
        if kind == "observe":
            ops.append(Op(kind, draw(st.lists(ids, max_size=6)), []))
        elif kind == "topk":
            k, width = draw(st.integers(1, 4)), draw(st.integers(1, 8))
            rows = draw(st.lists(ids, min_size=k, max_size=k))
            cands = [draw(st.lists(ids, min_size=width, max_size=width, unique=True)) for _ in rows]
            ops.append(Op(kind, rows, cands))
        elif kind == "suggest":
            ops.append(Op(kind, [], [], draw(st.integers(0, 12))))
        else:
            ops.append(Op(kind, [], []))
    return ops


@settings(max_examples=300, deadline=None)
@given(operations(), st.sampled_from(["at once", "held"]))
def test_against_the_oracle(ops: list[Op], how: str) -> None:
    """Bigrams applied at once (observe) or held as a decoder's steps leave them (the
    cascade's path: _observe_array with the ids, applied when the matrix is read)."""
    rec, oracle = Recycling(VOCAB), RecyclingOracle()
    for op in ops:
        if op.kind == "observe":
            if how == "held":
                rec._observe_array(np.array(op.tokens, dtype=np.int32), list(op.tokens))
            else:
                rec.observe(op.tokens)
            oracle.observe(op.tokens)
            assert rec.last_token == oracle.last
        elif op.kind == "topk":
            rec.observe_topk(op.tokens, np.array(op.candidates, dtype=np.int32))
            oracle.observe_topk(op.tokens, op.candidates)
        elif op.kind == "suggest":
            assert rec.suggest(op.max_tokens) == oracle.suggest(op.max_tokens)
        else:
            assert rec.would_draft() == bool(oracle.suggest(1))
    for token in range(VOCAB):
        assert rec.row(token).tolist() == oracle.row(token)


def test_held_bigrams_wait_until_the_matrix_is_read() -> None:
    """A step's tokens wait (the matrix is untouched) until a read or HOLD tokens."""
    rec = Recycling(VOCAB)
    for t in [1, 2, 1, 3]:
        rec._observe_array(np.array([t], dtype=np.int32), [t])
    assert (rec._m[1:4] == -1).all()
    assert rec.last_token == 3 and rec.would_draft() is False  # row 3 is cold
    rec._observe_array(np.array([1], dtype=np.int32), [1])
    assert rec.would_draft() and (rec._m[1] == -1).all()  # warm once applied; still held
    assert rec.suggest(8) == [3, 1, 3, 1, 3, 1, 3, 1]  # 1 -> 3 (moved to front) -> 1
    assert rec.row(1).tolist()[:2] == [3, 2]
    for t in range(HOLD + 1):  # past HOLD the held ones are applied at once
        rec._observe_array(np.array([t % VOCAB], dtype=np.int32), [t % VOCAB])
    assert len(rec._held) <= HOLD
