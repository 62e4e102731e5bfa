"""Scratch: the lockstep A/A's bias: model copy or turn order?"""
import sys, time, statistics, math
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3] / "src"))
from draftless import SpecOptions, SpeculativeDecoder, load_model, table_for
from draftless.bench.tasks import load_task
name = sys.argv[1] if len(sys.argv) > 1 else "smollm2"
ma = load_model(name, backend="llamacpp", n_threads=2)
mb = load_model(name, backend="llamacpp", n_threads=2)
table = table_for(ma)[0]
texts = [p.text for p in load_task("free-form").prompts][:12]
def stepper(model, ids):
    model.truncate(0)
    dec = SpeculativeDecoder(model, source=None, options=SpecOptions(), cost_table=table)
    dec.append(ids)
    return dec.stream(192)
def lock(ids, m0, m1, abba):
    live = [stepper(m0, ids), stepper(m1, ids)]; t = [0.0, 0.0]; first = [True, True]; r = 0
    while any(live):
        order = (1, 0) if abba and r % 2 else (0, 1); r += 1
        for i in order:
            g = live[i]
            if g is None: continue
            t0 = time.perf_counter(); c = next(g, None); dt = time.perf_counter() - t0
            if c is None: live[i] = None; continue
            if first[i]: first[i] = False
            else: t[i] += dt
    return t[0] / t[1]
for label, m0, m1, abba in (("a,b abab", ma, mb, False), ("b,a abab", mb, ma, False), ("a,b abba", ma, mb, True), ("b,a abba", mb, ma, True), ("a,a abab", ma, ma, False)):
    if m0 is m1:
        continue
    rs = [lock(ma.tokenizer.apply_chat_template([{"role": "user", "content": tx}]), m0, m1, abba) for tx in texts]
    lg = [math.log(x) for x in rs]
    print(f"{label}: gmean {math.exp(statistics.mean(lg)):.4f} sd {statistics.pstdev(lg):.4f} min {min(rs):.3f} max {max(rs):.3f}", flush=True)
