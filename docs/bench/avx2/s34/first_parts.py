"""Scratch (session 34): where an idle --spec step's time goes, step by step, on a short answer.

    PYTHONPATH=src python docs/bench/avx2/s34/first_parts.py PROMPT

SmolLM2, llama.cpp, both cores, the default cascade and gate, greedy, the first 40 steps, 8
runs. Each listed method is wrapped with a timer (the wrapping costs a little itself); per
step, the median over the runs of the microseconds spent inside it: `draft` is the decoder's
whole `_draft` (propose, the gate's lookup and budget, sizing the draft or filing it as a
shadow check), `shadows` settling the pending shadow checks (`record_shadow` within), then
the step's sampling (`accept`) and the source told the committed tokens (`observe`). A step
whose draft became a shadow check reads ~120-150 us in `draft` and the next ~55-70 in
`shadows`; a step with nothing to propose ~18.
"""

import collections
import statistics
import sys
import time

import draftless.decoder as D
import draftless.gate as G
from draftless import SpeculativeDecoder, load_model, table_for
from draftless.sources.cascade import SpeculationIndex

model = load_model("smollm2", backend="llamacpp", n_threads=2)
table = table_for(model)[0]
ids = model.tokenizer.apply_chat_template([{"role": "user", "content": sys.argv[1]}])
N = 40
acc = collections.defaultdict(lambda: [[] for _ in range(N)])
cur = {"i": 0, "t": collections.Counter()}


def wrap(owner, name, label):
    f = getattr(owner, name)

    def g(*a, **k):
        t0 = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            cur["t"][label] += time.perf_counter() - t0

    setattr(owner, name, g)


wrap(D.SpeculativeDecoder, "_draft", "draft")
wrap(D.SpeculativeDecoder, "_check_shadows", "shadows")
wrap(D.SpeculativeDecoder, "_account", "account")
wrap(SpeculationIndex, "observe", "observe")
wrap(SpeculationIndex, "propose", "propose")
wrap(D.SpeculativeDecoder, "_gate_for", "gate_for")
wrap(G.CostGate, "budget", "budget")
wrap(G.CostGate, "record_shadow", "record_shadow")
wrap(D.SpeculativeDecoder, "_accept", "accept")
for _ in range(8):
    dec = SpeculativeDecoder(model, source=SpeculationIndex(model.vocab_size), cost_table=table)
    dec.append(ids)
    for i in range(N):
        cur["t"] = collections.Counter()
        dec.step(10**6)
        for k, v in cur["t"].items():
            acc[k][i].append(v * 1e6)
labels = [
    "draft",
    "propose",
    "gate_for",
    "budget",
    "shadows",
    "record_shadow",
    "account",
    "accept",
    "observe",
]
print("step " + " ".join(f"{part:>13}" for part in labels))
for i in range(N):
    cells = [statistics.median(acc[part][i]) if acc[part][i] else 0.0 for part in labels]
    print(f"{i:4} " + " ".join(f"{us:13.0f}" for us in cells))
