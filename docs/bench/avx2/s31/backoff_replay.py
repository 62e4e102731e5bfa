"""Scratch (session 31): would drafting less while every gate is off take the idle decoder's
drafting cost (~100 us a step on SmolLM2, idle_overhead.py) out of free-form, and what would
it cost the gate's decisions?

    PYTHONPATH=src python docs/bench/avx2/s31/backoff_replay.py /tmp/q15-streams.json \
        docs/bench/avx2/s30-lockstep/q15-2t-table.json

The rule replayed: while every gate made is off, propose only every `stride`-th step, stride =
min(8, 2 ** (failing shadow checks in a row // K)); a passing check or a gate on resets the
count. Per K: the share of steps on which no draft was made, per family, and the modeled
speedups beside the rule-free replay (as floor_variants.py scores them).
"""

import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "benchmarks"))

import gate_sim

import draftless.decoder as D
from draftless.costs import CostTable
from draftless.gate import GateState

FREE = ("free-form", "held-free", "held-out")
DRAFT, CHECK = D.SpeculativeDecoder._draft, D.SpeculativeDecoder._check_shadows


def install(k: int | None) -> None:
    D.SpeculativeDecoder._draft, D.SpeculativeDecoder._check_shadows = DRAFT, CHECK
    if k is None:
        return

    def check(self):
        waiting = {id(s): s for s in self._shadows}
        CHECK(self)
        left = {id(s) for s in self._shadows}
        for key, shadow in waiting.items():
            if key in left:
                continue
            last = shadow.gate._shadow[-1] if shadow.gate._shadow else None
            passed = last is not None and last.committed >= 1.1 * last.cost
            on = passed or shadow.gate.allows()
            self._streak = 0 if on else getattr(self, "_streak", 0) + 1

    def draft(self, room, stop_ids=frozenset()):
        gates = self.gates
        if gates and all(g.state is GateState.OFF for g in gates.values()):
            stride = min(8, 2 ** (getattr(self, "_streak", 0) // k))
            self._tick = getattr(self, "_tick", 0) + 1
            if stride > 1 and self._tick % stride:
                self._skipped = getattr(self, "_skipped", 0) + 1
                return None, None
        return DRAFT(self, room, stop_ids)

    D.SpeculativeDecoder._draft, D.SpeculativeDecoder._check_shadows = draft, check


def main() -> None:
    data = json.loads(Path(sys.argv[1]).read_text())
    spec = json.loads(Path(sys.argv[2]).read_text())
    table = CostTable(tuple(spec["ks"]), tuple(spec["costs"]))
    made: list = []
    stream = D.SpeculativeDecoder.stream

    def kept(self, n, stops=None):
        yield from stream(self, n, stops)
        made.append(self)

    D.SpeculativeDecoder.stream = kept
    for k in (None, 4, 8, 16):
        install(k)
        speedups: dict[str, list[float]] = {}
        skipped: dict[str, list[int]] = {}
        for key, entry in data["streams"].items():
            family = key.split("/")[0]
            family = "free" if family in FREE else family
            row = gate_sim.replay_one(entry, data["vocab_size"], table, table)
            speedups.setdefault(family, []).append(row["modeled_speedup"])
            dec = made.pop()
            counts = skipped.setdefault(family, [0, 0])
            counts[0] += getattr(dec, "_skipped", 0)
            counts[1] += dec.stats.steps
        free = speedups["free"]
        gmean = {f: math.exp(statistics.mean(math.log(v) for v in s)) for f, s in speedups.items()}
        no_draft = {f: 100 * s / n for f, (s, n) in skipped.items()}
        print(
            f"K={k}: free gmean {gmean['free']:.4f} worst {min(free):.3f} "
            f"<0.98 {sum(v < 0.98 for v in free)}, no draft on {no_draft['free']:.0f}% of its steps"
            " | "
            + " ".join(
                f"{f[:9]} {gmean[f]:.3f} ({no_draft[f]:.0f}%)" for f in sorted(gmean) if f != "free"
            )
        )


if __name__ == "__main__":
    main()
