"""The decoder's own time per step, outside the model's forward: plain against --spec.

    PYTHONPATH=src python benchmarks/step_overhead.py [-m smollm2] [--threads 2] [--rounds 2]

Decodes the bench's free-form prompts plain and with the cascade and gate, alternating, and
reports per step the wall time minus the forward time the decoder itself records
(`DecodeStats.forward_seconds`): sampling, drafting, the gate, shadow checks, the sources'
updates, top-8 for recycling. On a prompt the gate never verifies, --spec's extra time per
step is the whole of its cost, and on a small model's ~10 ms step it shows.
"""

from __future__ import annotations

import argparse
import statistics
import time

from draftless import SpecOptions, SpeculativeDecoder, load_model, table_for
from draftless.bench.tasks import load_task
from draftless.sources.cascade import SpeculationIndex


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", default="smollm2")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("-n", type=int, default=192)
    args = ap.parse_args()
    model = load_model(args.model, backend="llamacpp", n_threads=args.threads)
    table = table_for(model)[0]
    prompts = [p.text for p in load_task("free-form").prompts]
    outside: dict[bool, list[float]] = {False: [], True: []}  # us per step, per prompt
    forward: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.rounds):
        for text in prompts:
            ids = model.tokenizer.apply_chat_template([{"role": "user", "content": text}])
            for spec in (False, True):
                source = SpeculationIndex(model.vocab_size) if spec else None
                dec = SpeculativeDecoder(
                    model, source=source, options=SpecOptions(), cost_table=table
                )
                dec.append(ids)
                t0 = time.perf_counter()
                for _ in dec.stream(args.n):
                    pass
                wall = time.perf_counter() - t0
                s = dec.stats
                outside[spec].append((wall - s.forward_seconds) / s.steps * 1e6)
                forward[spec].append(s.forward_seconds / s.steps * 1e3)
    for spec in (False, True):
        print(
            f"{'--spec' if spec else 'plain':7} outside the forward: median "
            f"{statistics.median(outside[spec]):6.1f} us/step (max {max(outside[spec]):.1f}); "
            f"forward median {statistics.median(forward[spec]):.2f} ms/step"
        )
    extra = statistics.median(outside[True]) - statistics.median(outside[False])
    step = statistics.median(forward[False]) * 1e3
    print(f"--spec adds {extra:.0f} us/step: {100 * extra / step:.1f}% of a plain forward")


if __name__ == "__main__":
    main()
