"""Scratch (session 21): the decoder's own time per step on SmolLM2's recorded free-form streams
with a model that costs nothing, plain vs --spec, and a cProfile of --spec.

    .venv/bin/python docs/bench/avx2/decoder_profile.py
"""
import cProfile, gzip, json, pstats, sys, time
from pathlib import Path
import numpy as np
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "src"))
from draftless import SpecOptions, SpeculativeDecoder
from draftless.costs import DEFAULT_COST_TABLES
from draftless.sources.cascade import SpeculationIndex

d = json.load(gzip.open(Path(__file__).resolve().parents[1] / "avx512/replay-variants/smol-streams.json.gz"))
V = d["vocab_size"]
streams = {k: v for k, v in d["streams"].items() if "free-form" in k}
TABLE = DEFAULT_COST_TABLES["llamacpp"]

class Rec:
    backend = "fake"; path = None; threads = 1; kernels = "numpy"; name = "rec"; n_ctx = None
    def __init__(self, full):
        self.full = full; self.vocab_size = V; self._n = 0
        self.tokenizer = None; self.eos_token_ids = frozenset()
        self.base = np.random.default_rng(0).normal(size=V).astype(np.float32)
        self.rows = np.empty((65, V), dtype=np.float32)
    @property
    def n_past(self): return self._n
    def forward(self, ids):
        k = len(ids); out = self.rows[:k]; out[:] = self.base
        for i in range(k):
            p = self._n + i + 1
            if p < len(self.full): out[i, self.full[p]] = 100.0
        self._n += k
        return out
    def prefill(self, ids): self._n += len(ids)
    def truncate(self, n): self._n = n
    def close(self): pass

def run(spec, reps=3):
    per = []
    for _ in range(reps):
        steps = 0; t = 0.0
        for key, s in streams.items():
            full = s["prompt"] + s["generated"]
            m = Rec(full)
            src = SpeculationIndex(V) if spec else None
            dec = SpeculativeDecoder(m, source=src, options=SpecOptions(), cost_table=TABLE)
            dec.append(s["prompt"])
            t0 = time.perf_counter()
            n = 0
            while n < len(s["generated"]):
                n += len(dec.step(len(s["generated"]) - n)); steps += 1
            t += time.perf_counter() - t0
        per.append(t / steps * 1e6)
    return min(per), steps

if __name__ == "__main__":
    for _ in range(2):
        a = run(False); b = run(True)
        print(f"plain {a[0]:.1f} us/step  spec {b[0]:.1f} us/step  ({b[1]} steps)  extra {b[0]-a[0]:.1f}")
    pr = cProfile.Profile(); pr.enable(); run(True, 1); pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(18)
