"""The draft-source protocol.

A draft source proposes a continuation of the committed stream. It is told every committed
token, in order, through `observe`; it never sees a token that was drafted but rejected.
Any deterministic proposer with these methods can be plugged into the decoder.

    suggest(max_tokens) -> sequence of token ids, len <= max_tokens (may be empty)
    observe(committed)  -> None; feeds tokens appended to the committed stream
    wants_topk          -> bool; if False the decoder never computes top-K rows
    observe_topk(token_ids, topk_ids) -> None; topk_ids[i] ([K] int32, best first) are the
        most likely successors of token_ids[i] in the verify forward that just ran.

Worked example: committed stream [1 2 3 1 2]; a suffix-automaton source suggests [3 1 2]
(the continuation of the earlier "1 2"). The decoder verifies it; the model commits 3 1 9;
the decoder calls observe([3, 1, 9]).

Sources may infer acceptance at the suggest -> observe seam (the cascade does: the longest
common prefix of its last draft and the tokens committed next, here 2 of 3), so call
observe with exactly the committed tokens after each verify. The sources in this package
return drafts as list[int] and raise ValueError on token ids they cannot hold.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class DraftSource(Protocol):
    wants_topk: bool

    def suggest(self, max_tokens: int) -> Sequence[int] | np.ndarray: ...

    def observe(self, committed: Sequence[int] | np.ndarray) -> None: ...

    def observe_topk(self, token_ids: Sequence[int] | np.ndarray, topk_ids: np.ndarray) -> None: ...
