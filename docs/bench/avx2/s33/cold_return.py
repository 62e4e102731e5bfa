"""Scratch (session 33): what a compiled call's returned arrays cost a decoder step.

    PYTHONPATH=src python docs/bench/avx2/s33/cold_return.py [ROUNDS]

The harness of docs/bench/avx2/s32/cold_ops.py (SmolLM2, both cores, the held-out free-form
prompts, 256 new tokens): a compiled call with six array arguments a step that returns two of
them, a bool, or nothing; and two Python-level `_reserve` calls. Mean wall time outside the
forward per step, against doing nothing.
"""

import json
import sys
import time
from pathlib import Path

import numpy as np

from draftless import SpecOptions, SpeculativeDecoder, load_model, table_for
from draftless._jit import njit
from draftless.sources.sam import _reserve


@njit
def _ret2(a, b, c, d, e, f):
    a[0] += 1
    return b, c


@njit
def _ret_bool(a, b, c, d, e, f):
    a[0] += 1
    return b.shape[0] != c.shape[0]


@njit
def _ret_none(a, b, c, d, e, f):
    a[0] += 1


ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 2
model = load_model("smollm2", backend="llamacpp", n_threads=2)
table = table_for(model)[0]
M = np.zeros(8, dtype=np.int64)
ST = np.zeros((64, 4), dtype=np.int32)
ED = np.zeros((64, 2), dtype=np.int32)
HT = np.zeros((64, 3), dtype=np.int32)
S = np.zeros(64, dtype=np.int32)
T = np.zeros(1, dtype=np.int32)


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


def two_reserves():
    _reserve(S, 10)
    _reserve(ST, 10)


variants = {
    "nothing": lambda: None,
    "6 arrays, returns 2 arrays": lambda: _ret2(ST, ED, HT, S, M, T),
    "6 arrays, returns a bool": lambda: _ret_bool(ST, ED, HT, S, M, T),
    "6 arrays, returns nothing": lambda: _ret_none(ST, ED, HT, S, M, T),
    "two _reserve calls": two_reserves,
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
    print(f"{name:28} {t / n * 1e6:6.1f} us/step outside the forward ({t / n * 1e6 - base:+5.1f})")
