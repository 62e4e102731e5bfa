"""The cascade (the speculation index): conversation SAM, reference SAMs, recycling.

`SpeculationIndex` is one DraftSource over three kinds of members (design record section 7):

1. conversation: an online SamIndex over every committed token (prompt and generated),
   fed by observe();
2. references: up to 8 frozen SamIndexes added with add_reference(token_ids), each walked by
   a cursor over the committed stream;
3. recycling: the Token-Recycling matrix, the fallback (chains of at most 8).

Selection, per suggest(max_tokens): the longest match wins; ties go to the conversation
(recency in the live stream beats a static document), then to the first-added reference.
A match shorter than min_match (2) falls through to recycling. The budget grows with the
match: min(max_tokens, budget_beta * (1 + match_len)) tokens, budget_beta = 2.

Per-source muting: acceptance is inferred at the suggest -> observe seam, as the longest
common prefix of the last draft and the tokens committed next. Each source keeps a rolling
window of its last 64 drafted tokens (accepted or not); when a full window is under 20%
accepted the source is muted for 128 committed tokens, then re-probed with a fresh window.
Muted sources keep observing, so they are in sync when they come back. This is selection
only: what is committed never depends on it.

Worked example: committed stream [5 6 7 8 | 9 | 5 6 7] (observed in any chunks). The
conversation matches [5 6 7] (match_len 3), so suggest(16) returns its continuation for a
budget of 2 * (1 + 3) = 8 tokens: [8 9 5 6 7 8 9 5]. If the model then commits [8 9 4],
observe([8, 9, 4]) credits the conversation with 2 accepted of 8 drafted.
"""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from draftless.sources.recycling import Recycling
from draftless.sources.sam import Cursor, SamIndex, as_token_array

__all__ = ["CascadeOptions", "SourceStats", "SpeculationIndex"]

CONVERSATION = "conversation"
RECYCLING = "recycling"


@dataclass(frozen=True, slots=True)
class CascadeOptions:
    """Knobs of the cascade policy, validated here; a bad one raises ValueError naming it."""

    recycling: bool = True  # keep the Token-Recycling fallback (and ask for top-K rows)
    min_match: int = 2  # tokens; shorter matches fall through to recycling
    budget_beta: int = 2  # draft budget = budget_beta * (1 + match_len) tokens
    window: int = 64  # drafted tokens in each source's rolling acceptance window
    mute_below: float = 0.2  # a full window under this acceptance rate mutes the source
    mute_for: int = 128  # committed tokens a muted source sits out
    max_references: int = 8  # frozen reference documents at once

    def __post_init__(self) -> None:
        if not isinstance(self.recycling, bool):
            raise ValueError(f"recycling must be a bool, got {self.recycling!r}")
        for name, low in (
            ("min_match", 1),
            ("budget_beta", 1),
            ("window", 1),
            ("mute_for", 1),
            ("max_references", 0),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        rate = self.mute_below
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0.0 <= rate <= 1.0:
            raise ValueError(f"mute_below must be a number in [0, 1], got {rate!r}")


@dataclass(frozen=True, slots=True)
class SourceStats:
    """One member of the cascade, as seen by the selection gate."""

    name: str  # "conversation", "reference[i]" or "recycling"
    accepted: int  # drafted tokens that were committed (inferred at the seam)
    drafted: int  # tokens drafted by this source and judged so far
    muted: bool  # muted right now
    times_muted: int
    match_len: int  # current match length in tokens (0 for recycling)


@dataclass(slots=True)
class _Member:
    name: str
    window: deque[int]  # [<= window] 1 = accepted, 0 = rejected, oldest first
    accepted: int = 0
    drafted: int = 0
    times_muted: int = 0
    mute_left: int = 0  # committed tokens until the re-probe; 0 = not muted


@dataclass(slots=True)
class _Reference:
    index: SamIndex
    cursor: Cursor
    member: _Member


@dataclass(slots=True)
class _Pending:
    member: _Member
    draft: list[int]
    matched: int = 0  # draft tokens already seen committed


class SpeculationIndex:
    """The cascade as a DraftSource. See the module docstring for the policy.

    SpeculationIndex(vocab_size, recycling=True, min_match=2, budget_beta=2, window=64,
    mute_below=0.2, mute_for=128, max_references=8).
    """

    def __init__(
        self,
        vocab_size: int,
        *,
        recycling: bool = True,
        min_match: int = 2,
        budget_beta: int = 2,
        window: int = 64,
        mute_below: float = 0.2,
        mute_for: int = 128,
        max_references: int = 8,
    ) -> None:
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
            raise ValueError(f"vocab_size must be a positive int, got {vocab_size!r}")
        self.options = CascadeOptions(
            recycling=recycling,
            min_match=min_match,
            budget_beta=budget_beta,
            window=window,
            mute_below=mute_below,
            mute_for=mute_for,
            max_references=max_references,
        )
        self.vocab_size = vocab_size
        # The decoder computes top-K rows only for recycling; a muted recycling still learns.
        self.wants_topk: bool = recycling
        self._conversation = SamIndex()
        self._conversation_member = self._new_member(CONVERSATION)
        self._references: list[_Reference] = []
        self._recycling = Recycling(vocab_size) if recycling else None
        self._recycling_member = self._new_member(RECYCLING)
        self._pending: _Pending | None = None
        self._last_source: str | None = None

    # -- the DraftSource protocol -------------------------------------------------------

    def select(self) -> str | None:
        """The name of the member suggest() would draft from now, or None; no side effects.

        The decoder keeps one cost gate per member and asks first, so that a member whose
        drafts do not pay is skipped without a suggest (and without blaming it twice).
        """
        opts = self.options
        best: str | None = None
        best_len = opts.min_match - 1
        if self._conversation_member.mute_left == 0 and self._conversation.match_len > best_len:
            best, best_len = CONVERSATION, self._conversation.match_len
        for ref in self._references:
            if ref.member.mute_left == 0 and ref.cursor.match_len > best_len:
                best, best_len = ref.member.name, ref.cursor.match_len
        if best is not None:
            return best
        rec = self._recycling
        if rec is not None and self._recycling_member.mute_left == 0 and rec.would_draft():
            return RECYCLING
        return None

    def suggest(self, max_tokens: int) -> list[int]:
        """A draft of at most max_tokens tokens from the selected source ([] if none)."""
        self._settle()
        self._last_source = None
        if max_tokens <= 0:
            return []
        opts = self.options
        best: _Member | None = None
        best_len = opts.min_match - 1
        if self._conversation_member.mute_left == 0:
            length = self._conversation.match_len
            if length > best_len:
                best, best_len = self._conversation_member, length
        best_ref: _Reference | None = None
        for ref in self._references:
            if ref.member.mute_left == 0:
                length = ref.cursor.match_len
                if length > best_len:
                    best, best_len, best_ref = ref.member, length, ref
        draft: list[int] = []
        if best is not None:
            budget = min(max_tokens, opts.budget_beta * (1 + best_len))
            source = best_ref.cursor if best_ref is not None else self._conversation
            draft = source.draft(budget)
        if not draft and self._recycling is not None and self._recycling_member.mute_left == 0:
            best = self._recycling_member
            draft = self._recycling.suggest(max_tokens)
        if draft and best is not None:
            self._pending = _Pending(best, draft)
            self._last_source = best.name
        return draft

    def observe(self, committed: Sequence[int] | np.ndarray) -> None:
        """Feeds committed tokens to every member, muted or not, and settles the last draft."""
        tokens = as_token_array(committed, limit=self.vocab_size, what="committed token")
        k = tokens.shape[0]
        if k == 0:
            return
        for member in self._members():
            if member.mute_left > 0:
                member.mute_left = max(0, member.mute_left - k)
                if member.mute_left == 0:
                    member.window.clear()  # re-probe with a fresh window
        pending = self._pending
        if pending is not None:
            draft, resolved = pending.draft, False
            for t in tokens.tolist():
                if pending.matched == len(draft) or t != draft[pending.matched]:
                    resolved = True  # the draft was rejected here, or ended before
                    break
                pending.matched += 1
            if resolved or pending.matched == len(draft):
                self._settle()
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
            self._recycling._observe_array(tokens)

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
        self._references.append(_Reference(index, cursor, self._new_member(f"reference[{slot}]")))
        return slot

    def clear_references(self) -> None:
        """Drops every reference document, and the pending draft's accounting."""
        self._references.clear()
        self._pending = None

    @property
    def references(self) -> tuple[SamIndex, ...]:
        """The frozen reference indexes, in the order they were added."""
        return tuple(ref.index for ref in self._references)

    # -- the chat layer's seams -----------------------------------------------------------

    def truncate_pending(self, n: int = 0) -> None:
        """Says that the next observe() carries only n more tokens of the pending draft's step.

        When the chat layer trims a turn at a stop, it commits fewer tokens than the decoder
        did; it calls truncate_pending(n) before observe(trimmed) so that draft tokens past
        the trim are neither credited nor blamed. truncate_pending(0) (or a call with no
        observe to follow, e.g. at the end of a turn) drops whatever is left of the pending
        draft's accounting. Example: draft [a b c d], decoder committed [a b c x], the stop
        ends the turn after b: truncate_pending(2); observe([a, b]) -> 2 of 2 accepted.
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"n must be an int >= 0, got {n!r}")
        pending = self._pending
        if pending is None:
            return
        del pending.draft[pending.matched + n :]
        if pending.matched == len(pending.draft):
            self._settle()

    def reset(self) -> None:
        """A new conversation: empty conversation index, rewound cursors, fresh stats.

        Reference documents stay (their cursors restart); the recycling matrix stays (it is
        knowledge about the model, not about the conversation).
        """
        self._conversation = SamIndex()
        self._conversation_member = self._new_member(CONVERSATION)
        for ref in self._references:
            ref.cursor.reset()
            ref.member = self._new_member(ref.member.name)
        if self._recycling is not None:
            self._recycling.reset()
        self._recycling_member = self._new_member(RECYCLING)
        self._pending = None
        self._last_source = None

    # -- inspection -----------------------------------------------------------------------

    @property
    def conversation(self) -> SamIndex:
        """The conversation index (read it, do not extend it: observe() does)."""
        return self._conversation

    @property
    def recycling(self) -> Recycling | None:
        return self._recycling

    @property
    def last_source(self) -> str | None:
        """Name of the source of the last non-empty suggest(), None if it drafted nothing."""
        return self._last_source

    def stats(self) -> tuple[SourceStats, ...]:
        """Conversation, then references in order, then recycling (if enabled)."""
        rows = [self._stats_of(self._conversation_member, self._conversation.match_len)]
        rows += [self._stats_of(ref.member, ref.cursor.match_len) for ref in self._references]
        if self._recycling is not None:
            rows.append(self._stats_of(self._recycling_member, 0))
        return tuple(rows)

    # -- internals ------------------------------------------------------------------------

    def _new_member(self, name: str) -> _Member:
        return _Member(name, deque(maxlen=self.options.window))

    def _members(self) -> list[_Member]:
        members = [self._conversation_member]
        members += [ref.member for ref in self._references]
        members.append(self._recycling_member)
        return members

    @staticmethod
    def _stats_of(member: _Member, match_len: int) -> SourceStats:
        return SourceStats(
            name=member.name,
            accepted=member.accepted,
            drafted=member.drafted,
            muted=member.mute_left > 0,
            times_muted=member.times_muted,
            match_len=match_len,
        )

    def _settle(self) -> None:
        """Closes the pending draft's accounting: matched tokens accepted, the rest not."""
        pending = self._pending
        if pending is None:
            return
        self._pending = None
        member, accepted, drafted = pending.member, pending.matched, len(pending.draft)
        if drafted == 0:
            return
        member.accepted += accepted
        member.drafted += drafted
        window = member.window
        window.extend([1] * accepted)
        window.extend([0] * (drafted - accepted))
        opts = self.options
        if len(window) == opts.window and sum(window) / opts.window < opts.mute_below:
            member.mute_left = opts.mute_for
            member.times_muted += 1
            window.clear()
