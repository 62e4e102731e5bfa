"""Scratch: does stepping two decoders in turn (each its own model copy) cancel the machine's noise?
A/A (plain vs plain) and plain vs spec, lockstep vs sequential, SmolLM2, 2 threads."""
import sys, time, statistics, math
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3] / "src"))
from draftless import SpecOptions, SpeculativeDecoder, load_model, table_for
from draftless.bench.tasks import load_task
from draftless.sources.cascade import SpeculationIndex
name = sys.argv[1] if len(sys.argv) > 1 else "smollm2"
ma = load_model(name, backend="llamacpp", n_threads=2)
mb = load_model(name, backend="llamacpp", n_threads=2)
table = table_for(ma)[0]
texts = [p.text for p in load_task("free-form").prompts] + [p.text for p in load_task(str(__import__("pathlib").Path(__file__).resolve().parents[3] / "benchmarks/unseen-free-form")).prompts]
def stepper(model, ids, spec):
    model.truncate(0)
    dec = SpeculativeDecoder(model, source=SpeculationIndex(model.vocab_size) if spec else None, options=SpecOptions(), cost_table=table)
    dec.append(ids)
    return dec, dec.stream(192)
def lock(ids, spec_b):
    (da, ga), (db, gb) = stepper(ma, ids, False), stepper(mb, ids, spec_b)
    t = [0.0, 0.0]; first = [True, True]; live = [ga, gb]
    while any(live):
        for i in (0, 1):
            g = live[i]
            if g is None: continue
            t0 = time.perf_counter(); c = next(g, None); dt = time.perf_counter() - t0
            if c is None: live[i] = None; continue
            if first[i]: first[i] = False
            else: t[i] += dt
    return t[0] / t[1], db.stats.verify_steps
def seq(ids, spec_b):
    out = []
    for m, spec in ((ma, False), (mb, spec_b)):
        d, g = stepper(m, ids, spec); tt = 0.0; first = True
        while True:
            t0 = time.perf_counter(); c = next(g, None); dt = time.perf_counter() - t0
            if c is None: break
            if first: first = False
            else: tt += dt
        out.append(tt)
    return out[0] / out[1], d.stats.verify_steps
for label, f, spec in (("seq A/A", seq, False), ("lock A/A", lock, False), ("seq spec", seq, True), ("lock spec", lock, True)):
    rs = []
    for tx in texts:
        ids = ma.tokenizer.apply_chat_template([{"role": "user", "content": tx}])
        rs.append(f(ids, spec))
    r = [x for x, v in rs if v == 0]
    lg = [math.log(x) for x in r]
    print(f"{label:10} no-verify {len(r)}: gmean {math.exp(statistics.mean(lg)):.4f} sd {statistics.pstdev(lg):.4f} min {min(r):.3f} | all: " + " ".join(f"{x:.3f}" for x, _ in rs), flush=True)
