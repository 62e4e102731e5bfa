"""Scratch (session 33): what the conversation automaton's per-step extend costs, by part.

    PYTHONPATH=src python docs/bench/avx2/s33/cold_sam.py [ROUNDS]

The harness of docs/bench/avx2/s32/cold_ops.py (SmolLM2, both cores, the held-out free-form
prompts, 256 new tokens, a source that never drafts and does only the listed work with the
committed tokens); mean wall time outside the forward per step, against doing nothing.
"""

import json
import sys
import time
from pathlib import Path

import numpy as np

from draftless import SpecOptions, SpeculativeDecoder, load_model, table_for
from draftless.sources import sam as S
from draftless.sources.sam import SamIndex

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 2
model = load_model("smollm2", backend="llamacpp", n_threads=2)
table = table_for(model)[0]
FEW = np.empty(8, dtype=np.int32)


def py_extend(idx: SamIndex, tokens: list[int]) -> None:
    """_extend for a few tokens in plain Python over the same arrays (no clone-free shortcut)."""
    st, ht, meta = idx._st, idx._ht, idx._meta
    for t in tokens:
        S._extend.py_func(st, idx._ed, ht, idx._stream, meta, np.array([t], dtype=np.int32))


class Doing:
    wants_topk = False
    topk_member = None

    def __init__(self, work) -> None:
        self.work = work
        self.sam = SamIndex()
        self.sam._st = np.empty((4096, 4), dtype=np.int32)
        self.sam._stream = np.empty(4096, dtype=np.int32)
        self.sam._st[0] = (0, -1, -1, -1)

    def propose(self, budget):
        return None

    def observe(self, committed) -> None:
        self.work(self, committed)

    def observe_topk(self, token_ids, topk_ids) -> None:
        pass


def direct(s, c):
    arr = S.as_token_array(c, out=FEW)
    idx = s.sam
    idx._ed, idx._ht = S._extend(idx._st, idx._ed, idx._ht, idx._stream, idx._meta, arr)


variants = {
    "nothing": lambda s, c: None,
    "as_token_array(out=)": lambda s, c: S.as_token_array(c, out=FEW),
    "sam.extend(committed)": lambda s, c: s.sam.extend(c),
    "_extend_array(arr)": lambda s, c: s.sam._extend_array(S.as_token_array(c, out=FEW)),
    "_extend, no reserve": direct,
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
    print(f"{name:32} {t / n * 1e6:6.1f} us/step outside the forward ({t / n * 1e6 - base:+5.1f})")
