"""Brute-force references for the draft sources: slow, obviously correct, checked value by value.

Vocabulary: position i is an index into the stream; an occurrence of a string u "ends at" j
when stream[j - len(u) + 1 : j + 1] == u.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def common_suffix(a: Sequence[int], a_end: int, b: Sequence[int], b_end: int) -> int:
    """Length of the longest common suffix of a[: a_end + 1] and b[: b_end + 1]."""
    n = 0
    while n <= a_end and n <= b_end and a[a_end - n] == b[b_end - n]:
        n += 1
    return n


def prior_match(stream: Sequence[int]) -> tuple[int, list[int]]:
    """(L, ends) for the stream's last position i = len(stream) - 1.

    L is the length of the longest suffix of stream that also ends at some j < i; ends are
    all such j, ascending ([] when L == 0).
    """
    i = len(stream) - 1
    lengths = [common_suffix(stream, j, stream, i) for j in range(i)]
    best = max(lengths, default=0)
    return best, [j for j, n in enumerate(lengths) if best and n >= best]


class PriorMatchOracle:
    """prior_match() after every append in O(n) each (for long adversarial streams).

    lengths[j] = common suffix length of stream[: j + 1] and the whole stream, for j < i;
    appending t gives lengths'[j] = lengths[j - 1] + 1 if stream[j] == t else 0.
    """

    def __init__(self) -> None:
        self.stream: list[int] = []
        self._arr = np.zeros(0, dtype=np.int64)  # [n] the stream
        self._lengths = np.zeros(0, dtype=np.int64)  # [n - 1]

    def append(self, t: int) -> tuple[int, list[int]]:
        i = len(self.stream)
        self.stream.append(t)
        self._arr = np.append(self._arr, t)
        new = np.zeros(i, dtype=np.int64)  # j = 0 .. i - 1
        if i:
            previous = np.concatenate(([0], self._lengths))  # lengths[j - 1], 0 for j = 0
            new = np.where(self._arr[:i] == t, previous + 1, 0)
        self._lengths = new
        best = int(new.max()) if i else 0
        ends = np.flatnonzero(new >= best).tolist() if best else []
        return best, ends


def continuation(stream: Sequence[int], end: int, n: int) -> list[int]:
    """n tokens after the occurrence ending at `end`, copying over the draft itself.

    draft[k] = (stream + draft)[end + 1 + k]: what follows `end` if the draft is accepted.
    """
    extended = list(stream)
    out: list[int] = []
    for k in range(n):
        token = extended[end + 1 + k]
        out.append(token)
        extended.append(token)
    return out


def reference_match(reference: Sequence[int], stream: Sequence[int]) -> tuple[int, list[int]]:
    """(L, ends) of the stream's end against a reference document.

    L is the length of the longest suffix of stream that occurs in reference ending at some
    e < len(reference) - 1 (followed by at least one token); ends are all such e.
    """
    if not stream:
        return 0, []
    lengths = [
        common_suffix(reference, e, stream, len(stream) - 1) for e in range(len(reference) - 1)
    ]
    best = max(lengths, default=0)
    return best, [e for e, n in enumerate(lengths) if best and n >= best]


class RecyclingOracle:
    """The Token-Recycling matrix as lists: rows[token] is its successor list, best first."""

    ROW = 8

    def __init__(self) -> None:
        self.rows: dict[int, list[int]] = {}
        self.last = -1

    def observe_topk(self, token_ids: Sequence[int], topk_ids: Sequence[Sequence[int]]) -> None:
        for token, candidates in zip(token_ids, topk_ids, strict=True):
            self.rows[token] = list(candidates)[: self.ROW]

    def observe(self, committed: Sequence[int]) -> None:
        for token in committed:
            if self.last >= 0:
                row = [c for c in self.rows.get(self.last, []) if c != token]
                self.rows[self.last] = ([token, *row])[: self.ROW]
            self.last = token

    def row(self, token: int) -> list[int]:
        row = self.rows.get(token, [])
        return row + [-1] * (self.ROW - len(row))

    def suggest(self, max_tokens: int) -> list[int]:
        out: list[int] = []
        token = self.last
        while token >= 0 and len(out) < min(self.ROW, max_tokens):
            row = self.rows.get(token, [])
            if not row:
                break
            token = row[0]
            out.append(token)
        return out
