"""The cascade (the speculation index): conversation SAM, reference SAMs, recycling.

`SpeculationIndex` is one DraftSource over three kinds of members:

1. conversation: an online SamIndex over every committed token (prompt and generated);
2. references: up to 8 frozen SamIndexes added with add_reference(token_ids), each walked by
   a cursor over the committed stream;
3. recycling: the Token-Recycling matrix, the fallback (chains of at most 8).

Selection: the longest match wins; ties go to the conversation (recency in the live stream
beats a static document), then to the first-added reference. A match shorter than min_match
(2) falls through to recycling. The draft grows with the match: at most
budget_beta * (1 + match_len) tokens, budget_beta = 2. Whether a member's drafts pay is the
decoder's cost gate's business (one gate per member), not the cascade's. Match drafts pass
through the edit learner (`edits.py`): where the stream has left a copy and rejoined it (a
rename), later drafts carry the same substitution.

Worked example: committed stream [5 6 7 8 | 9 | 5 6 7] (observed in any chunks). The
conversation matches [5 6 7] (match_len 3), so propose(16) returns its continuation for a
budget of 2 * (1 + 3) = 8 tokens: Draft([8 9 5 6 7 8 9 5], "conversation", 3).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from draftless.sources.base import Draft
from draftless.sources.edits import EXPECT, EditLearner
from draftless.sources.recycling import Recycling
from draftless.sources.sam import Cursor, SamIndex, as_token_array

__all__ = ["CascadeOptions", "SpeculationIndex"]

CONVERSATION = "conversation"
RECYCLING = "recycling"
_FEW = 8  # committed ids a step's observe() copies into a reused buffer


@dataclass(frozen=True, slots=True)
class CascadeOptions:
    """Knobs of the cascade policy, validated here; a bad one raises ValueError naming it."""

    recycling: bool = True  # keep the Token-Recycling fallback (and ask for top-K rows)
    min_match: int = 2  # tokens; shorter matches fall through to recycling
    budget_beta: int = 2  # draft budget = budget_beta * (1 + match_len) tokens
    max_references: int = 8  # frozen reference documents at once
    edits: bool = True  # learn substitutions (renames) from the stream, apply them to drafts

    def __post_init__(self) -> None:
        for flag in ("recycling", "edits"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"{flag} must be a bool, got {getattr(self, flag)!r}")
        for name, low in (("min_match", 1), ("budget_beta", 1), ("max_references", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


@dataclass(slots=True)
class _Reference:
    name: str  # "reference[i]"
    index: SamIndex
    cursor: Cursor


class SpeculationIndex:
    """The cascade as a DraftSource. See the module docstring for the policy.

    SpeculationIndex(vocab_size, recycling=True, min_match=2, budget_beta=2, max_references=8,
    edits=True).
    """

    def __init__(
        self,
        vocab_size: int,
        *,
        recycling: bool = True,
        min_match: int = 2,
        budget_beta: int = 2,
        max_references: int = 8,
        edits: bool = True,
        references: Sequence[Sequence[int] | np.ndarray] = (),
    ) -> None:
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
            raise ValueError(f"vocab_size must be a positive int, got {vocab_size!r}")
        self.options = CascadeOptions(
            recycling=recycling,
            min_match=min_match,
            budget_beta=budget_beta,
            max_references=max_references,
            edits=edits,
        )
        self.vocab_size = vocab_size
        self.wants_topk: bool = recycling  # the decoder computes top-K rows only for recycling
        self.topk_member: str | None = RECYCLING if recycling else None  # and while it pays
        self._conversation = SamIndex()
        self._references: list[_Reference] = []
        self._recycling = Recycling(vocab_size) if recycling else None
        # Renames and changed values learned from the stream, applied to match drafts.
        self._edits = EditLearner() if edits else None
        self._few = np.empty(_FEW, dtype=np.int32)  # [_FEW] a decoder step's ids (observe)
        for ref in references:
            self.add_reference(ref)

    # -- the DraftSource protocol -------------------------------------------------------

    def _choose(self) -> tuple[str, SamIndex | Cursor | Recycling, int] | None:
        """(member, what drafts, match length) of the member that would draft now, or None."""
        best: tuple[str, SamIndex | Cursor | Recycling, int] | None = None
        best_len = self.options.min_match - 1
        if self._conversation.match_len > best_len:
            best_len = self._conversation.match_len
            best = (CONVERSATION, self._conversation, best_len)
        for ref in self._references:
            if ref.cursor.match_len > best_len:
                best_len = ref.cursor.match_len
                best = (ref.name, ref.cursor, best_len)
        if best is None and self._recycling is not None and self._recycling.would_draft():
            best = (RECYCLING, self._recycling, 0)
        return best

    def propose(self, budget: int) -> Draft | None:
        """A draft of at most `budget` tokens from the chosen member (None if it has none).

        A match whose continuation is empty (it ends where the stream ends) falls through to
        recycling."""
        chosen = self._choose()
        if chosen is None or budget <= 0:
            return None
        name, drafter, match_len = chosen
        if isinstance(drafter, Recycling):
            tokens = drafter.suggest(budget)
        else:
            want = min(budget, self.options.budget_beta * (1 + match_len))
            edits = self._edits
            if edits is None:
                tokens = drafter.draft(want)
            else:  # it reads EXPECT tokens past the draft: where a verify's rejection is, and
                # what follows it (apply() keeps a longer draft starting with a shorter one)
                at = self._conversation.n_tokens
                tokens, spans = edits.apply(drafter.draft(want + EXPECT), at)
                edits.expect(at, tokens, match_len, spans)
                tokens = tokens[:want]
            if not tokens and self._recycling is not None:
                name, match_len = RECYCLING, 0
                tokens = self._recycling.suggest(budget)
        return Draft(tokens, name, match_len) if tokens else None

    def observe(self, committed: Sequence[int] | np.ndarray) -> None:
        """Feeds committed tokens to every member."""
        tokens = as_token_array(
            committed, limit=self.vocab_size, what="committed token", out=self._few
        )  # the members read it and never keep it
        if tokens.shape[0] == 0:
            return
        few = tokens.tolist() if tokens.shape[0] <= _FEW else None  # a decoder step's
        if self._edits is not None:
            self._edits.observe(self._conversation.n_tokens, few or tokens.tolist())
        try:
            self._conversation._extend_array(tokens)
        except MemoryError:
            warnings.warn(
                "draftless: the conversation index ran out of memory and drafts nothing now",
                RuntimeWarning,
                stacklevel=2,
            )
        for ref in self._references:
            ref.cursor._advance_array(tokens)
        if self._recycling is not None:
            self._recycling._observe_array(tokens, few)

    def observe_topk(self, token_ids: Sequence[int] | np.ndarray, topk_ids: np.ndarray) -> None:
        """Top-K rows of the verify forward, for recycling (ignored without it)."""
        if self._recycling is not None:
            self._recycling.observe_topk(token_ids, topk_ids)

    # -- references -----------------------------------------------------------------------

    def add_reference(self, token_ids: Sequence[int] | np.ndarray) -> int:
        """Adds a reference document (ids from the model's own tokenizer); returns its slot.

        The new cursor catches up over the stream committed so far, so the document matches
        at once. An empty document is allowed and never matches. Raises ValueError on an id
        outside [0, vocab_size) (naming it and its position) and past max_references.
        """
        limit = self.options.max_references
        if len(self._references) >= limit:
            raise ValueError(f"at most {limit} references at once (call clear_references() first)")
        tokens = as_token_array(token_ids, limit=self.vocab_size, what="reference token")
        index = SamIndex.frozen_from(tokens)
        cursor = index.cursor()
        conversation = self._conversation
        cursor._advance_array(conversation._stream[: conversation.n_tokens])
        slot = len(self._references)
        self._references.append(_Reference(f"reference[{slot}]", index, cursor))
        return slot

    def clear_references(self) -> None:
        """Drops every reference document."""
        self._references.clear()

    @property
    def references(self) -> tuple[SamIndex, ...]:
        """The frozen reference indexes, in the order they were added."""
        return tuple(ref.index for ref in self._references)

    def reset(self) -> None:
        """A new conversation: empty conversation index, rewound cursors.

        Reference documents stay (their cursors restart); the recycling matrix stays (it is
        knowledge about the model, not about the conversation).
        """
        self._conversation = SamIndex()
        if self._edits is not None:
            self._edits.reset()
        for ref in self._references:
            ref.cursor.reset()
        if self._recycling is not None:
            self._recycling.reset()

    # -- inspection -----------------------------------------------------------------------

    @property
    def conversation(self) -> SamIndex:
        """The conversation index (read it, do not extend it: observe() does)."""
        return self._conversation

    @property
    def recycling(self) -> Recycling | None:
        return self._recycling

    def edit_stats(self) -> dict[str, int] | None:
        """The edit learner's counts (`EditLearner.stats`), or None with edits=False."""
        return None if self._edits is None else self._edits.stats()

    def members(self) -> tuple[str, ...]:
        """Conversation, then references in order, then recycling (if enabled)."""
        names = [CONVERSATION] + [ref.name for ref in self._references]
        return tuple(names + ([RECYCLING] if self._recycling is not None else []))

    @property
    def nbytes(self) -> int:
        """Memory held by the indexes and the matrix, in bytes."""
        total = self._conversation.nbytes + sum(ref.index.nbytes for ref in self._references)
        return total + (self._recycling.nbytes if self._recycling is not None else 0)
