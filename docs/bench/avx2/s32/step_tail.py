"""Scratch (session 32): the distribution of an idle --spec decoder's own time per step.

    PYTHONPATH=src python docs/bench/avx2/s32/step_tail.py [--settle]

SmolLM2, both cores, benchmarks/heldout-free-form.json, 256 new tokens; plain and spec-idle
(the cascade and gates as shipped, every gate held off) one after the other on each prompt.
Per step: wall time of the decoder's step minus its forward; percentiles over all steps, and
the garbage collector's passes and time during the runs. --settle: `settle_heap()` (what the
CLI does after loading) first.
"""

import gc
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from draftless import SpecOptions, SpeculativeDecoder, load_model, table_for
from draftless.gate import GateOptions
from draftless.sources.cascade import SpeculationIndex

HELDOUT = Path(__file__).resolve().parents[4] / "benchmarks/heldout-free-form.json"
model = load_model("smollm2", backend="llamacpp", n_threads=2)
table = table_for(model)[0]
if "--settle" in sys.argv:
    from draftless.cli.common import settle_heap

    settle_heap()
fwd = model.forward
spent = [0.0]


def timed_forward(ids):
    t0 = time.perf_counter()
    try:
        return fwd(ids)
    finally:
        spent[0] += time.perf_counter() - t0


model.forward = timed_forward
gc_time = {"plain": [0.0, 0], "spec-idle": [0.0, 0]}
gc_passes: list[tuple[str, int, float]] = []  # (variant, generation, seconds)
current = ["plain"]
gc_t0 = [0.0]


def on_gc(phase, info):
    if phase == "start":
        gc_t0[0] = time.perf_counter()
    else:
        g = gc_time[current[0]]
        dt = time.perf_counter() - gc_t0[0]
        g[0] += dt
        g[1] += 1
        gc_passes.append((current[0], info["generation"], dt))


gc.callbacks.append(on_gc)
variants = {
    "plain": lambda: (None, SpecOptions()),
    "spec-idle": lambda: (
        SpeculationIndex(model.vocab_size),
        SpecOptions(gate_options=GateOptions(min_speedup=100.0)),
    ),
}
out: dict[str, list[float]] = {k: [] for k in variants}
for _ in range(2):
    for text in json.loads(HELDOUT.read_text()):
        ids = model.tokenizer.apply_chat_template([{"role": "user", "content": text}])
        for name, make in variants.items():
            current[0] = name
            source, options = make()
            dec = SpeculativeDecoder(model, source=source, options=options, cost_table=table)
            dec.append(ids)
            it = dec.stream(256)
            next(it)
            while True:
                spent[0] = 0.0
                t0 = time.perf_counter()
                chunk = next(it, None)
                wall = time.perf_counter() - t0
                if chunk is None:
                    break
                out[name].append((wall - spent[0]) * 1e6)
for name, values in out.items():
    v = np.array(values)
    p = np.percentile(v, [10, 50, 90, 99, 99.9])
    print(
        f"{name:10} {len(v)} steps, us outside the forward: mean {v.mean():.1f}; p10 {p[0]:.0f} "
        f"p50 {p[1]:.0f} p90 {p[2]:.0f} p99 {p[3]:.0f} p99.9 {p[4]:.0f} max {v.max():.0f}; "
        f"gc {gc_time[name][1]} passes, {gc_time[name][0] * 1e3:.1f} ms"
    )
for name in variants:
    for gen in range(3):
        times = [dt for v, g, dt in gc_passes if v == name and g == gen]
        if times:
            print(
                f"{name:10} gc generation {gen}: {len(times)} passes, "
                f"median {statistics.median(times) * 1e3:.2f} ms, max {max(times) * 1e3:.1f} ms"
            )
