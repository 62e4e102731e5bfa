"""Scratch: after a shadow turn-on, the first TRIAL real verifies that commit less than they cost
turn the gate off at once (as a prior-ON gate's first losing verify does)."""
import json, sys, statistics, math
ROOT = __import__("pathlib").Path(__file__).resolve().parents[4]; sys.path.insert(0, str(ROOT / "src")); sys.path.insert(0, str(ROOT / "benchmarks"))
import gate_sim
from draftless import gate as G
from draftless.costs import CostTable
data = json.load(open(sys.argv[1])); t = json.load(open(sys.argv[2]))
table = CostTable(tuple(t["ks"]), tuple(t["costs"]))
TRIAL = int(sys.argv[3])
if TRIAL > 0:
    orig = G.CostGate.record_verify
    def record_verify(self, k, drafted, accepted, committed, seconds=None):
        on_trial = 0 <= self._since_on < TRIAL
        orig(self, k, drafted, accepted, committed, seconds)
        if on_trial and self.state is G.GateState.ON and committed < self._window[-1].cost:
            self._turn_off()
    G.CostGate.record_verify = record_verify
rows = {k: gate_sim.replay_one(e, data["vocab_size"], table)["modeled_speedup"] for k, e in data["streams"].items()}
fams = {}
for k, v in rows.items(): fams.setdefault(k.split("/")[0], []).append((v, k))
free = [v for k, v in rows.items() if k.split("/")[0] in ("free-form", "held-free", "held-out")]
ret = [v for k, v in rows.items() if k.split("/")[0] not in ("free-form", "held-free", "held-out")]
print(f"trial {TRIAL}: free n={len(free)} under0.98={sum(v < 0.98 for v in free)} geo={math.exp(sum(map(math.log, free))/len(free)):.4f} min={min(free):.3f} | retrieval geo={math.exp(sum(map(math.log, ret))/len(ret)):.4f} under1={sum(v<1 for v in ret)}")
print("   ", "  ".join(f"{f} {statistics.median(v for v, _ in vs):.3f}/{min(vs)[0]:.3f}" for f, vs in sorted(fams.items())))
json.dump(rows, open(f"/tmp/trial-{TRIAL}-{sys.argv[1].split('/')[-1]}", "w"))
