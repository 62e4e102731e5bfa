"""Scratch (session 31): what an idle --spec decoder costs a step, piece by piece.

    PYTHONPATH=src python docs/bench/avx2/s31/idle_overhead.py

SmolLM2, both cores, benchmarks/heldout-free-form.json twice, 256 new tokens, no verify in any
run; wall time outside the forward per step (`DecodeStats.forward_seconds`), median over the
runs, for four decoders on the same prompt one after the other:
- plain: no source;
- source-doing-nothing: a source that never drafts and ignores what it is told (the decoder's
  own scaffolding);
- observe-only: the cascade told every committed token (the conversation's suffix automaton,
  the edit learner, recycling's bigrams), never asked for a draft;
- spec-idle: the cascade and the gates as shipped, every gate held off (min_speedup 100):
  drafts made every step, shadow-checked, never verified.
"""

import json
import statistics
import time
from pathlib import Path

from draftless import SpecOptions, SpeculativeDecoder, load_model, table_for
from draftless.gate import GateOptions
from draftless.sources.cascade import SpeculationIndex

HELDOUT = Path(__file__).resolve().parents[4] / "benchmarks/heldout-free-form.json"

model = load_model("smollm2", backend="llamacpp", n_threads=2)
table = table_for(model)[0]


class ObserveOnly:
    wants_topk = False
    topk_member = None

    def __init__(self) -> None:
        self.inner = SpeculationIndex(model.vocab_size)

    def propose(self, budget):
        return None

    def observe(self, committed) -> None:
        self.inner.observe(committed)

    def observe_topk(self, token_ids, topk_ids) -> None:
        pass


class Nothing(ObserveOnly):
    def observe(self, committed) -> None:
        pass


variants = {
    "plain": lambda: (None, SpecOptions()),
    "source-doing-nothing": lambda: (Nothing(), SpecOptions()),
    "observe-only": lambda: (ObserveOnly(), SpecOptions()),
    "spec-idle": lambda: (
        SpeculationIndex(model.vocab_size),
        SpecOptions(gate_options=GateOptions(min_speedup=100.0)),
    ),
}
out: dict[str, list[float]] = {k: [] for k in variants}
for _ in range(2):
    for text in json.loads(HELDOUT.read_text()):
        ids = model.tokenizer.apply_chat_template([{"role": "user", "content": text}])
        for name, make in variants.items():
            source, options = make()
            dec = SpeculativeDecoder(model, source=source, options=options, cost_table=table)
            dec.append(ids)
            t0 = time.perf_counter()
            for _ in dec.stream(256):
                pass
            wall = time.perf_counter() - t0
            s = dec.stats
            assert s.verify_steps == 0
            out[name].append((wall - s.forward_seconds) / s.steps * 1e6)
for name, values in out.items():
    print(
        f"{name:20} outside the forward: median {statistics.median(values):6.1f} us/step "
        f"(min {min(values):.1f}, max {max(values):.1f}) over {len(values)} runs"
    )
