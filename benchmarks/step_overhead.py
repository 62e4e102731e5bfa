"""The decoder's own time per step, outside the model's forward: plain against --spec.

    PYTHONPATH=src python benchmarks/step_overhead.py [-m smollm2] [--threads 2] [--rounds 2]
        [--prompts bench|heldout]
    PYTHONPATH=src python benchmarks/step_overhead.py --cold

Decodes free-form prompts (the bench's, or benchmarks/heldout-free-form.json, which the bench
does not contain) plain and with the cascade and gate, alternating, and reports per step:
- the wall time minus the forward time the decoder records (`DecodeStats.forward_seconds`):
  sampling, drafting, the gate, shadow checks, the sources' updates, top-8 for recycling;
- the wall time minus the time inside llama.cpp's `llama_decode` alone, over the runs without
  a verify (the same forwards plain and --spec): this adds the forward's own Python (checking
  the ids, filling the batch, copying the logits out).
On a prompt the gate never verifies, --spec's extra time per step is the whole of its cost,
and on a small model's ~10-15 ms step it shows.

--cold: what a few calls cost as the first thing after a forward, which has streamed the
weights through every cache, against the same calls warm (median us over 100 forwards).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from draftless import SpecOptions, SpeculativeDecoder, load_model, table_for
from draftless.bench.tasks import load_task
from draftless.models import llamacpp
from draftless.sources.cascade import SpeculationIndex

HELDOUT = Path(__file__).resolve().parent / "heldout-free-form.json"


class _TimedLib:
    """llama_cpp's C API with llama_decode timed: the time inside llama.cpp alone."""

    def __init__(self, lib: Any) -> None:
        self._lib = lib
        self.seconds = 0.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._lib, name)

    def llama_decode(self, *args: Any) -> int:
        t0 = time.perf_counter()
        try:
            return int(self._lib.llama_decode(*args))
        finally:
            self.seconds += time.perf_counter() - t0


def overhead(args: argparse.Namespace) -> None:
    timed = llamacpp.lib = _TimedLib(llamacpp.lib)  # type: ignore[assignment]
    model = load_model(args.model, backend="llamacpp", n_threads=args.threads)
    table = table_for(model)[0]
    if args.prompts == "heldout":
        prompts = json.loads(HELDOUT.read_text())
    else:
        prompts = [p.text for p in load_task("free-form").prompts]
    outside: dict[bool, list[float]] = {False: [], True: []}  # us per step, per prompt
    forward: dict[bool, list[float]] = {False: [], True: []}
    no_decode: dict[bool, list[float]] = {False: [], True: []}  # runs without a verify
    for _ in range(args.rounds):
        for text in prompts:
            ids = model.tokenizer.apply_chat_template([{"role": "user", "content": text}])
            for spec in (False, True):
                source = SpeculationIndex(model.vocab_size) if spec else None
                dec = SpeculativeDecoder(
                    model, source=source, options=SpecOptions(), cost_table=table
                )
                dec.append(ids)
                timed.seconds = 0.0
                t0 = time.perf_counter()
                for _ in dec.stream(args.n):
                    pass
                wall = time.perf_counter() - t0
                s = dec.stats
                outside[spec].append((wall - s.forward_seconds) / s.steps * 1e6)
                forward[spec].append(s.forward_seconds / s.steps * 1e3)
                if s.verify_steps == 0:
                    no_decode[spec].append((wall - timed.seconds) / s.steps * 1e6)
    for spec in (False, True):
        print(
            f"{'--spec' if spec else 'plain':7} outside the forward: median "
            f"{statistics.median(outside[spec]):6.1f} us/step (max {max(outside[spec]):.1f}); "
            f"forward median {statistics.median(forward[spec]):.2f} ms/step"
        )
    extra = statistics.median(outside[True]) - statistics.median(outside[False])
    step = statistics.median(forward[False]) * 1e3
    print(f"--spec adds {extra:.0f} us/step: {100 * extra / step:.1f}% of a plain forward")
    for spec in (False, True):
        runs = no_decode[spec]
        if runs:
            print(
                f"{'--spec' if spec else 'plain':7} outside llama_decode, runs without a verify: "
                f"median {statistics.median(runs):.0f} us/step over {len(runs)} runs "
                f"(min {min(runs):.0f}, max {max(runs):.0f})"
            )


def cold(args: argparse.Namespace) -> None:
    model = load_model(args.model, backend="llamacpp", n_threads=args.threads)
    ids = model.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 80)
    rng = np.random.default_rng(0)
    probe = np.arange(4)
    calls = {
        "numpy: asarray, min, max, astype of 1 id": lambda: (
            np.asarray([ids[0]]).astype(np.int32).min() + np.asarray(probe).max()
        ),
        "the generator's state": lambda: rng.bit_generator.state,
        "python: a 50-step loop": lambda: sum(j * j for j in range(50)),
    }
    model.prefill(ids[:100])
    pos = 100
    for name, call in calls.items():
        first: list[float] = []
        warm: list[float] = []
        for _ in range(100):
            model.forward([ids[pos]])
            pos += 1
            for out in (first, warm):  # the same call twice: cold, then warm
                t0 = time.perf_counter()
                call()
                out.append((time.perf_counter() - t0) * 1e6)
        print(
            f"{name:42} first after a forward {statistics.median(first):6.1f} us, "
            f"again {statistics.median(warm):5.1f} us"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", default="smollm2")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("-n", type=int, default=192)
    ap.add_argument("--prompts", choices=("bench", "heldout"), default="bench")
    ap.add_argument("--cold", action="store_true", help="the cold-call probe only")
    args = ap.parse_args()
    if args.cold:
        cold(args)
    else:
        overhead(args)


if __name__ == "__main__":
    main()
