"""Scratch (session 31): can a gate rule buy the 1.5B's free-form floor without the retrieval
gains? Each variant replays the recorded 1.5B streams (`benchmarks/gate_sim.py`) with one rule
changed, and is scored on the three free-form families (geometric mean, worst, prompts under
0.98 and 0.99) beside each retrieval family's geometric mean.

    zcat docs/bench/avx512/edits/q15-streams-edits.json.gz > /tmp/q15-streams.json
    PYTHONPATH=src python docs/bench/avx2/s31/floor_variants.py /tmp/q15-streams.json \
        docs/bench/avx2/s30-lockstep/q15-2t-table.json

Variants:
- trial=T: after a shadow turn-on, any of its first T verifies that commits less than it cost
  turns the gate off (as a gate started on its prior is after its first loss);
- risk=S,P: a gate on its prior alone (a prior of P or less) starts shadow-checking instead
  when its verify, lost, would cost more than S x the tokens committed so far plus what the
  verifies have gained so far (a floor by construction for the prior's bets);
- minmatch=M: no draft from a match shorter than M tokens on a steep table;
- cap=N: a gate on its prior drafts N tokens at most.
"""

import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "benchmarks"))

import gate_sim

import draftless.decoder as D
import draftless.gate as G
from draftless.costs import CostTable

FREE = ("free-form", "held-free", "held-out")
JUDGE, ACCOUNT, VERIFY, BUDGET = (
    D.SpeculativeDecoder._judge,
    D.SpeculativeDecoder._account,
    G.CostGate.record_verify,
    G.CostGate.budget,
)


def trial(t: int) -> None:
    def record_verify(self, k, drafted, accepted, committed, seconds=None):
        on_trial = 0 <= self._since_on < t
        VERIFY(self, k, drafted, accepted, committed, seconds)
        if on_trial and self.state is G.GateState.ON and committed < self._window[-1].cost:
            self._turn_off()

    G.CostGate.record_verify = record_verify


def risk(args: tuple[float, float]) -> None:
    slack, most = args

    def account(self, draft, committed, seconds, gate):
        if draft is not None:
            cost = self.live_costs.verify_cost(len(draft.tokens) + 1)
            self._balance = getattr(self, "_balance", 0.0) + len(committed) - cost
        return ACCOUNT(self, draft, committed, seconds, gate)

    def judge(self, proposal, room, stop_ids, min_draft):
        draft, gate = JUDGE(self, proposal, room, stop_ids, min_draft)
        if draft is None or gate is None or not gate._on_prior or gate.prior > most:
            return draft, gate
        loss = self.live_costs.verify_cost(len(draft.tokens) + 1) - 1
        if loss > slack * self.stats.committed + getattr(self, "_balance", 0.0):
            gate._on_prior, gate.state = False, G.GateState.OFF
            return JUDGE(self, proposal, room, stop_ids, min_draft)
        return draft, gate

    D.SpeculativeDecoder._account, D.SpeculativeDecoder._judge = account, judge


def minmatch(m: int) -> None:
    def judge(self, proposal, room, stop_ids, min_draft):
        steep = self.live_costs.table.cost(G.STEEP_DRAFT + 1) - 1 >= G.STEEP_LOSS
        if steep and 0 < proposal.match_len < m:
            return None, None
        return JUDGE(self, proposal, room, stop_ids, min_draft)

    D.SpeculativeDecoder._judge = judge


def cap(n: int) -> None:
    def budget(self, max_draft):
        b = BUDGET(self, max_draft)
        return min(b, n) if self._on_prior and self.steep else b

    G.CostGate.budget = budget


def reset() -> None:
    D.SpeculativeDecoder._judge, D.SpeculativeDecoder._account = JUDGE, ACCOUNT
    G.CostGate.record_verify, G.CostGate.budget = VERIFY, BUDGET


def score(name: str, data: dict, table: CostTable) -> None:
    rows = {
        k: gate_sim.replay_one(e, data["vocab_size"], table, table)["modeled_speedup"]
        for k, e in data["streams"].items()
    }
    free = [v for k, v in rows.items() if k.split("/")[0] in FREE]
    families = sorted({k.split("/")[0] for k in rows} - set(FREE))

    def gmean(values: list[float]) -> float:
        return math.exp(statistics.mean(math.log(v) for v in values))

    retrieval = " ".join(
        f"{f[:9]} {gmean([v for k, v in rows.items() if k.split('/')[0] == f]):.3f}"
        for f in families
    )
    print(
        f"{name:12} free {gmean(free):.4f} worst {min(free):.3f} "
        f"<0.98 {sum(v < 0.98 for v in free):2} <0.99 {sum(v < 0.99 for v in free):2} | "
        f"{retrieval}"
    )


def main() -> None:
    data = json.loads(Path(sys.argv[1]).read_text())
    spec = json.loads(Path(sys.argv[2]).read_text())
    table = CostTable(tuple(spec["ks"]), tuple(spec["costs"]))
    variants = [("base", None, None)]
    variants += [(f"trial={t}", trial, t) for t in (1, 2, 3)]
    variants += [(f"risk={s},{p}", risk, (s, p)) for p in (1.0, 0.85) for s in (0.02, 0.05)]
    variants += [(f"minmatch={m}", minmatch, m) for m in (3, 4, 5)]
    variants += [(f"cap={n}", cap, n) for n in (2, 3, 4, 5)]
    for name, rule, value in variants:
        reset()
        if rule is not None:
            rule(value)
        score(name, data, table)


if __name__ == "__main__":
    main()
