"""Scratch (session 32): what each part of an idle --spec decoder costs a step, by removal.

    PYTHONPATH=src python docs/bench/avx2/s32/idle_ablation.py [ROUNDS [VARIANT,...]]

SmolLM2, both cores, benchmarks/heldout-free-form.json, 256 new tokens, no verify in any run
(every gate held off: min_speedup 100), variants one after the other on each prompt, the
order turning each round. Per variant: mean wall time outside the forward per step
(`DecodeStats.forward_seconds`) over all its steps, and that minus plain's.
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


def cascade(**kw):
    return lambda: (SpeculationIndex(model.vocab_size, **kw), idle)


variants = {
    "plain": lambda: (None, SpecOptions()),
    "spec-idle": cascade(),
    "no edits": cascade(edits=False),
    "no recycling": cascade(recycling=False),
    "conversation only": cascade(edits=False, recycling=False),
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
            source, options = variants[name]()
            dec = SpeculativeDecoder(model, source=source, options=options, cost_table=table)
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
    print(f"{name:18} {us:6.1f} us/step outside the forward ({us - base:+6.1f} over plain)")
