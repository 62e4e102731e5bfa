"""Scratch (session 34): what an idle --spec step does with the cascade's proposal.

    PYTHONPATH=src python docs/bench/avx2/s34/outcomes.py

SmolLM2, both cores, benchmarks/heldout-free-form.json, 256 new tokens, every gate held off
(min_speedup 100, as docs/bench/avx2/s32/idle_ablation.py). Counts, over all steps, of what
`_judge` made of each proposal: a new shadow check, none because the gate already has one
pending (a steep gate takes them one at a time: the proposal is dropped), or too short; the
steps with no proposal at all are the rest.
"""

import collections
import json
from pathlib import Path

import draftless.decoder as D
from draftless import SpecOptions, SpeculativeDecoder, load_model, table_for
from draftless.gate import GateOptions
from draftless.sources.cascade import SpeculationIndex

HELDOUT = Path("benchmarks/heldout-free-form.json")
model = load_model("smollm2", backend="llamacpp", n_threads=2)
table = table_for(model)[0]
idle = SpecOptions(gate_options=GateOptions(min_speedup=100.0))
count = collections.Counter()
orig_judge = D.SpeculativeDecoder._judge


def judge(self, proposal, room, stop_ids, min_draft):
    n = len(self._shadows)
    r = orig_judge(self, proposal, room, stop_ids, min_draft)
    if r[0] is not None:
        count["verify"] += 1
    elif r[1] is None:
        count["too short/no pay"] += 1
    elif len(self._shadows) > n:
        count["new shadow"] += 1
    else:
        count["no shadow room"] += 1
    return r


D.SpeculativeDecoder._judge = judge
steps = 0
for text in json.loads(HELDOUT.read_text()):
    ids = model.tokenizer.apply_chat_template([{"role": "user", "content": text}])
    dec = SpeculativeDecoder(
        model, source=SpeculationIndex(model.vocab_size), options=idle, cost_table=table
    )
    dec.append(ids)
    for _ in dec.stream(256):
        pass
    steps += dec.stats.steps
tot = sum(count.values())
print("steps", steps, "judged", tot, "no proposal", steps - tot)
for k, v in count.most_common():
    print(f"{k:20} {v:6} {v / steps:.1%}")
