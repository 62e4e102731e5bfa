"""DecodeStats: the JSON every front end prints, and the +/- that chat turns and bench sums use."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from draftless.metrics import DecodeStats, MemberStats


def _stats(verifies: list[tuple[str, int, int]], plain: int) -> DecodeStats:
    """Stats as the decoder keeps them: (gate, drafted, accepted) per verify, plain steps."""
    s = DecodeStats()
    for gate, drafted, accepted in verifies:
        member = gate.split("/")[0]
        s.steps += 1
        s.verify_steps += 1
        s.drafted += drafted
        s.accepted += accepted
        s.committed += accepted + 1
        s.draft_lengths[drafted] = s.draft_lengths.get(drafted, 0) + 1
        for counts in (s.member(member), s.evidence_of(gate)):
            counts.verifies += 1
            counts.drafted += drafted
            counts.accepted += accepted
    s.steps += plain
    s.plain_steps += plain
    s.committed += plain
    return s


VERIFY = st.tuples(
    st.sampled_from(["conversation/2", "conversation/17+", "reference[0]/9-16", "recycling"]),
    st.integers(1, 64),
).flatmap(lambda gd: st.tuples(st.just(gd[0]), st.just(gd[1]), st.integers(0, gd[1])))


@given(st.lists(VERIFY, max_size=30), st.integers(0, 30))
def test_the_json_has_every_table_and_they_add_up(
    verifies: list[tuple[str, int, int]], plain: int
) -> None:
    s = _stats(verifies, plain)
    out = json.loads(json.dumps(s.to_json()))  # JSON-ready: no int keys, no objects
    assert out["drafted"] == sum(d for _, d, _ in verifies)
    assert sum(g["drafted"] for g in out["evidence"].values()) == out["drafted"]
    assert sum(m["accepted"] for m in out["members"].values()) == out["accepted"]
    assert sum(int(k) * n for k, n in out["draft_lengths"].items()) == out["drafted"]
    assert sum(out["draft_lengths"].values()) == out["verify_steps"] == len(verifies)
    share = len(verifies) / (len(verifies) + plain) if verifies or plain else 0.0
    assert out["verify_share"] == round(share, 4)
    assert set(out["evidence"]) == {g for g, _, _ in verifies}


@given(st.lists(VERIFY, max_size=20), st.lists(VERIFY, max_size=20), st.integers(0, 9))
def test_a_turn_is_the_difference_of_two_totals(
    first: list[tuple[str, int, int]], second: list[tuple[str, int, int]], plain: int
) -> None:
    before = _stats(first, plain)
    after = _stats(first + second, plain + 3)
    turn = after - before
    assert turn.to_json() == _stats(second, 3).to_json()
    assert (before + turn).to_json() == after.to_json()


def test_member_counts_combine_field_by_field() -> None:
    a = MemberStats(verifies=2, drafted=10, accepted=7, shadow_checks=1)
    b = MemberStats(verifies=1, drafted=4, accepted=4, gate_on=1)
    assert a._combine(b, 1) == MemberStats(3, 14, 11, 1, 0, 1)
    assert a._combine(b, 1)._combine(b, -1) == a
