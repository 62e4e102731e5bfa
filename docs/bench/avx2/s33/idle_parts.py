"""Scratch (session 33): the idle --spec step's time by part, by removal.

    PYTHONPATH=src python docs/bench/avx2/s33/idle_parts.py [ROUNDS [VARIANT,...]]

The harness of docs/bench/avx2/s32/idle_ablation.py (SmolLM2, both cores, the held-out
free-form prompts, 256 new tokens, every gate held off: no verify). Variants take one part
of the step away at a time; mean wall time outside the forward per step, over plain.
"""

import json
import sys
import time
from pathlib import Path

from draftless import SpecOptions, SpeculativeDecoder, load_model, table_for
from draftless.gate import GateOptions
from draftless.sources.cascade import SpeculationIndex

HELDOUT = Path(__file__).resolve().parents[4] / "benchmarks/heldout-free-form.json"
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 2

model = load_model("smollm2", backend="llamacpp", n_threads=2)
table = table_for(model)[0]
idle = SpecOptions(gate_options=GateOptions(min_speedup=100.0))


class Decoder(SpeculativeDecoder):
    no_propose = False
    no_observe = False

    def _draft(self, room, stop_ids=frozenset()):
        if self.no_propose:
            return None, None
        return super()._draft(room, stop_ids)


def make(no_propose=False, no_observe=False, **kw):
    def build():
        source = SpeculationIndex(model.vocab_size, **kw)
        if no_observe:
            source.observe = lambda committed: None
        return source, no_propose

    return build


variants = {
    "plain": None,
    "spec-idle": make(),
    "observe, no propose": make(no_propose=True),
    "propose, no observe": make(no_observe=True),
    "neither": make(no_propose=True, no_observe=True),
}
if len(sys.argv) > 2:
    variants = {k: variants[k] for k in sys.argv[2].split(",")}
outside = {k: 0.0 for k in variants}
steps = {k: 0 for k in variants}
names = list(variants)
for r in range(ROUNDS):
    for text in json.loads(HELDOUT.read_text()):
        ids = model.tokenizer.apply_chat_template([{"role": "user", "content": text}])
        for name in names[r % len(names) :] + names[: r % len(names)]:
            if variants[name] is None:
                dec = SpeculativeDecoder(model, options=SpecOptions(), cost_table=table)
            else:
                source, no_propose = variants[name]()
                dec = Decoder(model, source=source, options=idle, cost_table=table)
                dec.no_propose = no_propose
                if name == "propose, no observe":  # the prompt still goes in: a match to draft
                    SpeculationIndex.observe(source, ids)
            dec.append(ids)
            t0 = time.perf_counter()
            for _ in dec.stream(256):
                pass
            wall = time.perf_counter() - t0
            s = dec.stats
            assert s.verify_steps == 0
            outside[name] += wall - s.forward_seconds
            steps[name] += s.steps
base = outside["plain"] / steps["plain"] * 1e6
for name in names:
    us = outside[name] / steps[name] * 1e6
    print(f"{name:20} {us:6.1f} us/step outside the forward ({us - base:+6.1f} over plain)")
