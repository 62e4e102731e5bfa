"""The suffix-automaton (SAM) index: exact longest prior match, recency drafts, O(1) appends.

A `SamIndex` holds an online suffix automaton over a token stream. After every append it
knows the longest suffix of the stream that also occurs *ending strictly before* the last
position (the self-match is excluded: the whole stream trivially matches itself), and where.
The draft is what followed that earlier occurrence.

Worked example: stream [7 1 2 9 1 2]. The longest suffix with an earlier occurrence is
[1 2] (match_len 2), which ended at position 2; the tokens after it are [9 1 2], so
draft(3) == [9, 1, 2]. Past the end of the stream the draft keeps copying as if it were
accepted (LZ77-style): for [5 5 5] the match is [5 5] ending at 1 and draft(4) == [5 5 5 5].

How the self-match exclusion is exact:

* Cursor-before-extend. The match cursor advances with t_i over the automaton of t_0..t_{i-1},
  then the automaton is extended, so a successful transition proves a prior occurrence. The
  cursor is fused with the construction: before the extension it sits at link(last) (the
  longest suffix of t_0..t_{i-1} seen earlier), advancing it with t_i is exactly the
  extension walk up the suffix links to the first state p with a t_i transition, and it
  lands on q = next(p, t_i) with length len(p) + 1. The clone fix-up: when the extension
  splits q, the cursor (length len(p) + 1) moves to the clone. Either way it ends at
  link(cur) of the new state, whose length is the match length.
* The sample discipline. Each state stores one end index of an occurrence of its strings.
  Every write is provably a prior member of the state's end-position set: a new state gets
  i; a clone inherits q's sample (never the current end); the states walked by the
  extension of step i are suffixes of t_0..t_{i-1} and get i - 1. The walk always passes
  link(last), the previous match state, so the recency refresh of a match is deferred one
  step: at step i its sample is read (the draft position) and must not be i itself.

What is guaranteed, and tested against brute force after every append (tests/oracles.py):
match_len is exact; match_end is an end of an earlier occurrence of the matched suffix;
the draft is the continuation after match_end; and when the matched suffix was also the
whole match at its most recent earlier occurrence, match_end *is* that most recent
occurrence (recency: a passage that was copied before is copied from its latest copy).

Frozen mode (reference documents): freeze() forbids appends and lets any number of external
`Cursor`s walk the automaton, each matching some other stream against this one. A cursor's
match is the longest suffix of its stream that occurs in the reference *followed by at least
one token*, and its draft follows the last such occurrence (exact, computed at freeze).

Layout (bytes per token, against a target of ~110 B/token): per state 16 B (len, link,
sample, first edge), one global open-addressing hash table (state, token) -> next state of
12 B slots, an 8 B per-transition edge list (token, next edge) so a state's transitions can
be copied when it is cloned, and the 4 B/token stream. All arrays grow by 1.5x (not 2x:
the slack of a growing index is what separates ~95 from ~120 B/token).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from draftless._jit import njit

__all__ = ["Cursor", "FrozenIndexError", "SamIndex", "as_token_array"]

TOKEN_LIMIT = 2**31 - 1  # token ids live in int32

# columns of the state table st: [n_states_capacity, 4] int32
_LEN = 0  # length of the longest string of the state
_LINK = 1  # suffix link (-1 at the root)
_SAMPLE = 2  # end index of one occurrence (frozen: of the last occurrence with a successor)
_FIRST = 3  # first edge of the state's edge list (-1: none)

# slots of the meta vector: [8] int64
_N_STATES = 0
_N_EDGES = 1
_N_TOKENS = 2
_LAST = 3  # state of the whole stream
_MATCH_STATE = 4  # state of the longest suffix with an earlier occurrence
_MATCH_LEN = 5
_MATCH_END = 6  # end index of that earlier occurrence (-1: no match)

_C1 = 2146121005  # odd multipliers < 2**31: the hash never overflows int64
_C2 = 1540483477
_INITIAL = 64  # initial capacity of every table
_SMALL = 64  # token lists up to this long are validated in plain Python
_INTS = (int, np.integer)  # what a token id may be (bool aside)
_BULK = 4096  # appends at least this long reserve room for their transitions up front
_EDGES_PER_TOKEN = 2  # typical transitions per token (at most 3)


class FrozenIndexError(RuntimeError):
    """An append to a frozen index, or a cursor over an index that can still grow."""


# ----------------------------------------------------------------------------------------
# The compiled core. Plain functions over numpy arrays (numba nopython subset).
# ----------------------------------------------------------------------------------------


@njit
def _slot(ht, state, token):
    """Slot of (state, token) in the hash table, or -(free slot) - 1 when absent."""
    n_slots = ht.shape[0]
    x = np.int64(state) * _C1 + np.int64(token) * _C2
    h = (((x ^ (x >> 29)) & 0xFFFFFFFF) * n_slots) >> 32  # multiply-shift: any table size
    while True:
        s = ht[h, 0]
        if s == state and ht[h, 1] == token:
            return h
        if s == -1:
            return -h - 1
        h += 1
        if h == n_slots:
            h = 0


@njit
def _rehash(ht, n_slots):
    """A copy of the hash table with `n_slots` slots."""
    new = np.full((n_slots, 3), -1, dtype=np.int32)
    for h in range(ht.shape[0]):
        if ht[h, 0] != -1:
            j = -_slot(new, ht[h, 0], ht[h, 1]) - 1
            new[j, 0] = ht[h, 0]
            new[j, 1] = ht[h, 1]
            new[j, 2] = ht[h, 2]
    return new


@njit
def _put(st, ed, ht, n_edges, state, token, dst, sl):
    """Adds the transition state -token-> dst (absent; `sl` is its _slot code).

    `_extend` has made sure of the room: an edge, and a slot at load <= 3/4. Checked anyway:
    a full table raises, never writes past its end.
    """
    if n_edges >= ed.shape[0] or 4 * (n_edges + 1) > 3 * ht.shape[0]:
        raise MemoryError("SamIndex: no room for a transition")
    ed[n_edges, 0] = token
    ed[n_edges, 1] = st[state, _FIRST]
    st[state, _FIRST] = n_edges
    h = -sl - 1
    ht[h, 0] = state
    ht[h, 1] = token
    ht[h, 2] = dst


@njit
def _new_transitions(st, ed, ht, last, t):
    """At most how many transitions appending `t` after the state `last` adds (reads only:
    exact but for a clone of a state the walk gives a transition on `t` too)."""
    need = 0
    p = last
    sl = -1
    while p != -1:
        sl = _slot(ht, p, t)
        if sl >= 0:
            break
        need += 1
        p = st[p, _LINK]
    if p != -1:
        q = ht[sl, 2]
        if st[p, _LEN] + 1 != st[q, _LEN]:  # a clone: it copies q's transitions
            need += 1  # q may be on the walk, and gain its transition on t before the copy
            e = st[q, _FIRST]
            while e != -1:
                need += 1
                e = ed[e, 1]
    return need


@njit
def _extend(st, ed, ht, stream, meta, tokens):
    """Appends `tokens` to the automaton, in place, as far as the edge pool and the hash
    table have room (load <= 3/4); returns how many were appended.

    Each token's transitions are counted before any is added, so a stop leaves a whole
    automaton of the tokens before it; the caller grows the tables and calls again with the
    rest. An int comes back, not regrown tables: arrays handed back to Python cost the
    decoder's step ~10 us, right after a forward (docs/bench/avx2/s33). The caller reserves
    room in `st` (2 states per token) and `stream`; `meta` is updated in place once, at the
    end, so a failure half-way leaves it describing the old stream.
    """
    n_states = meta[_N_STATES]
    n_edges = meta[_N_EDGES]
    n = meta[_N_TOKENS]
    last = meta[_LAST]
    match = meta[_MATCH_STATE]
    match_len = meta[_MATCH_LEN]
    match_end = meta[_MATCH_END]
    done = tokens.shape[0]
    for k in range(tokens.shape[0]):
        t = tokens[k]
        need = _new_transitions(st, ed, ht, last, t)
        if n_edges + need > ed.shape[0] or 4 * (n_edges + need) > 3 * ht.shape[0]:
            done = k  # no room for this token's transitions: the caller grows the tables
            break
        i = n
        stream[i] = t
        n += 1
        cur = n_states
        n_states += 1
        st[cur, _LEN] = st[last, _LEN] + 1
        st[cur, _LINK] = 0
        st[cur, _SAMPLE] = i
        st[cur, _FIRST] = -1
        # The walk = the cursor advancing with t over the automaton of stream[:i].
        p = last
        sl = -1
        while p != -1:
            sl = _slot(ht, p, t)
            if sl >= 0:
                break
            _put(st, ed, ht, n_edges, p, t, cur, sl)
            n_edges += 1
            st[p, _SAMPLE] = i - 1  # p is a suffix of stream[:i]: i - 1 is a prior end
            p = st[p, _LINK]
        if p == -1:
            match = 0
            match_len = 0
            match_end = -1
            last = cur
            continue
        q = ht[sl, 2]
        st[p, _SAMPLE] = i - 1
        if st[p, _LEN] + 1 == st[q, _LEN]:
            match = q
        else:
            clone = n_states
            n_states += 1
            st[clone, _LEN] = st[p, _LEN] + 1
            st[clone, _LINK] = st[q, _LINK]
            st[clone, _SAMPLE] = st[q, _SAMPLE]  # inherited, never the current end
            st[clone, _FIRST] = -1
            e = st[q, _FIRST]
            while e != -1:
                tok = ed[e, 0]
                dst = ht[_slot(ht, q, tok), 2]
                _put(st, ed, ht, n_edges, clone, tok, dst, _slot(ht, clone, tok))
                n_edges += 1
                e = ed[e, 1]
            while p != -1:
                sl = _slot(ht, p, t)
                if ht[sl, 2] != q:
                    break
                ht[sl, 2] = clone
                st[p, _SAMPLE] = i - 1
                p = st[p, _LINK]
            st[q, _LINK] = clone
            match = clone  # the clone fix-up: the cursor moves to the clone
        st[cur, _LINK] = match
        match_len = st[match, _LEN]
        match_end = st[match, _SAMPLE]  # a prior end; the next walk stamps this state with i
        last = cur
    meta[_N_STATES] = n_states
    meta[_N_EDGES] = n_edges
    meta[_N_TOKENS] = n
    meta[_LAST] = last
    meta[_MATCH_STATE] = match
    meta[_MATCH_LEN] = match_len
    meta[_MATCH_END] = match_end
    return done


@njit
def _advance(st, ht, tokens, state, length):
    """Moves a cursor (state, length) over `tokens`: longest suffix that is a substring."""
    for k in range(tokens.shape[0]):
        t = tokens[k]
        while True:
            sl = _slot(ht, state, t)
            if sl >= 0:
                state = ht[sl, 2]
                length += 1
                break
            if state == 0:
                length = 0
                break
            state = st[state, _LINK]
            length = st[state, _LEN]
    return state, length


@njit
def _last_ends(st, n_states, n):
    """For every state: the largest end of its occurrences that is < n - 1, or -1."""
    best = np.full(n_states, -1, dtype=np.int32)
    # The prefix stream[:i + 1] lives in the state created by step i, of length i + 1; the
    # clone of step i is shorter (<= i), so the prefix states are found in creation order.
    expected = 1
    for v in range(1, n_states):
        if st[v, _LEN] == expected:
            if expected < n:  # the end n - 1 has no successor: left out
                best[v] = expected - 1
            expected += 1
    count = np.zeros(n + 2, dtype=np.int64)  # counting sort of the states by length
    for v in range(n_states):
        count[st[v, _LEN] + 1] += 1
    for length in range(1, n + 2):
        count[length] += count[length - 1]
    order = np.empty(n_states, dtype=np.int32)
    for v in range(n_states):
        order[count[st[v, _LEN]]] = v
        count[st[v, _LEN]] += 1
    for k in range(n_states - 1, 0, -1):  # longest first: push each max up its suffix link
        v = order[k]
        parent = st[v, _LINK]
        if best[v] > best[parent]:
            best[parent] = best[v]
    return best


# ----------------------------------------------------------------------------------------
# The Python facade.
# ----------------------------------------------------------------------------------------


def as_token_array(
    token_ids: Sequence[int] | np.ndarray,
    *,
    limit: int = TOKEN_LIMIT,
    what: str = "token",
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Validated token ids as a contiguous int32 array [n].

    `out` (int32 [m]): a few Python ints are copied into out[:n] when they fit, instead of a
    new array (the decoder's step, right after a forward, when allocating one is cold work);
    the caller must not keep the result past its next use of `out`.
    Raises ValueError naming the first id outside [0, limit) and its position.
    """
    if isinstance(token_ids, list | tuple) and len(token_ids) <= _SMALL:
        # The decoder's hot path: a few Python ints. Checked in Python, no numpy reductions.
        for pos, t in enumerate(token_ids):
            if not isinstance(t, _INTS) or isinstance(t, bool):
                raise ValueError(f"{what} ids must be integers, got {t!r} at position {pos}")
            if t < 0 or t >= limit:
                raise ValueError(f"{what} id {t} at position {pos} is out of range [0, {limit})")
        if out is None or len(token_ids) > out.shape[0]:
            return np.array(token_ids, dtype=np.int32)
        for pos, t in enumerate(token_ids):
            out[pos] = t
        return out[: len(token_ids)]
    try:
        arr = np.asarray(token_ids)
    except OverflowError as exc:
        raise ValueError(f"{what} ids must fit in [0, {limit}): {exc}") from None
    if arr.ndim != 1:
        raise ValueError(f"{what} ids must be a 1-D sequence, got shape {arr.shape}")
    if arr.size == 0:
        return np.empty(0, dtype=np.int32)
    if arr.dtype.kind not in "iu":
        raise ValueError(f"{what} ids must be integers, got dtype {arr.dtype}")
    if arr.size <= _SMALL:
        values = arr.tolist()
        in_range = min(values) >= 0 and max(values) < limit
    else:
        in_range = arr.min() >= 0 and arr.max() < limit
    if not in_range:
        pos = int(np.flatnonzero((arr < 0) | (arr >= limit))[0])
        raise ValueError(
            f"{what} id {int(arr[pos])} at position {pos} is out of range [0, {limit})"
        )
    out = np.ascontiguousarray(arr, dtype=np.int32)
    return out if out.flags.writeable else out.copy()  # one compiled signature: writable


class SamIndex:
    """An online suffix automaton over a token stream; see the module docstring.

    Example: idx = SamIndex(); idx.extend([7, 1, 2, 9, 1, 2]);
    idx.match_len == 2; idx.match_end == 2; idx.draft(3) == [9, 1, 2].
    """

    def __init__(self) -> None:
        self._st = np.empty((_INITIAL, 4), dtype=np.int32)  # [state capacity, 4]
        self._st[0] = (0, -1, -1, -1)  # the root: the empty string
        self._ed = np.empty((_INITIAL, 2), dtype=np.int32)  # [edge capacity, (token, next)]
        self._ht = np.full((_INITIAL, 3), -1, dtype=np.int32)  # [slots, (state, token, dst)]
        self._stream = np.empty(_INITIAL, dtype=np.int32)  # [token capacity]
        self._meta = np.zeros(8, dtype=np.int64)
        self._meta[_N_STATES] = 1
        self._meta[_MATCH_END] = -1
        self._frozen = False
        self._poisoned = False

    @classmethod
    def frozen_from(cls, token_ids: Sequence[int] | np.ndarray) -> SamIndex:
        """A frozen index over `token_ids` (a reference document), ready for cursors."""
        index = cls()
        index.extend(token_ids)
        index.freeze()
        return index

    # -- appending ----------------------------------------------------------------------

    def extend(self, token_ids: Sequence[int] | np.ndarray) -> None:
        """Appends tokens (ids in [0, 2**31 - 1)). O(1) amortized per token.

        Raises FrozenIndexError once frozen and ValueError on a bad id (nothing appended).
        If an append fails half-way (e.g. MemoryError) the index is poisoned: the error
        propagates once, then every query answers "no match" and appends are ignored.
        """
        if self._frozen:
            raise FrozenIndexError("cannot append to a frozen SamIndex")
        self._extend_array(as_token_array(token_ids))

    def _extend_array(self, tokens: np.ndarray) -> None:
        """extend() for an already validated int32 array [k]."""
        k = tokens.shape[0]
        if self._poisoned or k == 0:
            return
        try:
            counts = self._meta.tolist()  # one read of the counters
            n, n_states = counts[_N_TOKENS], counts[_N_STATES]
            if self._stream.shape[0] < n + k:
                self._stream = _reserve(self._stream, n + k)
            if self._st.shape[0] < n_states + 2 * k:
                self._st = _reserve(self._st, n_states + 2 * k)
            if k >= _BULK:  # a document: size the transitions once instead of regrowing
                edges = counts[_N_EDGES] + _EDGES_PER_TOKEN * k
                self._ed = _reserve(self._ed, edges)
                if 4 * edges > 3 * self._ht.shape[0]:
                    self._ht = _rehash(self._ht, 4 * edges // 3 + 1)
            done = _extend(self._st, self._ed, self._ht, self._stream, self._meta, tokens)
            while done < k:  # out of room for a token's transitions: grow by 1.5x, go on
                self._ed = _reserve(self._ed, self._ed.shape[0] * 3 // 2)
                self._ht = _rehash(self._ht, self._ht.shape[0] * 3 // 2)
                rest = tokens[done:]
                done += _extend(self._st, self._ed, self._ht, self._stream, self._meta, rest)
        except BaseException:
            self._poisoned = True
            raise

    def freeze(self) -> None:
        """Forbids appends, trims the tables and enables cursors. Idempotent.

        Each state's sample becomes the last end of its occurrences that has a successor
        (exact, O(n)), and the edge lists go: a frozen index never clones a state.
        """
        if self._frozen:
            return
        n = self.n_tokens
        n_states = self.n_states
        if not self._poisoned:
            last_ends = _last_ends(self._st, n_states, n)
            st = self._st[:n_states].copy()
            st[:, _SAMPLE] = last_ends
            self._st = st
            self._ed = np.empty((0, 2), dtype=np.int32)  # only clones need the edge lists
            self._stream = self._stream[:n].copy()
        self._frozen = True

    def cursor(self) -> Cursor:
        """A new external cursor at the empty match. The index must be frozen."""
        if not self._frozen:
            raise FrozenIndexError("cursors need a frozen SamIndex (call freeze() first)")
        return Cursor(self)

    # -- the internal match: the stream against its own past ---------------------------

    @property
    def match_len(self) -> int:
        """Length of the longest suffix of the stream that also ends before its last token."""
        return 0 if self._poisoned else int(self._meta[_MATCH_LEN])

    @property
    def match_end(self) -> int:
        """End index of the earlier occurrence the draft follows; -1 when match_len == 0."""
        return -1 if self._poisoned or self.match_len == 0 else int(self._meta[_MATCH_END])

    def draft(self, max_tokens: int) -> list[int]:
        """Up to max_tokens tokens that followed the matched occurrence; [] without a match.

        Past the end of the stream the copy continues over the draft itself, so a match
        always drafts exactly max_tokens tokens: draft[k] = (stream + draft)[match_end + 1 + k].
        """
        if self._poisoned or max_tokens <= 0:
            return []
        meta = self._meta.tolist()  # asked every step: one read of the counters
        end = meta[_MATCH_END]
        if meta[_MATCH_LEN] == 0 or end < 0:
            return []
        period = meta[_N_TOKENS] - 1 - end  # >= 1: the occurrence ends before the last token
        seg = self._stream[end + 1 : end + 1 + min(period, max_tokens)].tolist()
        if max_tokens <= period:
            return seg
        return (seg * -(-max_tokens // period))[:max_tokens]

    # -- inspection ---------------------------------------------------------------------

    @property
    def frozen(self) -> bool:
        return self._frozen

    @property
    def poisoned(self) -> bool:
        """True after a failed append: queries return no match forever."""
        return self._poisoned

    @property
    def n_tokens(self) -> int:
        return int(self._meta[_N_TOKENS])

    def __len__(self) -> int:
        return self.n_tokens

    @property
    def tokens(self) -> np.ndarray:
        """The indexed stream, a read-only int32 view [n_tokens]."""
        view = self._stream[: self.n_tokens]
        view.flags.writeable = False
        return view

    @property
    def n_states(self) -> int:
        """States, the root included (<= 2 n + 1)."""
        return int(self._meta[_N_STATES])

    @property
    def n_transitions(self) -> int:
        """Transitions (<= 3 n)."""
        return int(self._meta[_N_EDGES])

    @property
    def nbytes(self) -> int:
        """Bytes held by the index's arrays (allocated capacity, not just the used part)."""
        arrays = (self._st, self._ed, self._ht, self._stream, self._meta)
        return sum(a.nbytes for a in arrays)

    def check_integrity(self, *, deep: bool = False) -> None:
        """Raises RuntimeError naming the first broken invariant of the automaton.

        deep=True also re-reads every state's sample occurrence from the root (O(n^2) worst
        case: for tests on small streams).
        """
        n, n_states, n_edges = self.n_tokens, self.n_states, self.n_transitions
        st = self._st[:n_states]
        lens, links, samples = st[:, _LEN], st[:, _LINK], st[:, _SAMPLE]

        def fail(what: str) -> None:
            raise RuntimeError(f"SAM integrity: {what}")

        if n_states > 2 * n + 1:
            fail(f"{n_states} states > 2n + 1 for n = {n}")
        if n_edges > 3 * n:
            fail(f"{n_edges} transitions > 3n for n = {n}")
        if lens[0] != 0 or links[0] != -1:
            fail("the root is not (len 0, link -1)")
        if n_states > 1:
            child_links = links[1:]
            if child_links.min() < 0 or child_links.max() >= n_states:
                fail("a suffix link points outside the states")
            if np.any(lens[child_links] >= lens[1:]):
                fail("a suffix link does not shorten the state")
            if lens.max() > n or int(lens[self._meta[_LAST]]) != n:
                fail("the last state is not the whole stream")
            bad = (samples[1:] < 0) | (samples[1:] >= n)
            if self._frozen:  # only the last state may lack an occurrence with a successor
                bad &= np.arange(1, n_states) != self._meta[_LAST]
            if np.any(bad):
                fail(f"state {int(np.flatnonzero(bad)[0]) + 1} has no valid sample")
        used = self._ht[self._ht[:, 0] != -1]
        if used.shape[0] != n_edges:
            fail(f"{used.shape[0]} hash entries for {n_edges} transitions")
        if n_edges:
            if used[:, 0].max() >= n_states or used[:, 2].min() < 1 or used[:, 2].max() >= n_states:
                fail("a transition leaves the states")
            if np.any(lens[used[:, 2]] < lens[used[:, 0]] + 1):
                fail("a transition does not lengthen its source")
        if not self._frozen:  # a frozen index has dropped its edge lists
            listed = 0
            for v in range(n_states):
                e = int(st[v, _FIRST])
                while e != -1:
                    listed += 1
                    if listed > n_edges or _slot(self._ht, v, int(self._ed[e, 0])) < 0:
                        fail(f"the edge list of state {v} disagrees with the hash table")
                    e = int(self._ed[e, 1])
            if listed != n_edges:
                fail(f"edge lists hold {listed} of {n_edges} transitions")
        if deep:
            stream = self._stream[:n]
            for v in range(1, n_states):
                end, length = int(samples[v]), int(lens[v])
                if end < 0:
                    continue
                if end + 1 < length:
                    fail(f"state {v}: sample {end} is too early for length {length}")
                got = _advance(st, self._ht, stream[end + 1 - length : end + 1], 0, 0)
                if (int(got[0]), int(got[1])) != (v, length):
                    fail(f"state {v}: its sample occurrence does not read back to it")


class Cursor:
    """A match cursor over a frozen SamIndex, advanced by another stream.

    match_len is the longest suffix of the cursor's stream that occurs in the index followed
    by at least one token; draft follows the last such occurrence.

    Example: ref = SamIndex.frozen_from([4, 1, 2, 3, 1, 2, 8]); c = ref.cursor();
    c.advance([9, 1, 2]); c.match_len == 2; c.match_end == 5; c.draft(4) == [8].
    """

    def __init__(self, index: SamIndex) -> None:
        self._index = index
        self._state = 0
        self._len = 0

    @property
    def index(self) -> SamIndex:
        return self._index

    def reset(self) -> None:
        """Back to the empty match (a new stream)."""
        self._state = 0
        self._len = 0

    def advance(self, token_ids: Sequence[int] | np.ndarray) -> None:
        """Feeds tokens appended to the cursor's stream."""
        self._advance_array(as_token_array(token_ids))

    def _advance_array(self, tokens: np.ndarray) -> None:
        """advance() for an already validated int32 array [k]."""
        index = self._index
        if tokens.shape[0] == 0 or index._poisoned:
            return
        state, length = _advance(index._st, index._ht, tokens, self._state, self._len)
        self._state, self._len = int(state), int(length)

    def _effective(self) -> tuple[int, int]:
        """(state, length) of the match, skipping the occurrence at the document's end."""
        index = self._index
        if index._poisoned:
            return 0, 0
        if self._state == int(index._meta[_LAST]) and self._state != 0:
            parent = int(index._st[self._state, _LINK])
            return parent, int(index._st[parent, _LEN])
        return self._state, self._len

    @property
    def match_len(self) -> int:
        return self._effective()[1]

    @property
    def match_end(self) -> int:
        """End index, in the index's stream, of the occurrence the draft follows; -1 if none."""
        state, length = self._effective()
        return -1 if length == 0 else int(self._index._st[state, _SAMPLE])

    def draft(self, max_tokens: int) -> list[int]:
        """Up to max_tokens tokens of the document after the matched occurrence (>= 1 if any)."""
        end = self.match_end
        if end < 0 or max_tokens <= 0:
            return []
        return self._index._stream[end + 1 : end + 1 + max_tokens].tolist()


def _reserve(a: np.ndarray, need: int) -> np.ndarray:
    """`a`, or a copy grown by 1.5x, with at least `need` rows."""
    if a.shape[0] >= need:
        return a
    grown = np.empty((max(a.shape[0] * 3 // 2, need), *a.shape[1:]), dtype=a.dtype)
    grown[: a.shape[0]] = a
    return grown
