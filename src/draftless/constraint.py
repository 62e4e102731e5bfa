"""What a constraint (a grammar, a JSON schema) tells the decoder, and nothing more.

    c.allowed()              -> bool [vocab]: the tokens it lets come next (None: any)
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

`Triggered` holds a constraint back until the model opens what it holds, as llama.cpp's lazy
grammars do for tool calls: an answer is free text until the model writes `<tool_call>` or
begins with a call of one of the request's tools, and from there it is a whole call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Constraint(Protocol):
    def allowed(self) -> np.ndarray | None:
        """Bool [vocab]: True for each token the constraint lets come next; None where it
        lets any come (nothing to mask)."""
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


class Triggered:
    """`then`, over the text from where the model opens what `then` holds; nothing is masked
    before that. Two ways in, as llama.cpp's lazy grammars for tool calls have:
    - `token`: the model writes this token (`<tool_call>`); `then` holds from it, the token
      included (or from the first token, if `then` takes the whole text so far: a fence
      before the tag);
    - `opens(tokens)`, asked after each of the first `window` tokens: True once those tokens
      (the whole text so far) open what `then` holds (a call's `{"name": "get_weather"`),
      None while they still may, False once they cannot; `then` holds from the first token.
    `then` must take the tokens it would hold from, or it holds nothing (the model wrote
    something that looks like a way in and is not one). Rolling back past the way in lets go
    again."""

    def __init__(
        self,
        then: Constraint,
        token: int | None = None,
        opens: Callable[[Sequence[int]], bool | None] | None = None,
        window: int = 48,
    ) -> None:
        self.then = then
        self.token = token
        self.opens = opens
        self.window = window
        self.tokens: list[int] = []  # consumed
        self.opened_at: int | None = None  # where the text `then` holds starts, once it does
        self._held_since = 0  # how many tokens had been consumed when `then` took hold
        self._closed_at: int | None = None  # how many had been when `opens` said no

    @property
    def consumed(self) -> int:
        return len(self.tokens)

    def allowed(self) -> np.ndarray | None:
        return None if self.opened_at is None else self.then.allowed()

    def consume(self, token: int) -> None:
        tokens = self.tokens
        tokens.append(token)
        if self.opened_at is not None:
            self.then.consume(token)
            return
        ask = self._asks(len(tokens), self._closed_at is not None)
        if not ask and token != self.token:
            return
        start = self._way_in(tokens, ask)
        if start is False:
            self._closed_at = len(tokens)
        elif start is not None:
            for t in tokens[start:]:
                self.then.consume(t)
            self.opened_at, self._held_since = start, len(tokens)

    def rollback(self, n: int) -> None:
        tokens = self.tokens
        if not 0 <= n <= len(tokens):
            raise ValueError(f"cannot roll back {n} of {len(tokens)} consumed tokens")
        keep = len(tokens) - n
        if self.opened_at is not None:
            if keep >= self._held_since:
                self.then.rollback(n)
            else:  # the way in goes too
                self.then.rollback(len(tokens) - self.opened_at)
                self.opened_at = None
        if self._closed_at is not None and keep < self._closed_at:
            self._closed_at = None
        del tokens[keep:]

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        if self.opened_at is not None:
            return self.then.valid_prefix(tokens)
        closed = self._closed_at is not None
        for i, t in enumerate(tokens):  # as `consume` would go, without consuming
            ask = self._asks(len(self.tokens) + i + 1, closed)
            if not ask and t != self.token:
                continue
            so_far = [*self.tokens, *tokens[: i + 1]]
            start = self._way_in(so_far, ask)
            if start is False:
                closed = True
            elif start is not None:  # `then` judges the rest, from where it would stand
                held = so_far[start:]
                return i + 1 + self.then.valid_prefix([*held, *tokens[i + 1 :]]) - len(held)
        return len(tokens)

    def forced(self) -> list[int]:
        if self.opened_at is None or not isinstance(self.then, Forcing):
            return []
        return self.then.forced()

    def _asks(self, n: int, closed: bool) -> bool:
        return not closed and self.opens is not None and n <= self.window

    def _way_in(self, tokens: list[int], ask: bool) -> int | bool | None:
        """Where `then` holds from, with `tokens` consumed (the last one new): an index;
        None, nowhere yet; False, nowhere yet and `opens` need not be asked again."""
        n = len(tokens)
        verdict = self.opens(tokens) if ask and self.opens is not None else False
        if verdict and self.then.valid_prefix(tokens) == n:
            return 0
        if tokens[-1] == self.token:
            if verdict is None and self.then.valid_prefix(tokens) == n:
                return 0  # a fence before the token: the text it opens is held whole
            if self.then.valid_prefix(tokens[-1:]) == 1:
                return n - 1
        return False if ask and verdict is not None else None
