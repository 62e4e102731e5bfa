"""Scratch (session 34): the verifies' running balance on recorded streams, by the table.

    PYTHONPATH=src python docs/bench/avx2/s34/balance_replay.py STREAMS TABLE PROMPT [PROMPT ...]

Replays each prompt as benchmarks/gate_sim.py does (the real decoder and gate, clock off) and
prints, per verify, "tokens committed before it: draft length / accepted: balance", the
balance being the sum over verifies so far of committed tokens minus the table's cost.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "benchmarks"))

import gate_sim

import draftless.decoder as D
from draftless import SpecOptions, SpeculativeDecoder
from draftless.costs import CostTable

data = json.loads(Path(sys.argv[1]).read_text())
spec = json.loads(Path(sys.argv[2]).read_text())
table = CostTable(tuple(spec["ks"]), tuple(spec["costs"]))
ACC = D.SpeculativeDecoder._account


def account(self, draft, committed, seconds, gate):
    if draft is not None:
        c = table.cost(len(draft.tokens) + 1)
        self._bal = getattr(self, "_bal", 0.0) + len(committed) - c
        self._trace.append(
            f"{self.stats.committed}:{len(draft.tokens)}/{len(committed) - 1}:{self._bal:+.1f}"
        )
    return ACC(self, draft, committed, seconds, gate)


D.SpeculativeDecoder._account = account
INIT = D.SpeculativeDecoder.__init__


def init(self, *a, **k):
    INIT(self, *a, **k)
    self._trace = []


D.SpeculativeDecoder.__init__ = init
for k in sys.argv[3:]:
    e = data["streams"][k]
    stream = e["prompt"] + e["generated"]
    model = gate_sim._ReplayModel(stream, data["vocab_size"], e["stops"])
    dec = SpeculativeDecoder(
        model,
        source=gate_sim._ReplaySource(e["drafts"]),
        options=SpecOptions(),
        cost_table=table,
        clock=None,
    )
    dec.append(e["prompt"])
    for _ in dec.stream(e["max_new_tokens"], e["stops"]):
        pass
    print(k, " ".join(dec._trace[:40]))
