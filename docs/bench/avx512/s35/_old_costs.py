"""`draftless.costs.measure` as of b4e04f8 (before session 35's pairing), for probe_spread.py."""

import time

import numpy as np

from draftless.costs import PROBE_KS, CostTable, ProbeResult


def measure(model, *, ks=PROBE_KS, context=256, reps=5, clock=time.perf_counter):
    """Every rep of k = 1, then of k = 2, ...; C(k) = min over reps of k / min over reps of 1."""
    rng = np.random.default_rng(0)
    vocab = model.vocab_size
    low = min(1000, vocab // 2)
    filler = rng.integers(low, min(vocab, low + 20000), size=context + max(ks)).tolist()
    model.truncate(0)
    model.prefill(filler[:context])
    best: dict[int, float] = {}
    for _ in range(2):  # warm-up
        model.forward(filler[context : context + 8])
        model.truncate(context)
    for k in ks:
        times = []
        for _ in range(reps):
            t0 = clock()
            model.forward(filler[context : context + k])
            times.append(clock() - t0)
            model.truncate(context)
        best[k] = min(times)
    model.truncate(0)
    plain = best[min(ks)]
    table = CostTable(tuple(ks), tuple(max(1.0, best[k] / plain) if k > 1 else 1.0 for k in ks))
    return ProbeResult(table, plain, context, reps)
