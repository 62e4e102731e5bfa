"""Scratch (session 34): what a compiled call with six arrays costs a decoder step, by the way
it is called: numba's dispatcher, the compiled overload's entry point (no type dispatch), or
a C function pointer (numba cfunc) called through ctypes with the arrays' addresses.

    PYTHONPATH=src python docs/bench/avx2/s34/cold_dispatch.py [ROUNDS]

SmolLM2, both cores, benchmarks/heldout-free-form.json, 256 new tokens; a source that never
drafts and, told the committed tokens, makes only the listed call; mean wall time outside the
forward per step over all steps, against a source that does nothing, variants in turn on each
prompt (the harness of docs/bench/avx2/s32/cold_ops.py). Hot, the three cost ~1.1, ~0.7 and
~1.3 us; right after a forward each is paid at memory latency.
"""

import ctypes
import json
import sys
import time
from pathlib import Path

import numpy as np
from numba import carray, cfunc, njit, types

from draftless import SpecOptions, SpeculativeDecoder, load_model, table_for

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 2
ARRAYS = [np.zeros(4096, dtype=np.int64) for _ in range(6)]


@njit(cache=True)
def touch6(a, b, c, d, e, f):
    a[0] += 1
    b[1] += a[0]
    return 0


touch6(*ARRAYS)
ENTRY = next(iter(touch6.overloads.values())).entry_point


@cfunc(types.int64(*(types.CPointer(types.int64),) * 6))
def touch6_c(a, b, c, d, e, f):
    x, y = carray(a, 4096), carray(b, 4096)
    x[0] += 1
    y[1] += x[0]
    return 0


CALL = ctypes.CFUNCTYPE(ctypes.c_int64, *(ctypes.c_void_p,) * 6)(touch6_c.address)
POINTERS = [a.ctypes.data for a in ARRAYS]

model = load_model("smollm2", backend="llamacpp", n_threads=2)
table = table_for(model)[0]


class Doing:
    wants_topk = False
    topk_member = None

    def __init__(self, work) -> None:
        self.work = work

    def propose(self, budget):
        return None

    def observe(self, committed) -> None:
        self.work()

    def observe_topk(self, token_ids, topk_ids) -> None:
        pass


variants = {
    "nothing": lambda: None,
    "dispatcher, 6 arrays": lambda: touch6(*ARRAYS),
    "entry point, 6 arrays": lambda: ENTRY(*ARRAYS),
    "ctypes cfunc, 6 pointers": lambda: CALL(*POINTERS),
}
out = {k: [0.0, 0] for k in variants}
names = list(variants)
for r in range(ROUNDS):
    for text in json.loads(Path("benchmarks/heldout-free-form.json").read_text()):
        ids = model.tokenizer.apply_chat_template([{"role": "user", "content": text}])
        for name in names[r % len(names) :] + names[: r % len(names)]:
            dec = SpeculativeDecoder(
                model, source=Doing(variants[name]), options=SpecOptions(), cost_table=table
            )
            dec.append(ids)
            t0 = time.perf_counter()
            for _ in dec.stream(256):
                pass
            out[name][0] += time.perf_counter() - t0 - dec.stats.forward_seconds
            out[name][1] += dec.stats.steps
base = out["nothing"][0] / out["nothing"][1] * 1e6
for name, (t, n) in out.items():
    print(f"{name:26} {t / n * 1e6:6.1f} us/step outside the forward ({t / n * 1e6 - base:+5.1f})")
