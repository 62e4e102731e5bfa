"""Scratch (session 25): single-token forward time in plain vs --spec runs (SmolLM2, llama.cpp, 2 threads),
same prompts, alternating rounds; to see whether the spec run's own work slows the forwards.

    .venv/bin/python docs/bench/avx2/fwd_split.py
"""
import sys, time, statistics
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3] / "src"))
from draftless import SpecOptions, SpeculativeDecoder, load_model, table_for
from draftless.bench.tasks import load_task
from draftless.sources.cascade import SpeculationIndex

model = load_model("smollm2", backend="llamacpp", n_threads=2)
table = table_for(model)[0]
rec = []
orig = type(model).forward
def fwd(self, ids):
    t0 = time.perf_counter(); r = orig(self, ids); rec.append((len(ids), time.perf_counter() - t0)); return r
type(model).forward = fwd
prompts = [model.tokenizer.apply_chat_template([{"role": "user", "content": p.text}]) for p in load_task("free-form").prompts][:8]
res = {False: [], True: []}
for rnd in range(4):
    for spec in (False, True):
        rec.clear()
        t0 = time.perf_counter(); steps = 0
        for ids in prompts:
            src = SpeculationIndex(model.vocab_size) if spec else None
            dec = SpeculativeDecoder(model, source=src, options=SpecOptions(), cost_table=table)
            dec.append(ids)
            n = 0
            while n < 192:
                got = dec.step(192 - n); n += len(got); steps += 1
                if model.eos_token_ids & set(got): break
        wall = time.perf_counter() - t0
        ones = [s for k, s in rec if k == 1]
        res[spec].append(statistics.mean(ones))
        print("spec " if spec else "plain", f"1-token forwards {len(ones)} mean {1e6*statistics.mean(ones):.0f} us median {1e6*statistics.median(ones):.0f}; multi {sum(1 for k,_ in rec if k>1)}; wall {wall:.3f} s steps {steps}", flush=True)
print("ratio of mean 1-token forward spec/plain per round:", [round(b / a, 4) for a, b in zip(res[False], res[True])])
