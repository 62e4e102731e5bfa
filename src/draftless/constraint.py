"""What a constraint (a grammar, a JSON schema) tells the decoder, and nothing more.

    c.allowed()              -> bool [vocab]: the tokens it lets come next
    c.consume(token)         the decoder committed `token` (one it allowed)
    c.rollback(n)            forget the last n consumed tokens
    c.valid_prefix(tokens)   how many of `tokens`, in order, it would let come next

Plain decoding samples each token from its row with every token the constraint does not
allow masked out (`sampling.sample(..., allowed=)`), and the speculative decoder samples each
verify row the same way, with the constraint advanced over the tokens committed before that
row: row i's mask is the one plain decoding would compute at that position, so the answer is
plain's, token for token. Draft tokens never enter the constraint; a draft is cut at its
first token the constraint would refuse (that token's probability is zero: a verify could
only reject it). The implementation over llguidance is `draftless.grammar`; this module
needs numpy alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Constraint(Protocol):
    def allowed(self) -> np.ndarray:
        """Bool [vocab]: True for each token the constraint lets come next."""
        ...

    def consume(self, token: int) -> None:
        """Advance over a committed token. Raises if the constraint does not allow it."""
        ...

    def rollback(self, n: int) -> None:
        """Forget the last n consumed tokens."""
        ...

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        """How many of `tokens`, consumed in order, the constraint would allow (it is left as
        it was)."""
        ...
