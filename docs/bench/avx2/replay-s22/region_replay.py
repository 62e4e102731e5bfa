"""Scratch: replay with the conversation member split by where its match lies (prompt or the
model's own output): separate gates and pools, same priors. No change to src/."""
import json, sys, statistics
ROOT = __import__("pathlib").Path(__file__).resolve().parents[4]; sys.path.insert(0, str(ROOT / "src")); sys.path.insert(0, str(ROOT / "benchmarks"))
import gate_sim
from draftless.costs import CostTable
data = json.load(open(sys.argv[1])); t = json.load(open(sys.argv[2]))
table = CostTable(tuple(t["ks"]), tuple(t["costs"]))
MODE = sys.argv[3] if len(sys.argv) > 3 else "split"

def region_of(stream, P, pos, toks, m):
    suf = stream[pos - m:pos]
    for end in range(pos - 1, m - 1, -1):
        if stream[end - m:end] == suf and stream[end:end + len(toks)] == toks[: max(0, min(len(toks), pos - end))]:
            return "prompt" if end <= P else "gen"
    return "gen"

from draftless import decoder as D
from draftless.gate import CostGate, evidence_bucket, prior_acceptance
if MODE in ("pool", "gate"):
    def _gate_for(self, draft):
        bucket = evidence_bucket(draft.match_len)
        base = draft.member.split("@")[0]
        gmem = base if MODE == "pool" else draft.member
        pmem = draft.member if MODE == "pool" else base
        name = gmem if bucket is None else f"{gmem}/{bucket}"
        gate = self.gates.get(name)
        if gate is None:
            opts = self.options
            gate = self.gates[name] = CostGate(self.cost_table, opts.gate_options, prior_acceptance(bucket), pricing=self.live_costs)
            gate.start(opts.max_draft, opts.min_draft, pool=self._pool.setdefault(pmem, [0, 0]))
        return name, gate
    D.SpeculativeDecoder._gate_for = _gate_for
    op = D.SpeculativeDecoder._pool_add
    def _pool_add(self, member, drafted, accepted):
        return op(self, member if MODE == "pool" else member.split("@")[0], drafted, accepted)
    D.SpeculativeDecoder._pool_add = _pool_add
rows = {}
for key, e in data["streams"].items():
    e = dict(e)
    if MODE in ("split", "pool", "gate"):
        stream = e["prompt"] + e["generated"]; P = len(e["prompt"])
        new = {}
        for k, (toks, mem, m) in e["drafts"].items():
            if mem == "conversation" and m > 0:
                mem = "conversation@" + region_of(stream, P, int(k), toks, m)
            new[k] = [toks, mem, m]
        e["drafts"] = new
    rows[key] = gate_sim.replay_one(e, data["vocab_size"], table)["modeled_speedup"]
fams = {}
for k, v in rows.items(): fams.setdefault(k.split("/")[0], []).append((v, k))
for f, vs in sorted(fams.items()):
    print(f"{f:14s} median {statistics.median(v for v, _ in vs):.3f}  worst {min(vs)[0]:.3f} ({min(vs)[1]})")
json.dump(rows, open(f"/tmp/region-{MODE}.json", "w"))
