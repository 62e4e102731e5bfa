"""Scratch (session 31): what the budget costs a step when plain steps reprice the switch.

    PYTHONPATH=src python docs/bench/avx2/s31/switch_hot.py

One gate on the 1.5B's two-thread table, after one verify and the plain step after it; then
plain steps of slightly different times, each followed by `budget(64)` as the decoder asks.
Before 0556422 every plain step recomputed `LiveCosts.switch` (its seconds over a moving
plain step), which moved the prices' key and rebuilt the 65 kept draft costs each step.
Warm caches: in the decode loop every call is slower (`benchmarks/step_overhead.py`).
"""

import timeit
from pathlib import Path

from draftless.costs import CostTable
from draftless.gate import CostGate, GateOptions, LiveCosts

table = CostTable.load(Path(__file__).parents[1] / "s30-lockstep/q15-2t-table.json")
live = LiveCosts(table)
gate = CostGate(table, GateOptions(), 0.7, pricing=live)
gate.start(64)
live.record_plain(0.01)
live.record_verify(4, 0.04)
live.record_plain(0.0113, after_verify=True)
i = [0]


def step() -> None:
    i[0] += 1
    live.record_plain(0.010 + (i[0] % 7) * 1e-4)
    gate.budget(64)


n = 20000
print(f"a plain step and a budget: {timeit.timeit(step, number=n) / n * 1e6:.1f} us")
