"""What a change of batch shape costs a llama.cpp forward: a 1-token forward after another
and after a k-token one, and a k-token forward after another and after a 1-token one.

    PYTHONPATH=src python benchmarks/shape_switch.py [-m smollm2] [--threads 2] [-k 3 8]

llama.cpp reuses the last compute graph only for a batch of the same shape, so a verify
between plain steps rebuilds it twice: going in and coming out (SmolLM2, both cores: 0.12-0.15
plain steps a verify; median of 30 rounds, 256 tokens of context). `costs.measure` times each
width in its own shape and does not count them. A probe that did (each rep a plain step, the
verify, the plain step after it) was tried: its tables came out 12-15% dearer at every width,
mostly from the plain step it divided by on that run, and the gate on them gave up copies,
renames and RAG on SmolLM2 (before / after, two alternating rounds: copy median 1.62, 1.55 ->
1.47, 1.38) and held free-form no better (worst 0.96, 0.96 -> 0.91, 0.95). Not kept.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from draftless import load_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", default="smollm2")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("-k", type=int, nargs="+", default=[3, 8])
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    model = load_model(args.model, backend="llamacpp", n_threads=args.threads)
    filler = np.random.default_rng(0).integers(1000, 20000, size=256 + max(args.k)).tolist()
    ctx = 256
    model.truncate(0)
    model.prefill(filler[:ctx])

    def timed(k: int) -> float:
        t0 = time.perf_counter()
        model.forward(filler[ctx : ctx + k])
        dt = time.perf_counter() - t0
        model.truncate(ctx)
        return dt

    for k in args.k:
        one_one, one_k, k_k, k_one = [], [], [], []
        for _ in range(args.rounds):
            timed(1)
            one_one.append(timed(1))  # 1 after 1
            k_one.append(timed(k))  # k after 1
            k_k.append(timed(k))  # k after k
            one_k.append(timed(1))  # 1 after k

        def ms(xs: list[float]) -> float:
            return statistics.median(xs) * 1e3

        switches = (ms(one_k) - ms(one_one) + ms(k_one) - ms(k_k)) / ms(one_one)
        print(
            f"k={k}: forward(1) after 1 {ms(one_one):.3f} ms, after {k} {ms(one_k):.3f} ms | "
            f"forward({k}) after {k} {ms(k_k):.3f} ms, after 1 {ms(k_one):.3f} ms | "
            f"a verify's two switches: {switches:.3f} plain steps"
        )


if __name__ == "__main__":
    main()
