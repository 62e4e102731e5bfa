"""Edits learned from the stream: a copy that leaves its source and rejoins it.

A model that rewrites a file with a rename copies the file and, at every occurrence of the old
name, writes the new one. A suffix automaton drafts the old name there (the source says so),
the verify rejects it, and the match restarts from nothing. But where the stream left the
source and where it rejoined it says what the edit was: the source's tokens `old` were written
as `new`. `EditLearner` learns such substitutions from the stream and applies them to later
drafts, so the next occurrence is drafted as the model will write it.

    learner.apply(tokens) -> (tokens, spans)   later drafts, each learned `old` replaced by `new`
    learner.expect(at, tokens, match_len, spans)  what the proposal at stream position `at` says
                                                  comes next (after apply)
    learner.observe(at, committed)             tokens committed at positions at, at + 1, ...

Worked example (token ids): the source holds `1 2 X 3 4 5 6 7 8`; the stream has copied
`1 2` and the draft from a match of 4 or more tokens expects `X 3 4 5 6 7 8`. The model
writes `Y Z 3 4 5 6 7 8`: it left the source at X and rejoined it at 3, after REJOIN tokens
the same, so the learner learns (X,) -> (Y, Z). A later draft `9 X 3` becomes `9 Y Z 3`.

Only the evidence decides, never a guess about the text: an edit is learned from a draft
backed by a match of MIN_MATCH tokens or more, whose source the stream followed again for
REJOIN tokens within MAX_EDIT tokens on either side. A substitution stops being applied once
the stream has gone against it more often than with it (a number that changed once, a word a
paraphrase swapped): each time costs one rejected draft, and decoding stays lossless whatever
a draft says (the decoder verifies every token).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

REJOIN = 6  # tokens of the source the stream follows again after an edit, to learn it
MAX_EDIT = 8  # tokens of an edit at most, on the source's side and on the stream's
MIN_MATCH = 4  # tokens of match behind a draft whose departure can teach an edit
EXPECT = MAX_EDIT + REJOIN + 1  # tokens past a draft the learner reads, from a departure on
MAX_EDITS = 64  # substitutions kept at once (the oldest learned goes first)


@dataclass(slots=True)
class _Substitution:
    new: tuple[int, ...]
    held: int = 0  # times the stream wrote `new` where a draft had it
    broken: int = 0  # times the stream went against it inside the substituted tokens

    @property
    def trusted(self) -> bool:
        return self.broken <= self.held


@dataclass(slots=True)
class _Span:
    """Where apply() put `new` in a proposal: stream positions [start, start + len(new))."""

    start: int
    old: tuple[int, ...]
    new: tuple[int, ...]


class EditLearner:
    """Substitutions learned from where the stream leaves a long match and rejoins it."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget every substitution and departure (a new conversation)."""
        self._subs: dict[tuple[int, ...], _Substitution] = {}
        self._first: dict[int, list[tuple[int, ...]]] = {}  # old[0] -> olds, for apply()
        self._expected: tuple[int, list[int], int, list[_Span]] | None = None
        self._pending: list[tuple[int, list[int]]] = []  # (departure position, source tokens)
        self._recent: list[int] = []  # committed tokens from position _base on
        self._base = 0
        self.learned = 0  # substitutions learned (evicted and distrusted ones included)
        self.held = 0  # proposals whose substituted span the stream then wrote as drafted
        self.broken = 0  # proposals whose substituted span the stream went against

    def stats(self) -> dict[str, int]:
        """Counts since the last reset(): substitutions learned, in use now, and the proposals
        whose substituted span the stream then wrote as drafted (held) or went against
        (broken). A span reaches several proposals (each reads EXPECT tokens ahead), so held
        and broken count checks, not sites."""
        in_use = sum(1 for s in self._subs.values() if s.trusted)
        return {"learned": self.learned, "in_use": in_use, "held": self.held, "broken": self.broken}

    @property
    def substitutions(self) -> dict[tuple[int, ...], tuple[int, ...]]:
        """old -> new for every substitution apply() uses now."""
        return {old: s.new for old, s in self._subs.items() if s.trusted}

    # -- drafting ----------------------------------------------------------------------
    def apply(self, tokens: Sequence[int], at: int = 0) -> tuple[list[int], list[_Span]]:
        """`tokens` (a draft that starts at stream position `at`) with every learned `old`
        replaced by its `new`, left to right, and where each replacement landed. A draft
        whose last tokens may be the start of an `old` ends before them, so a longer draft
        from the same source starts with a shorter one (the source protocol's promise)."""
        first = self._first
        seq = list(map(int, tokens))
        if not first or first.keys().isdisjoint(seq):  # the usual draft: nothing to replace
            return seq, []
        # Only where a learned `old` starts is there anything to decide; the tokens between
        # are copied as slices (asked every step: no Python work per draft token).
        where = sorted(j for head in first.keys() & set(seq) for j in _positions(seq, head))
        out: list[int] = []
        spans: list[_Span] = []
        k = 0  # seq[:k] is decided
        for j in where:
            if j < k:
                continue  # inside a span already replaced
            for old in first[seq[j]]:
                sub = self._subs[old]
                if not sub.trusted:
                    continue
                here = tuple(seq[j : j + len(old)])
                if here == old:
                    out.extend(seq[k:j])
                    spans.append(_Span(at + len(out), old, sub.new))
                    out.extend(sub.new)
                    k = j + len(old)
                    break
                if len(here) < len(old) and old[: len(here)] == here:
                    out.extend(seq[k:j])
                    return out, spans  # cut where a longer draft could substitute
        out.extend(seq[k:])
        return out, spans

    def expect(self, at: int, tokens: list[int], match_len: int, spans: list[_Span]) -> None:
        """The proposal made at stream position `at`: the tokens it says come next (after
        apply(); the draft and EXPECT more, so a departure anywhere in a verified draft is
        seen with what follows it; kept, not copied), the match behind them, and where
        apply() changed them."""
        self._expected = (at, tokens, match_len, spans)

    # -- learning ----------------------------------------------------------------------
    def observe(self, at: int, committed: Sequence[int]) -> None:
        """Tokens committed at stream positions at, at + 1, ... (Python ints)."""
        if not committed:
            return
        if not self._pending:
            self._recent.clear()
            self._base = at
        elif at != self._base + len(self._recent):  # a gap: the stream was cut or restarted
            self._pending.clear()
            self._recent.clear()
            self._base = at
        self._recent.extend(committed)
        expected, self._expected = self._expected, None
        if expected is not None and expected[0] == at:
            self._check(at, committed, *expected[1:])
        if self._pending:
            self._settle()

    def _check(
        self, at: int, committed: Sequence[int], tokens: list[int], match_len: int, spans: list
    ) -> None:
        """Compares a proposal with what was committed after it: a departure from a long
        match starts a pending edit; substituted tokens count for or against their edit."""
        made = list(committed[: len(tokens)])
        k = next((i for i, (a, b) in enumerate(zip(made, tokens, strict=False)) if a != b), None)
        inside = False  # the departure is inside substituted tokens: the source never said them
        for span in spans:
            sub = self._subs.get(span.old)
            start, end = span.start - at, span.start - at + len(span.new)
            hit = k is not None and (start <= k < end or k == start == end)  # == : a deletion
            inside = inside or hit
            if sub is None or sub.new != span.new:
                continue
            if hit:
                sub.broken += 1  # the stream went against the substitution inside it
                self.broken += 1
            elif end <= (len(made) if k is None else k):  # all of it committed as drafted
                sub.held += 1
                self.held += 1
        if k is None or inside or match_len < MIN_MATCH or len(tokens) - k < REJOIN + 1:
            return
        if not self._pending:  # keep the stream from the departure on
            self._recent = self._recent[at + k - self._base :]
            self._base = at + k
        self._pending.append((at + k, tokens[k : k + EXPECT]))

    def _settle(self) -> None:
        """Each pending departure whose window the stream has filled: the shortest edit
        (source tokens i >= 1 written as stream tokens j >= 0) after which the stream
        follows the source for REJOIN tokens, learned as a substitution."""
        waiting = []
        end = self._base + len(self._recent)
        for p, source in self._pending:
            if end < p + MAX_EDIT + REJOIN:
                waiting.append((p, source))
                continue
            stream = self._recent[p - self._base : p - self._base + MAX_EDIT + REJOIN]
            best: tuple[int, int] | None = None
            for i in range(1, min(MAX_EDIT, len(source) - REJOIN) + 1):
                for j in range(MAX_EDIT + 1):
                    if (best is None or i + j < sum(best)) and stream[j : j + REJOIN] == source[
                        i : i + REJOIN
                    ]:
                        best = (i, j)
            if best is not None:
                self._learn(tuple(source[: best[0]]), tuple(stream[: best[1]]))
        self._pending = waiting
        if waiting:  # drop what no pending departure needs
            drop = waiting[0][0] - self._base
            del self._recent[:drop]
            self._base += drop

    def _learn(self, old: tuple[int, ...], new: tuple[int, ...]) -> None:
        if old == new or old in self._subs:
            return
        if len(self._subs) >= MAX_EDITS:
            first = next(iter(self._subs))
            del self._subs[first]
            self._first[first[0]].remove(first)
            if not self._first[first[0]]:
                del self._first[first[0]]
        self._subs[old] = _Substitution(new)
        self._first.setdefault(old[0], []).append(old)
        self.learned += 1


def _positions(seq: list[int], value: int) -> Iterator[int]:
    """Every index of `value` in `seq`, in order (list.index: the scan runs in C)."""
    j = -1
    while True:
        try:
            j = seq.index(value, j + 1)
        except ValueError:
            return
        yield j
