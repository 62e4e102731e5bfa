"""Scratch (session 32): what one numpy or numba call costs a decoder step, in the loop.

    PYTHONPATH=src python docs/bench/avx2/s32/cold_ops.py

SmolLM2, both cores, benchmarks/heldout-free-form.json, 256 new tokens. A source that never
drafts and, told the committed tokens, does only the listed work; mean wall time outside the
forward per step over all steps, against a source that does nothing, variants in turn on each
prompt. Right after a forward the caches hold the weights, not Python's or numpy's code: the
first use in a step of each distinct code path is paid at memory latency.
"""

import json
import time
from pathlib import Path

import numpy as np

from draftless import SpecOptions, SpeculativeDecoder, load_model, table_for
from draftless._jit import njit
from draftless.sources.recycling import Recycling
from draftless.sources.sam import SamIndex


@njit
def _touch1(a):
    a[0] += 1


@njit
def _touch6(a, b, c, d, e, f):
    a[0] += 1
    return b, c


model = load_model("smollm2", backend="llamacpp", n_threads=2)
table = table_for(model)[0]
META = np.zeros(8, dtype=np.int64)
STREAM = np.arange(5000, dtype=np.int32)
PY = list(range(5000))


class Doing:
    wants_topk = False
    topk_member = None

    def __init__(self, work) -> None:
        self.work = work
        self.sam = SamIndex()
        self.recycling = Recycling(model.vocab_size)

    def propose(self, budget):
        return None

    def observe(self, committed) -> None:
        self.work(self, committed)

    def observe_topk(self, token_ids, topk_ids) -> None:
        pass


variants = {
    "nothing": lambda s, c: None,
    "python: list slice + dict": lambda s, c: (PY[100:110], {1: 2}.get(1)),
    "int(meta[i])": lambda s, c: int(META[5]),
    "int(meta[i]) + meta.tolist()": lambda s, c: (int(META[5]), META.tolist()),
    "+ stream[a:b].tolist()": lambda s, c: (int(META[5]), META.tolist(), STREAM[9:19].tolist()),
    "numba, 1 array": lambda s, c: _touch1(META),
    "numba, 6 arrays, returns 2": lambda s, c: _touch6(META, STREAM, META, STREAM, META, STREAM),
    "recycling.observe(committed)": lambda s, c: s.recycling.observe(c),
    "sam.extend(committed)": lambda s, c: s.sam.extend(c),
}
out = {k: [0.0, 0] for k in variants}
names = list(variants)
for r in range(2):
    for text in json.loads(Path("benchmarks/heldout-free-form.json").read_text()):
        ids = model.tokenizer.apply_chat_template([{"role": "user", "content": text}])
        for name in names[r:] + names[:r]:
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
    print(f"{name:32} {t / n * 1e6:6.1f} us/step outside the forward ({t / n * 1e6 - base:+5.1f})")
