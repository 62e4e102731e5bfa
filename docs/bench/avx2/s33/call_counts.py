"""Scratch (session 33): Python calls per decoder step, plain and idle --spec (cProfile counts).

    PYTHONPATH=src python docs/bench/avx2/s33/call_counts.py

SmolLM2, both cores, the first 4 held-out free-form prompts, 256 new tokens, every gate held
off; prints calls a step by function and the callers of the most frequent. Source of the
README's "~26 list appends and dict lookups a step" in the edit learner (tree 0c9fe0d).
"""

import cProfile
import json
import pstats
from pathlib import Path

from draftless import SpecOptions, SpeculativeDecoder, load_model, table_for
from draftless.gate import GateOptions
from draftless.sources.cascade import SpeculationIndex

model = load_model("smollm2", backend="llamacpp", n_threads=2)
table = table_for(model)[0]
idle = SpecOptions(gate_options=GateOptions(min_speedup=100.0))
texts = json.loads(Path("benchmarks/heldout-free-form.json").read_text())[:4]


def run(spec):
    steps = 0
    for text in texts:
        ids = model.tokenizer.apply_chat_template([{"role": "user", "content": text}])
        dec = SpeculativeDecoder(
            model,
            source=SpeculationIndex(model.vocab_size) if spec else None,
            options=idle if spec else SpecOptions(),
            cost_table=table,
        )
        dec.append(ids)
        for _ in dec.stream(256):
            pass
        steps += dec.stats.steps
    return steps


run(True)
for spec in (False, True):
    pr = cProfile.Profile()
    pr.enable()
    steps = run(spec)
    pr.disable()
    st = pstats.Stats(pr)
    total = sum(v[1] for v in st.stats.values())
    print("spec" if spec else "plain", "steps", steps, "calls/step", total / steps)
    rows = sorted(st.stats.items(), key=lambda kv: -kv[1][1])
    for (f, line, name), v in rows[:45]:
        if v[1] / steps >= 0.5:
            print(f"  {v[1] / steps:6.2f} {Path(f).name}:{line} {name}")
    if spec:
        for key in list(st.stats):
            f, line, name = key
            if (
                name
                in (
                    "_numba_unpickle",
                    "<genexpr>",
                    "get",
                    "append",
                    "<built-in method builtins.len>",
                    "<method 'get' of 'dict' objects>",
                    "<method 'append' of 'list' objects>",
                )
                or "len" in name
            ):
                callers = st.stats[key][4]
                print("CALLERS of", Path(f).name, line, name)
                for c, v in sorted(callers.items(), key=lambda kv: -kv[1][1])[:8]:
                    print(f"     {v[1] / steps:6.2f} {Path(c[0]).name}:{c[1]} {c[2]}")
