"""Scratch (session 32): what one full pass of the garbage collector costs a loaded process.

    PYTHONPATH=src python docs/bench/avx2/s32/gc_pass.py

SmolLM2 on llama.cpp, a --spec decode of one held-out prompt, then `gc.collect()` timed three
times; the same after `settle_heap()` (what the CLI does once the model is loaded).
"""

import gc
import json
import time
from pathlib import Path

from draftless import SpecOptions, SpeculativeDecoder, load_model, table_for
from draftless.cli.common import settle_heap
from draftless.sources.cascade import SpeculationIndex

model = load_model("smollm2", backend="llamacpp", n_threads=2)
table = table_for(model)[0]
text = json.loads(Path("benchmarks/heldout-free-form.json").read_text())[0]
ids = model.tokenizer.apply_chat_template([{"role": "user", "content": text}])


def decode_and_collect(label: str) -> None:
    dec = SpeculativeDecoder(
        model, source=SpeculationIndex(model.vocab_size), options=SpecOptions(), cost_table=table
    )
    dec.append(ids)
    dec.generate(64)
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        gc.collect()
        times.append((time.perf_counter() - t0) * 1e3)
    tracked = len(gc.get_objects())
    passes = " ".join(f"{t:.1f}" for t in times)
    print(
        f"{label:22} full pass {passes} ms; {tracked} objects tracked, "
        f"{gc.get_freeze_count()} frozen"
    )


decode_and_collect("loaded")
settle_heap()
decode_and_collect("after settle_heap()")
