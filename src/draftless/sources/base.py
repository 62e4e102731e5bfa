"""The draft-source protocol: what the decoder asks of every source, and nothing more.

A source proposes a continuation of the committed stream. It is told every committed token,
in order, through `observe`; it never sees a token that was drafted but rejected.

    propose(budget)   -> Draft | None at most `budget` tokens, the member that made them and
                                      the evidence behind them (the match length); nothing
                                      to undo when the decoder does not verify it (a source
                                      may note what it proposed, as the cascade's edit
                                      learner does, and compare it with what observe() is
                                      told next; proposing again gives the same draft). A
                                      draft of d tokens starts with the draft
                                      of any shorter budget (the decoder cuts it to the
                                      length its cost gate allows).
    observe(tokens)                   tokens appended to the committed stream
    wants_topk        -> bool         False: the decoder never computes top-k rows for it
    observe_topk(ids, topk)           topk[i] ([K] int32, best first) are the most likely
                                      successors of ids[i] in the verify forward that just ran
    topk_member       -> str | None   the member whose drafts the top-k rows feed (the
                                      cascade's "recycling"): the decoder computes them only
                                      while that member's cost gate is on (None: always, when
                                      wants_topk)

Worked example: committed stream [1 2 3 1 2]; a suffix-automaton source's propose(3) returns
Draft([3, 1, 2], "conversation", match_len=2) (the continuation of the earlier "1 2"). The
model commits 3 1 9; the decoder calls observe([3, 1, 9]). Acceptance is counted by the
decoder, per member and evidence, not by the source.

`Source` is a base class with the harmless defaults (no top-k rows); subclass it and write
`propose` and `observe`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True, slots=True)
class Draft:
    tokens: list[int]  # [d] drafted token ids
    member: str  # the member that drafted them: the key of its cost gate and its stats
    match_len: int = 0  # tokens of context the draft continues (0: not a match-based draft)


@runtime_checkable
class DraftSource(Protocol):
    @property
    def wants_topk(self) -> bool: ...

    @property
    def topk_member(self) -> str | None: ...

    def propose(self, budget: int) -> Draft | None: ...

    def observe(self, committed: Sequence[int] | np.ndarray) -> None: ...

    def observe_topk(self, token_ids: Sequence[int] | np.ndarray, topk_ids: np.ndarray) -> None: ...


class Source:
    """Defaults for a source that ignores top-k rows."""

    wants_topk: bool = False
    topk_member: str | None = None

    def propose(self, budget: int) -> Draft | None:
        raise NotImplementedError

    def observe(self, committed: Sequence[int] | np.ndarray) -> None:
        raise NotImplementedError

    def observe_topk(self, token_ids: Sequence[int] | np.ndarray, topk_ids: np.ndarray) -> None:
        return None


def check_source(source: object) -> None:
    """TypeError naming what a draft source lacks (instead of an AttributeError mid-run)."""
    missing = [
        name
        for name in ("wants_topk", "topk_member", "propose", "observe", "observe_topk")
        if not hasattr(source, name)
    ]
    if missing:
        raise TypeError(
            f"{type(source).__name__} is not a draft source: it lacks {', '.join(missing)} "
            "(subclass draftless.sources.Source for the defaults)"
        )
