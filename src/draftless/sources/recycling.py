"""The Token-Recycling matrix: the fallback draft when no index matches (Luo et al., 2024).

Verification computes a full logits row for every position and keeps only the sampled
token; recycling keeps the rest. One row per vocabulary token holds the ROW = 8 most likely
successors of that token, best first, from two sources:

* observe_topk(token_ids, topk_ids): row token_ids[i] := topk_ids[i] (the verify forward's
  top-K after token_ids[i]; K <= 8, a shorter K leaves the tail of the row cold);
* observe(committed): committed-bigram move-to-front. For consecutive committed tokens
  (a, b), b moves to the front of row a (inserted if absent, dropping the row's last entry).
  The last committed token is remembered across calls, so bigrams span observe() calls.

The draft is a top-1 chain walk from the last committed token, capped at ROW tokens: a cold
row (sentinel -1) ends it, so a token never seen drafts nothing.

Worked example (vocab 10): observe_topk([3], [[5, 1]]) sets row 3 to [5 1 -1 ...]; then
observe([2, 3]) moves 3 to the front of row 2; suggest(4) walks 3 -> 5 -> (row 5 is cold)
and returns [5]. observe([7]) makes row 3 [7 5 1 -1 ...] and suggest(4) returns [] (row 7
is cold).

Memory: exactly vocab x 8 x 4 bytes (8 MiB at Gemma 3's 262,144 vocab); no seen-bitmap.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from draftless._jit import njit
from draftless.sources.sam import as_token_array

__all__ = ["ROW", "Recycling"]

ROW = 8  # successors kept per token, and the longest chain drafted
# Committed tokens a decoder's steps may leave waiting before their bigrams are moved to
# the front: one compiled call then does many steps' work. Right after a forward each call
# costs a step tens of microseconds of cold code (docs/bench/avx2/s32/cold-ops.txt), and
# the matrix is read only where recycling drafts.
HOLD = 64


@njit
def _set_rows(m, token_ids, topk_ids):
    """Row token_ids[r] := topk_ids[r] (cold tail when K < ROW); later rows win.

    Returns -1, or the flat index of the first candidate outside [0, vocab) (nothing
    written: every candidate is checked first).
    """
    k = min(topk_ids.shape[1], ROW)
    for r in range(topk_ids.shape[0]):
        for c in range(topk_ids.shape[1]):
            if topk_ids[r, c] < 0 or topk_ids[r, c] >= m.shape[0]:
                return r * topk_ids.shape[1] + c
    for r in range(token_ids.shape[0]):
        row = token_ids[r]
        for c in range(k):
            m[row, c] = topk_ids[r, c]
        for c in range(k, ROW):
            m[row, c] = -1
    return -1


@njit
def _move_to_front(m, prev, tokens):
    """Committed-bigram move-to-front over prev, tokens[0], tokens[1] ...; returns the last."""
    for k in range(tokens.shape[0]):
        b = tokens[k]
        if prev >= 0:
            pos = ROW - 1  # absent: the last entry is dropped
            for c in range(ROW):
                if m[prev, c] == b:
                    pos = c
                    break
            for c in range(pos, 0, -1):
                m[prev, c] = m[prev, c - 1]
            m[prev, 0] = b
        prev = b
    return prev


class Recycling:
    """A vocab x 8 int32 successor matrix, the cascade's fallback. See the module docstring."""

    def __init__(self, vocab_size: int) -> None:
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
            raise ValueError(f"vocab_size must be a positive int, got {vocab_size!r}")
        self._vocab_size = vocab_size
        self._m = np.full((vocab_size, ROW), -1, dtype=np.int32)  # [vocab, ROW], -1 = cold
        # The matrix holds the bigrams up to _prev (-1: none yet); the tokens committed
        # after it wait in _held, and _heads are the first tokens of their bigrams (the
        # rows those will warm: a move to the front never cools a row).
        self._prev = -1
        self._held: list[int] = []
        self._heads: set[int] = set()

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def nbytes(self) -> int:
        """vocab_size * 8 * 4, exactly."""
        return int(self._m.nbytes)

    @property
    def last_token(self) -> int:
        """The last committed token, where the next chain walk starts (-1 before any)."""
        return self._held[-1] if self._held else self._prev

    def row(self, token_id: int) -> np.ndarray:
        """A copy of the successors of token_id [ROW] int32, best first, -1 where cold."""
        self._apply()
        return self._m[token_id].copy()

    def observe(self, committed: Sequence[int] | np.ndarray) -> None:
        """Committed-bigram move-to-front for the tokens appended to the committed stream."""
        self._observe_array(as_token_array(committed, limit=self._vocab_size))

    def _observe_array(self, tokens: np.ndarray, ids: list[int] | None = None) -> None:
        """observe() for an already validated int32 array [k] of ids < vocab_size. Given
        `ids`, the same tokens as Python ints (a decoder step's few), they may wait (HOLD)."""
        if ids is not None and len(self._held) + len(ids) <= HOLD:
            prev = self.last_token
            for t in ids:
                if prev >= 0:
                    self._heads.add(prev)
                prev = t
            self._held.extend(ids)
            return
        self._apply()
        if tokens.shape[0]:
            self._prev = int(_move_to_front(self._m, self._prev, tokens))

    def _apply(self) -> None:
        """Moves the waiting bigrams to the front, in the order they were committed."""
        if self._held:
            held = np.array(self._held, dtype=np.int32)
            self._prev = int(_move_to_front(self._m, self._prev, held))
            self._held.clear()
            self._heads.clear()

    def observe_topk(self, token_ids: Sequence[int] | np.ndarray, topk_ids: np.ndarray) -> None:
        """Row token_ids[i] := topk_ids[i] ([k] ids, [k, K] int32 best first; K > 8 is cut)."""
        rows = as_token_array(token_ids, limit=self._vocab_size, what="top-K row token")
        topk = np.asarray(topk_ids)
        if topk.ndim != 2 or topk.shape[0] != rows.shape[0]:
            raise ValueError(
                f"topk_ids must have shape [{rows.shape[0]}, K], got {tuple(topk.shape)}"
            )
        if rows.shape[0] == 0 or topk.shape[1] == 0:
            return
        self._apply()  # the bigrams committed before these rows come first
        if topk.dtype != np.int32 or not (topk.flags.c_contiguous and topk.flags.writeable):
            flat = as_token_array(topk.reshape(-1), limit=self._vocab_size, what="top-K candidate")
            topk = flat.reshape(topk.shape)
        bad = int(_set_rows(self._m, rows, topk))  # the decoder's int32 rows: checked in there
        if bad >= 0:
            row, col = divmod(bad, topk.shape[1])
            raise ValueError(
                f"top-K candidate id {int(topk[row, col])} at row {row}, column {col} is out "
                f"of range [0, {self._vocab_size})"
            )

    def suggest(self, max_tokens: int) -> list[int]:
        """The top-1 chain from the last committed token: up to min(8, max_tokens) tokens."""
        out: list[int] = []
        self._apply()
        token = self._prev
        if token < 0:
            return out
        column = self._m[:, 0]
        for _ in range(min(ROW, max_tokens)):
            token = int(column[token])
            if token < 0:
                break
            out.append(token)
        return out

    def would_draft(self) -> bool:
        """True when suggest() would return at least one token (the last token's row is warm)."""
        last = self.last_token
        return last >= 0 and (last in self._heads or int(self._m[last, 0]) >= 0)

    def reset(self) -> None:
        """Forgets the last committed token (a new conversation); the matrix is kept."""
        self._apply()
        self._prev = -1

    def clear(self) -> None:
        """Back to all-cold rows and no last token."""
        self._m.fill(-1)
        self._prev = -1
        self._held.clear()
        self._heads.clear()
