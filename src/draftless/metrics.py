"""The one vocabulary of speculation statistics, shared by the decoder, chat, the CLI's
`--json`, the server and the benchmark.

    step        one forward after the prompt: a verify (carried token + a draft) or a plain
                step (the carried token alone)
    drafted     draft tokens sent to the model
    accepted    draft tokens the model agreed with
    committed   tokens a step added to the stream: accepted + 1 (the correction, or the bonus
                when the whole draft was accepted), or fewer when a stop id ended the step
    shadow      a draft checked against what plain decoding committed, while its gate was off

Per member of the draft source ("conversation", "reference[0]", "recycling", ...) the same
counts; per gate (a member and an evidence bucket, "conversation/9-16") the same counts and
how often it turned off and on; and the histogram of verified draft lengths. `DecodeStats`
supports `-` (this turn's share: after - before) and `+` (a sum over runs).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

_TABLES = ("members", "evidence", "draft_lengths", "resync_gaps")


@dataclass(slots=True)
class MemberStats:
    verifies: int = 0
    drafted: int = 0
    accepted: int = 0
    shadow_checks: int = 0
    gate_off: int = 0  # times its gate turned off
    gate_on: int = 0  # times shadow checks turned it back on

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def _combine(self, other: MemberStats, sign: int) -> MemberStats:
        return MemberStats(
            *(
                getattr(self, f.name) + sign * getattr(other, f.name)
                for f in dataclasses.fields(self)
            )
        )


@dataclass(slots=True)
class DecodeStats:
    steps: int = 0  # forwards after the prompt
    verify_steps: int = 0  # forwards that checked a draft
    plain_steps: int = 0  # forwards of the carried token alone
    committed: int = 0  # tokens committed (every step commits >= 1)
    drafted: int = 0  # draft tokens sent to the model
    accepted: int = 0  # draft tokens the model agreed with
    bonus: int = 0  # verifies whose whole draft was accepted (the last row is free)
    dropped: int = 0  # draft tokens outside the vocabulary, never sent
    shadow_checks: int = 0  # drafts checked against plain output while a gate was off
    gate_off: int = 0  # times a gate turned speculation off
    gate_on: int = 0  # times shadow checks turned it back on
    forward_seconds: float = 0.0  # wall time inside the model's forward
    members: dict[str, MemberStats] = field(default_factory=dict)  # per draft-source member
    evidence: dict[str, MemberStats] = field(default_factory=dict)  # per gate: member/bucket
    draft_lengths: dict[int, int] = field(default_factory=dict)  # verified draft length: count
    # tokens committed between a verify that hit a rejection and the next verify that accepted
    # a draft token: count (how fast drafting re-synchronises after a mismatch)
    resync_gaps: dict[int, int] = field(default_factory=dict)

    @property
    def tokens_per_step(self) -> float:
        return self.committed / self.steps if self.steps else 0.0

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_draft(self) -> float:
        """Draft tokens per verify."""
        return self.drafted / self.verify_steps if self.verify_steps else 0.0

    def member(self, name: str) -> MemberStats:
        """The counts of one member, created on first use."""
        counts = self.members.get(name)
        if counts is None:  # not setdefault: it would build a MemberStats every step
            counts = self.members[name] = MemberStats()
        return counts

    def evidence_of(self, gate: str) -> MemberStats:
        """The counts of one gate (member/bucket), created on first use."""
        counts = self.evidence.get(gate)
        if counts is None:
            counts = self.evidence[gate] = MemberStats()
        return counts

    def copy(self) -> DecodeStats:
        return self._combine(DecodeStats(), 1)

    def __add__(self, other: DecodeStats) -> DecodeStats:
        return self._combine(other, 1)

    def __sub__(self, other: DecodeStats) -> DecodeStats:
        return self._combine(other, -1)

    def _combine(self, other: DecodeStats, sign: int) -> DecodeStats:
        out = DecodeStats()
        for f in dataclasses.fields(self):
            if f.name not in _TABLES:
                setattr(out, f.name, getattr(self, f.name) + sign * getattr(other, f.name))
        for table in ("members", "evidence"):
            mine, theirs = getattr(self, table), getattr(other, table)
            combined = getattr(out, table)
            for name in {**mine, **theirs}:
                counts = mine.get(name, MemberStats())._combine(
                    theirs.get(name, MemberStats()), sign
                )
                if counts != MemberStats():  # a turn in which a member did nothing omits it
                    combined[name] = counts
        for histogram in ("draft_lengths", "resync_gaps"):
            mine, theirs = getattr(self, histogram), getattr(other, histogram)
            combined = getattr(out, histogram)
            for key in {**mine, **theirs}:
                count = mine.get(key, 0) + sign * theirs.get(key, 0)
                if count:
                    combined[key] = count
        return out

    @property
    def verify_share(self) -> float:
        """Share of the steps that verified a draft."""
        return self.verify_steps / self.steps if self.steps else 0.0

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict: every count, the ratios, the members, the gates (member/bucket)
        and the two histograms (keys as strings: JSON has no integer keys)."""
        out: dict[str, Any] = {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in _TABLES
        }
        out["forward_seconds"] = round(self.forward_seconds, 4)
        out["tokens_per_step"] = round(self.tokens_per_step, 4)
        out["acceptance"] = round(self.acceptance, 4)
        out["verify_share"] = round(self.verify_share, 4)
        for table in ("members", "evidence"):
            counts = getattr(self, table)
            out[table] = {name: dataclasses.asdict(m) for name, m in sorted(counts.items())}
        for histogram in ("draft_lengths", "resync_gaps"):
            out[histogram] = {str(k): v for k, v in sorted(getattr(self, histogram).items())}
        return out

    def summary(self) -> str:
        """One line for a terminal."""
        line = (
            f"spec: steps={self.steps} committed={self.committed} "
            f"({self.tokens_per_step:.2f} tok/step) drafted={self.drafted} "
            f"accepted={self.accepted} ({100 * self.acceptance:.0f}% acc) "
            f"gate off={self.gate_off} on={self.gate_on} shadow={self.shadow_checks}"
        )
        if self.members:
            parts = [f"{n} {m.accepted}/{m.drafted}" for n, m in sorted(self.members.items())]
            line += " | sources: " + ", ".join(parts)
        return line
