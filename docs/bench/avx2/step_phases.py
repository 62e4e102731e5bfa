"""Scratch (session 22): time per step in each phase of the decoder, outside the forward, on real SmolLM2
(llama.cpp, 2 threads, the bench's first 8 free-form prompts, 192 tokens), plain against --spec, three rounds;
us per step, summed over the prompts. Wrapping adds ~0.5 us a call.

    .venv/bin/python docs/bench/avx2/step_phases.py
"""
import sys, time, statistics
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3] / "src"))
from draftless import SpecOptions, SpeculativeDecoder, load_model, table_for
from draftless import decoder as D
from draftless.bench.tasks import load_task
from draftless.sources.cascade import SpeculationIndex
from draftless.sources import cascade as C

T = {}
def wrap(obj, name, label):
    f = getattr(obj, name)
    def w(*a, **k):
        t0 = time.perf_counter()
        try: return f(*a, **k)
        finally: T[label] = T.get(label, 0.0) + time.perf_counter() - t0
    setattr(obj, name, w)
from draftless.sources import sam as S, edits as E, recycling as R
from draftless import gate as G
SD, SI = D.SpeculativeDecoder, C.SpeculationIndex
for obj, name, label in [
    (SD, "_draft", "draft"), (SD, "_accept", "accept"), (SD, "_account", "account"),
    (SD, "_check_shadows", "shadows"), (SI, "observe", "observe"), (SI, "propose", "propose"),
    (D, "topk_rows", "topk"), (SD, "_step", "step"),
    (S.SamIndex, "_extend_array", "o.sam"), (E.EditLearner, "observe", "o.edits"),
    (R.Recycling, "_observe_array", "o.recyc"), (C, "as_token_array", "o.astok"),
    (G.CostGate, "budget", "d.budget"), (G.CostGate, "pays", "d.pays"),
    (SD, "_gate_for", "d.gatefor"), (SD, "_valid", "d.valid"),
    (E.EditLearner, "apply", "p.eapply"), (E.EditLearner, "expect", "p.eexpect"),
    (S.SamIndex, "draft", "p.samdraft"), (G.CostGate, "record_shadow", "s.record"),
    (SD, "_pool_add", "s.pool"),
]:
    wrap(obj, name, label)


model = load_model("smollm2", backend="llamacpp", n_threads=2)
wrap(type(model), "forward", "forward")
table = table_for(model)[0]
prompts=[model.tokenizer.apply_chat_template([{"role": "user", "content": p.text}]) for p in load_task("free-form").prompts]
for rnd in range(3):
  for spec in (False, True):
    T.clear(); steps = 0
    for ids in prompts[:8]:
        src = SpeculationIndex(model.vocab_size) if spec else None
        dec = SpeculativeDecoder(model, source=src, options=SpecOptions(), cost_table=table)
        dec.append(ids)
        n = 0
        while n < 192:
            got = dec.step(192 - n); n += len(got); steps += 1
            if model.eos_token_ids & set(got): break
    print("spec" if spec else "plain", steps, " ".join(f"{k}={v/steps*1e6:.0f}" for k, v in sorted(T.items())), "step-fwd=%.0f" % ((T["step"]-T["forward"])/steps*1e6))
