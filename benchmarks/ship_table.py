"""The llama.cpp table shipped in costs.py: the median of three `costs.measure` runs at every
width, SmolLM2 on llama.cpp at the default threads.

    PYTHONPATH=src python benchmarks/ship_table.py [-m smollm2] [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics

from draftless import load_model
from draftless.costs import PROBE_KS, measure


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", default="smollm2")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    model = load_model(args.model, backend="llamacpp")
    print(f"{model.name}, {model.threads} thread(s), {getattr(model, 'kernels', '')}")
    runs = [measure(model).table for _ in range(args.runs)]
    for table in runs:
        print("  run:", " ".join(f"C({k})={table.cost(k):.2f}" for k in (2, 3, 4, 8, 16, 32, 65)))
    print("ks:", PROBE_KS)
    print("costs:", [round(statistics.median(t.cost(k) for t in runs), 2) for k in PROBE_KS])


if __name__ == "__main__":
    main()
