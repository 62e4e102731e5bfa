"""Scratch: while the stream's realized net gain (committed - table cost, over verifies) is below
zero, new gates start OFF and shadow turn-ons need twice the checks. Replayed on recorded streams."""
import json, sys, statistics
ROOT = __import__("pathlib").Path(__file__).resolve().parents[4]; sys.path.insert(0, str(ROOT / "src")); sys.path.insert(0, str(ROOT / "benchmarks"))
import gate_sim
from draftless import decoder as D, gate as G
from draftless.costs import CostTable
data = json.load(open(sys.argv[1])); t = json.load(open(sys.argv[2]))
table = CostTable(tuple(t["ks"]), tuple(t["costs"]))
MODE = sys.argv[3]; TH = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
STATE = {"net": 0.0}
if MODE != "base":
    oa = D.SpeculativeDecoder._account
    def _account(self, draft, committed, seconds, gate):
        if draft is not None and gate is not None:
            STATE["net"] += len(committed) - gate.verify_cost(len(draft.tokens) + 1)
        return oa(self, draft, committed, seconds, gate)
    D.SpeculativeDecoder._account = _account
    og = D.SpeculativeDecoder._gate_for
    def _gate_for(self, draft):
        new = (draft.member if G.evidence_bucket(draft.match_len) is None else f"{draft.member}/{G.evidence_bucket(draft.match_len)}") not in self.gates
        name, gate = og(self, draft)
        if new and STATE["net"] < -TH and gate.state is G.GateState.ON and "start" in MODE:
            gate.state = G.GateState.OFF; gate._on_prior = False
        return name, gate
    D.SpeculativeDecoder._gate_for = _gate_for
    orS = G.CostGate.record_shadow
    def record_shadow(self, k, drafted, accepted, committed):
        if "need" in MODE and STATE["net"] < -TH:
            saved = self._need; self._need = min(self.options.window, saved * 2)
            try: return orS(self, k, drafted, accepted, committed)
            finally:
                if self.state is G.GateState.OFF: self._need = saved
        return orS(self, k, drafted, accepted, committed)
    G.CostGate.record_shadow = record_shadow
rows = {}
for key, e in data["streams"].items():
    STATE["net"] = 0.0
    rows[key] = gate_sim.replay_one(e, data["vocab_size"], table)["modeled_speedup"]
fams = {}
for k, v in rows.items(): fams.setdefault(k.split("/")[0], []).append((v, k))
import math
json.dump(rows, open(f"/tmp/def-{MODE}-{TH}-{sys.argv[1].split('/')[-1]}", "w"))
free = [v for k, v in rows.items() if k.split("/")[0] in ("free-form", "held-free", "held-out")]
ret = [v for k, v in rows.items() if k.split("/")[0] not in ("free-form", "held-free", "held-out")]
print(f"free n={len(free)} under0.98={sum(v < 0.98 for v in free)} geo={math.exp(sum(map(math.log, free))/len(free)):.4f} min={min(free):.3f} | retrieval n={len(ret)} geo={math.exp(sum(map(math.log, ret))/len(ret)):.4f} under1={sum(v<1 for v in ret)}")
print(MODE, TH, "  ".join(f"{f} {statistics.median(v for v, _ in vs):.3f}/{min(vs)[0]:.3f}" for f, vs in sorted(fams.items())))
