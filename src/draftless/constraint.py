"""What a constraint (a grammar, a JSON schema) tells the decoder, and nothing more.

    c.allowed()              -> bool [vocab]: the tokens it lets come next
    c.consume(token)         the decoder committed `token` (one it allowed)
    c.rollback(n)            forget the last n consumed tokens
    c.valid_prefix(tokens)   how many of `tokens`, in order, it would let come next
    c.forced()               (optional, `Forcing`) the tokens it makes come next, if any

Plain decoding samples each token from its row with every token the constraint does not
allow masked out (`sampling.sample(..., allowed=)`), and the speculative decoder samples each
verify row the same way, with the constraint advanced over the tokens committed before that
row: row i's mask is the one plain decoding would compute at that position, so the answer is
plain's, token for token. Draft tokens never enter the constraint; a draft is cut at its
first token the constraint would refuse (that token's probability is zero: a verify could
only reject it). The implementation over llguidance is `draftless.grammar`; this module
needs numpy alone.

A constraint that can say which tokens it forces next (a JSON schema's next key, the closing
of a call; `Forcing`) gives the speculative decoder a draft of its own: where the source has
nothing longer, those tokens are verified as the "grammar" member's draft, under a cost gate
like any member's. They are a draft, not an answer: a verify samples every row as plain
decoding would, so a model that writes the same bytes in other tokens is followed, and the
gate learns what such drafts are worth.
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


@runtime_checkable
class Forcing(Constraint, Protocol):
    def forced(self) -> list[int]:
        """The tokens that come next whatever the model does, from where the constraint
        stands: the text it forces (a schema's next key), in the tokens it expects that text
        in; possibly none, or only the start of a longer forced run."""
        ...
