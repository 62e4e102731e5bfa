"""The cross-request draft index: what earlier requests read and wrote, bounded in bytes.

An agent editing a file sends it again and again; a chat resends every earlier turn. So each
finished request leaves its stream (prompt + completion tokens) here, and the next request
drafts from all of them: `reference()` is their concatenation, oldest first, which the engine
adds to the request's SpeculationIndex as one frozen reference (a suffix automaton: the
longest match over every earlier request at once, drafting from the latest occurrence).

Bounded: each stored token is charged `BYTES_PER_TOKEN`, which covers its two 4-byte copies
here (its entry and the cached concatenation) and its share of the frozen automaton built from
the concatenation (<= ~108 B a token; the hypothesis test checks the sum against the real
index's nbytes). Building that automaton peaks higher for a moment (its edge lists).
Adding a stream evicts the oldest ones until the charge fits the budget; a stream larger than
the whole budget keeps only its newest tokens. A stream that a new one extends (the previous
turn of the same chat) is dropped as superseded, so a conversation is held once, not once per
turn.

    h = RequestHistory(budget=1 << 20)
    h.add([1, 2, 3]); h.add([1, 2, 3, 4, 5])   # the second extends the first: one entry
    h.reference() -> array([1, 2, 3, 4, 5], dtype=int32)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

DEFAULT_INDEX_BUDGET = 8 * 1024 * 1024  # bytes for the cross-request draft index

BYTES_PER_TOKEN = 128  # charge per stored token: 2 x 4 B copies + <= 108 B of automaton
OVERHEAD_BYTES = 4096  # the automaton's fixed part (minimum table sizes)


class RequestHistory:
    def __init__(self, budget: int) -> None:
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
            raise ValueError(f"the index budget must be an int >= 0 bytes, got {budget!r}")
        self.budget = budget
        self.max_tokens = max(0, (budget - OVERHEAD_BYTES) // BYTES_PER_TOKEN)
        self._entries: deque[np.ndarray] = deque()  # [n_i] int32 each, oldest first
        self._n_tokens = 0
        self._concat: np.ndarray | None = None  # cache of reference(); None: stale
        self.added = 0  # streams added
        self.evicted = 0  # streams evicted for room (superseded ones not counted)

    def add(self, token_ids: Sequence[int] | np.ndarray) -> None:
        """Keep a finished request's stream; evict the oldest streams past the budget."""
        tokens = np.asarray(token_ids, dtype=np.int32).ravel()
        if self.max_tokens == 0 or tokens.size == 0:
            return
        if tokens.size > self.max_tokens:
            tokens = tokens[-self.max_tokens :].copy()  # its newest part
        kept: deque[np.ndarray] = deque()
        for entry in self._entries:  # superseded: the new stream starts with it
            if not (entry.size <= tokens.size and np.array_equal(tokens[: entry.size], entry)):
                kept.append(entry)
        self._entries = kept
        self._entries.append(tokens)
        self._n_tokens = sum(e.size for e in self._entries)
        while self._n_tokens > self.max_tokens:
            self._n_tokens -= self._entries.popleft().size
            self.evicted += 1
        self._concat = None
        self.added += 1

    def reference(self) -> np.ndarray | None:
        """Every kept stream, oldest first, as one int32 array [n_tokens]; None when empty."""
        if not self._entries:
            return None
        if self._concat is None:
            self._concat = np.concatenate(list(self._entries))
        return self._concat

    @property
    def n_entries(self) -> int:
        return len(self._entries)

    @property
    def n_tokens(self) -> int:
        return self._n_tokens

    @property
    def charged_bytes(self) -> int:
        """What the budget counts: <= budget, always."""
        if not self._n_tokens:
            return 0
        return OVERHEAD_BYTES + self._n_tokens * BYTES_PER_TOKEN

    @property
    def stored_bytes(self) -> int:
        """Bytes held here (the stream copies and the cached concatenation)."""
        held = sum(e.nbytes for e in self._entries)
        return held + (self._concat.nbytes if self._concat is not None else 0)
