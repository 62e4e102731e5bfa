"""Scratch (session 35): the probe's spread on a shared machine, old order against new, in
turns on one loaded model.

    PYTHONPATH=src python docs/bench/avx512/s35/probe_spread.py [MODEL [THREADS [TURNS]]]

old: `costs.measure` as of b4e04f8 (every rep of k = 1, then of k = 2, ...; C(k) = min over
reps of k / min over reps of k = 1), kept beside this script as _old_costs.py.
new: `draftless.costs.measure` (each k beside its own plain step, rounds over every k; C(k) =
median over rounds of the pair's ratio). 5 reps each, as `draftless probe`.
"""

import importlib.util
import sys
from pathlib import Path

from draftless.costs import PROBE_KS, measure
from draftless.models.registry import load_model

spec = importlib.util.spec_from_file_location("old_costs", Path(__file__).with_name("_old_costs.py"))
old = importlib.util.module_from_spec(spec)
sys.modules["old_costs"] = old
spec.loader.exec_module(old)

name = sys.argv[1] if len(sys.argv) > 1 else "qwen2.5-coder-1.5b"
threads = int(sys.argv[2]) if len(sys.argv) > 2 else 2
turns = int(sys.argv[3]) if len(sys.argv) > 3 else 3
model = load_model(name, backend="llamacpp", n_threads=threads)
SHOW = (2, 4, 8, 15, 16, 32, 64)
print(f"{name}, {threads} threads; C(k) at k = {SHOW}, and the plain step")
for turn in range(turns):
    for label, fn in (("old", old.measure), ("new", measure)):
        r = fn(model, ks=PROBE_KS, reps=5)
        costs = " ".join(f"{r.table.cost(k):6.2f}" for k in SHOW)
        print(f"turn {turn} {label}: {costs}   plain {1000 * r.plain_seconds:.1f} ms", flush=True)
model.close()
