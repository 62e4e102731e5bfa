"""Scratch: every verify of a replayed prompt: position, gate, drafted, accepted, cost."""
import json, sys
ROOT = __import__("pathlib").Path(__file__).resolve().parents[4]; sys.path.insert(0, str(ROOT / "src")); sys.path.insert(0, str(ROOT / "benchmarks"))
import gate_sim
from draftless import decoder as D
from draftless.costs import CostTable
data = json.load(open(sys.argv[1])); table = json.load(open(sys.argv[2]))
table = CostTable(tuple(table["ks"]), tuple(table["costs"]))
want = sys.argv[3:]
orig = D.SpeculativeDecoder._account
log = []
def acc(self, draft, committed, seconds, gate):
    if draft is not None:
        name = next(n for n, g in self.gates.items() if g is gate)
        log.append((len(self.history) - len(committed), name, len(draft.tokens), len(committed) - 1, round(gate.verify_cost(len(draft.tokens) + 1), 2), draft.match_len))
    return orig(self, draft, committed, seconds, gate)
D.SpeculativeDecoder._account = acc
for key, entry in data["streams"].items():
    if not any(w in key for w in want): continue
    log.clear()
    row = gate_sim.replay_one(entry, data["vocab_size"], table)
    print(key, round(row["modeled_speedup"], 3), "verifies", row["verifies"], "shadow", row["shadow_checks"])
    net = 0
    for pos, name, d, a, c, m in log:
        net += a + 1 - c
        print(f"   @{pos:4d} {name:22s} m={m:3d} d={d:2d} acc={a:2d} cost={c:5.2f} net={net:6.2f}")
