"""Benchmarks of the draft sources: SAM memory, reference build speed, cascade overhead.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_sources.py [--tokens 1000000]

Needs no model. The token streams:

* code: the Python standard library's own source, split into words and punctuation, each
  distinct piece one token id (first come, first numbered). Real text with the repetition
  real text has; deterministic for a given Python version.
* random: uniform ids over a 32,000 vocabulary (no repetition: the SAM's hardest case for
  memory per token is not this one, code is).

What it prints:

1. SAM bytes per token after building the conversation index online (4 tokens per
   observe, as a decoder feeds it) over the whole stream; allocated capacity, all arrays.
2. Frozen reference build throughput: SamIndex.frozen_from(tokens), best of 3, tokens/s.
   Also from CPU time, which a busy machine (other jobs on the same cores) distorts less.
3. Cascade overhead per committed token: a simulated decode over the code stream
   (propose -> verify against the true continuation -> observe_topk -> observe) with two
   reference documents and recycling, timing only the index calls, in microseconds.
4. The decoder's own work per verify row, beside the model's: the sampler (greedy, and
   t=0.7 with top-p) and the top-8 extraction that feeds recycling, on rows of SmolLM2's
   (49,152) and Gemma 3's (262,144) vocabulary: model-like rows (a head of likely tokens
   over a Gaussian floor) and a flat Gaussian row (no head: the draw reaches deep); medians
   of CPU time.
"""

from __future__ import annotations

import argparse
import platform
import re
import sys
import sysconfig
import time
from functools import partial
from pathlib import Path

import numpy as np

from draftless._jit import HAVE_NUMBA
from draftless.decoder import TOPK, topk_rows
from draftless.sampling import SamplingOptions, apply_penalties, candidates, sample
from draftless.sources import SamIndex, SpeculationIndex

PLAIN_STEP_US = 10_000.0  # a plain decode step of the default model on llama.cpp, ~10 ms


def code_stream(n_tokens: int) -> tuple[np.ndarray, int]:
    """[n_tokens] int32 ids of the standard library source, and the vocabulary size."""
    root = Path(sysconfig.get_paths()["stdlib"])
    vocab: dict[str, int] = {}
    ids: list[int] = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        ids += [vocab.setdefault(w, len(vocab)) for w in re.findall(r"\w+|[^\w\s]", text)]
        if len(ids) >= n_tokens:
            break
    return np.array(ids[:n_tokens], dtype=np.int32), len(vocab)


def bench_memory(name: str, stream: np.ndarray) -> None:
    index = SamIndex()
    start = time.perf_counter()
    for i in range(0, len(stream), 4):
        index.extend(stream[i : i + 4])
    seconds = time.perf_counter() - start
    n = len(stream)
    online = index.nbytes / n
    index.freeze()
    print(
        f"  {name:6s} n={n:,}: {online:6.1f} B/token online, {index.nbytes / n:6.1f} frozen; "
        f"states {index.n_states / n:.2f} n, transitions {index.n_transitions / n:.2f} n; "
        f"online build {seconds / n * 1e6:.2f} us/token"
    )


def bench_build(name: str, stream: np.ndarray, sizes: list[int]) -> None:
    for size in sizes:
        tokens = stream[:size]
        wall = cpu = float("inf")
        for _ in range(3):
            start, start_cpu = time.perf_counter(), time.process_time()
            SamIndex.frozen_from(tokens)
            wall = min(wall, time.perf_counter() - start)
            cpu = min(cpu, time.process_time() - start_cpu)
        print(
            f"  {name:6s} {size:>9,} tokens: {size / wall / 1e6:5.2f} M tokens/s "
            f"(CPU time: {size / cpu / 1e6:5.2f})"
        )


def bench_cascade(stream: np.ndarray, vocab: int, steps: int) -> None:
    """A decode simulation; only the index calls are timed."""
    rng = np.random.default_rng(0)
    prompt, truth = stream[:2_000], stream[2_000:]
    refs = [stream[50_000:70_000], truth[5_000:15_000]]  # the second one gets quoted
    index = SpeculationIndex(vocab)
    for ref in refs:
        index.add_reference(ref)
    index.observe(prompt)
    pos = committed = drafted = accepted = n_steps = 0
    elapsed = elapsed_cpu = 0.0
    by_member: dict[str, list[int]] = {}  # member: [accepted, drafted]
    while n_steps < steps and pos + 64 < len(truth):
        t0, c0 = time.perf_counter(), time.process_time()
        proposal = index.propose(16)
        draft = proposal.tokens if proposal is not None else []
        by_member.setdefault(proposal.member if proposal else "-", [0, 0])[1] += len(draft)
        elapsed += time.perf_counter() - t0
        elapsed_cpu += time.process_time() - c0
        # The model: accept the longest correct prefix, then one corrected/bonus token.
        target = truth[pos : pos + len(draft) + 1].tolist()
        n_ok = 0
        while n_ok < len(draft) and draft[n_ok] == target[n_ok]:
            n_ok += 1
        by_member[proposal.member if proposal else "-"][0] += n_ok
        step = target[: n_ok + 1]
        rows = np.array([int(truth[pos - 1]) if pos else int(prompt[-1]), *draft[:n_ok]])
        topk = rng.integers(0, vocab, (len(rows), 8)).astype(np.int32)
        topk[:, 0] = step  # row i's top-1 is what the model committed after it
        t0, c0 = time.perf_counter(), time.process_time()
        index.observe_topk(rows, topk)
        index.observe(step)
        elapsed += time.perf_counter() - t0
        elapsed_cpu += time.process_time() - c0
        pos += len(step)
        committed += len(step)
        drafted += len(draft)
        accepted += n_ok
        n_steps += 1
    per_token = elapsed / committed * 1e6
    print(
        f"  {n_steps:,} steps, {committed:,} committed tokens, {accepted / max(drafted, 1):.0%} "
        f"of {drafted:,} drafted accepted, {committed / n_steps:.2f} tokens/step"
    )
    print(
        f"  overhead {per_token:.1f} us per committed token, {elapsed / n_steps * 1e6:.1f} us "
        f"per step = {elapsed / n_steps * 1e6 / PLAIN_STEP_US:.2%} of a 10 ms plain step "
        f"(CPU time: {elapsed_cpu / committed * 1e6:.1f} us per committed token)"
    )
    for name, (ok, total) in sorted(by_member.items()):
        print(f"    {name:13s} accepted {ok:6,} / drafted {total:6,}")


def _median_cpu_us(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.process_time_ns()
        fn()
        times.append(time.process_time_ns() - start)
    return float(np.median(times)) / 1e3


def model_like_row(rng: np.random.Generator, vocab: int) -> np.ndarray:
    """Logits [vocab] with a head of 32 likely tokens over a Gaussian floor, as a language
    model's next-token row has (at t=0.7 the head holds nearly all the mass)."""
    row = rng.standard_normal(vocab) * 2.0
    head = rng.choice(vocab, 32, replace=False)
    row[head] += 14.0 - 3.0 * np.log1p(np.arange(32))
    return row.astype(np.float32)


def full_sort_sample(
    logits: np.ndarray, history: list[int], options: SamplingOptions, rng: np.random.Generator
) -> int:
    """The same draw by the definition: sort the whole row (`candidates`), inverse CDF."""
    ids, probs, mass = candidates(apply_penalties(logits, history, options), options)
    pick = int(np.searchsorted(np.cumsum(probs), rng.random() * mass, side="right"))
    return int(ids[min(pick, len(ids) - 1)])


def bench_rows(reps: int) -> None:
    """The sampler and top-k per row, in microseconds of CPU time."""
    rng = np.random.default_rng(0)
    greedy = SamplingOptions()
    sampled = SamplingOptions(temperature=0.7, top_p=0.95, seed=0)
    history = rng.integers(0, 1000, 256).tolist()
    for vocab in (49_152, 262_144):
        rows = np.stack([model_like_row(rng, vocab) for _ in range(8)])  # [8, vocab]
        flat = (rng.standard_normal(vocab) * 3.0).astype(np.float32)  # no head: the worst case
        row = rows[0]
        g = _median_cpu_us(partial(sample, row, history, greedy, rng), reps)
        t = _median_cpu_us(partial(sample, row, history, sampled, rng), reps)
        tf = _median_cpu_us(partial(sample, flat, history, sampled, rng), reps)
        full = _median_cpu_us(partial(full_sort_sample, row, history, sampled, rng), reps)
        k1 = _median_cpu_us(partial(topk_rows, rows[:1], TOPK), reps)
        k8 = _median_cpu_us(partial(topk_rows, rows, TOPK), reps)
        print(
            f"  vocab {vocab:>7,}: sample greedy {g:6.1f} us, t=0.7 top-p=0.95 {t:6.1f} us "
            f"(a flat row: {tf:7.1f} us; sorting the whole row: {full:7.1f} us); "
            f"top-{TOPK} of 1 row {k1:6.1f} us, of 8 rows {k8:6.1f} us"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=1_000_000, help="stream length")
    parser.add_argument("--steps", type=int, default=20_000, help="simulated decode steps")
    args = parser.parse_args()
    n = args.tokens if HAVE_NUMBA else min(args.tokens, 20_000)
    print(
        f"draftless.sources benchmark: Python {platform.python_version()}, numpy "
        f"{np.__version__}, numba {'on' if HAVE_NUMBA else 'OFF (plain Python, small n)'}"
    )
    start = time.perf_counter()
    code, vocab = code_stream(n)
    rand = np.random.default_rng(0).integers(0, 32_000, n).astype(np.int32)
    print(
        f"streams: code {len(code):,} tokens ({vocab:,} distinct), random {n:,} "
        f"({time.perf_counter() - start:.1f} s)"
    )
    SamIndex.frozen_from(code[:1_000]).cursor().advance(code[:10])  # compile / load the JIT

    print("\n1. SAM memory (target ~110 B/token)")
    for name, stream in (("code", code), ("random", rand)):
        bench_memory(name, stream)
    print("\n2. Frozen reference build throughput (target >= 1M tokens/s)")
    sizes = [s for s in (10_000, 100_000, 1_000_000) if s <= n] or [n]
    for name, stream in (("code", code), ("random", rand)):
        bench_build(name, stream, sizes)
    print(
        "\n3. Cascade overhead: observe + propose (+ observe_topk) per committed token "
        "(target < 200 us)"
    )
    bench_cascade(code, vocab, args.steps if HAVE_NUMBA else 500)
    print("\n4. The decoder's own work per verify row (sampler, top-k for recycling)")
    bench_rows(reps=50)
    print(f"\ntotal {time.perf_counter() - start:.1f} s")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
