"""Scratch (session 35): one bench prompt step by step on the 1.5B: each step's shadow checks
started and settled, verifies, and each gate's turn-ons and turn-offs.

    PYTHONPATH=src python docs/bench/avx512/s35/gate_trace.py TASK PROMPT_ID [-m MODEL]
        [--table T.json]

The decoder runs as the bench runs it, on the model's stored table or on --table.
"""

import argparse
from pathlib import Path

import draftless.decoder as D
from draftless.bench.runner import _cascade, _chat_ids, _encode
from draftless.bench.tasks import load_task
from draftless.costs import CostTable, table_for
from draftless.gate import CostGate
from draftless.models.registry import load_model

parser = argparse.ArgumentParser()
parser.add_argument("task")
parser.add_argument("prompt_id")
parser.add_argument("-m", "--model", default="qwen2.5-coder-1.5b")
parser.add_argument("-n", type=int, default=192)
parser.add_argument("--table", type=Path)
args = parser.parse_args()
model = load_model(args.model, backend="llamacpp")
task = load_task(args.task)
prompt = next(p for p in task.prompts if p.id == args.prompt_id)
source = _cascade(model)
for ref in task.references:
    source.add_reference(model.tokenizer.encode(ref))
table = CostTable.load(args.table) if args.table else table_for(model)[0]
dec = D.SpeculativeDecoder(model, source=source, cost_table=table)
events: list[str] = []
names = {}

orig_shadow, orig_off = CostGate.record_shadow, CostGate._turn_off


def record_shadow(self, k, drafted, accepted, committed):
    state = self.state
    orig_shadow(self, k, drafted, accepted, committed)
    turned = " -> ON" if state != self.state else ""
    events.append(f"settle {names.get(id(self), '?')} {accepted}/{drafted} need {self._need}{turned}")


def turn_off(self):
    orig_off(self)
    events.append(f"OFF {names.get(id(self), '?')} need {self._need}")


CostGate.record_shadow, CostGate._turn_off = record_shadow, turn_off
dec.append(_chat_ids(model, prompt.text) + _encode(model, prompt.answer_prefix))
out: list[int] = []
stops = model.eos_token_ids
while len(out) < args.n and not (out and out[-1] in stops):
    drafted, accepted, shadows = dec.stats.drafted, dec.stats.accepted, len(dec._shadows)
    got = dec.step(args.n - len(out), stops)
    for name, gate in dec.gates.items():
        names[id(gate)] = name
    line = f"{len(out):3d} +{len(got):2d}"
    if dec.stats.drafted > drafted:
        line += f" verify {dec.stats.accepted - accepted}/{dec.stats.drafted - drafted}"
    new = [s for s in dec._shadows if s.at == len(dec.history) - len(got)]
    for s in new:
        line += f" shadow {s.name} d={len(s.draft.tokens)} match={s.draft.match_len}"
    print(line, *events, sep=" | ")
    events.clear()
    out += got
model.close()
