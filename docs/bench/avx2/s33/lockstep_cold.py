"""Scratch (session 33): does the bench's lockstep charge --spec for a cold propose?

    PYTHONPATH=src python docs/bench/avx2/s33/lockstep_cold.py [ROUNDS]

SmolLM2, both cores, the held-out free-form prompts, 256 new tokens, every gate held off (no
verify). A decoder step is propose -> forward -> observe. Run alone, the next step's propose
follows this step's observe with warm caches; in the bench's lockstep the partner's forward
runs in between. Mean wall time outside the forward per step of: plain, idle --spec, and idle
--spec that proposes at the end of a step ("eager"), each run alone and in lockstep with a
plain partner on a second copy of the model.
"""

import json
import sys
import time
from pathlib import Path

from draftless import SpecOptions, SpeculativeDecoder, load_model, table_for
from draftless.gate import GateOptions
from draftless.sources.cascade import SpeculationIndex

HELDOUT = Path(__file__).resolve().parents[4] / "benchmarks/heldout-free-form.json"
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 2

model = load_model("smollm2", backend="llamacpp", n_threads=2)
twin = load_model("smollm2", backend="llamacpp", n_threads=2)
table = table_for(model)[0]
idle = SpecOptions(gate_options=GateOptions(min_speedup=100.0))


class Eager(SpeculativeDecoder):
    """Proposes the next step's draft at the end of a step (the measurement only: it keeps a
    proposal for the budget the next step will ask, which stream() makes predictable)."""

    _made = None

    def _step(self, carried, max_tokens, stop_ids):
        committed = super()._step(carried, max_tokens, stop_ids)
        left = max_tokens - len(committed)
        room = self.room()
        limit = left - 1 if room is None else min(left, room) - 1
        if left > 0 and committed[-1] not in stop_ids and limit >= self.options.min_draft:
            self._made = (
                len(self.history),
                self.source.propose(min(limit, self.options.max_draft)),
            )
        return committed

    def _draft(self, room, stop_ids=frozenset()):
        made, self._made = self._made, None
        if made is not None and made[0] == len(self.history):
            real = self.source.propose
            self.source.propose = lambda budget: made[1]
            try:
                return super()._draft(room, stop_ids)
            finally:
                self.source.propose = real
        return super()._draft(room, stop_ids)


def decoder(kind, m):
    if kind == "plain":
        return SpeculativeDecoder(m, options=SpecOptions(), cost_table=table)
    cls = Eager if kind == "eager" else SpeculativeDecoder
    return cls(m, source=SpeculationIndex(m.vocab_size), options=idle, cost_table=table)


kinds = ["plain", "spec", "eager"]
outside = {(k, mode): [0.0, 0] for k in kinds for mode in ("alone", "lockstep")}
for r in range(ROUNDS):
    for text in json.loads(HELDOUT.read_text()):
        ids = model.tokenizer.apply_chat_template([{"role": "user", "content": text}])
        for kind in kinds[r % 3 :] + kinds[: r % 3]:
            # alone
            model.truncate(0)
            dec = decoder(kind, model)
            dec.append(ids)
            t0 = time.perf_counter()
            for _ in dec.stream(256):
                pass
            o = outside[(kind, "alone")]
            o[0] += time.perf_counter() - t0 - dec.stats.forward_seconds
            o[1] += dec.stats.steps
            # lockstep with a plain partner on the twin
            model.truncate(0)
            twin.truncate(0)
            dec, partner = decoder(kind, model), decoder("plain", twin)
            dec.append(ids)
            partner.append(ids)
            spent = 0.0
            a, b = dec.stream(256), partner.stream(256)
            live_a = live_b = True
            while live_a or live_b:
                if live_a:
                    t0 = time.perf_counter()
                    live_a = next(a, None) is not None
                    spent += time.perf_counter() - t0
                if live_b:
                    live_b = next(b, None) is not None
            o = outside[(kind, "lockstep")]
            o[0] += spent - dec.stats.forward_seconds
            o[1] += dec.stats.steps
for mode in ("alone", "lockstep"):
    base = outside[("plain", mode)][0] / outside[("plain", mode)][1] * 1e6
    for kind in kinds:
        t, n = outside[(kind, mode)]
        us = t / n * 1e6
        over = f"({us - base:+6.1f} over plain)"
        print(f"{mode:8} {kind:6} {us:6.1f} us/step outside the forward {over}")
