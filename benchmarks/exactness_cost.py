"""What bitwise exactness costs on llama.cpp: C(k) under draftless' exact configuration and
under llama.cpp's defaults (what llama-server runs), on one model and thread count.

    PYTHONPATH=src .venv/bin/python benchmarks/exactness_cost.py exact --threads 1
    PYTHONPATH=src .venv/bin/python benchmarks/exactness_cost.py llama.cpp --threads 1
    PYTHONPATH=src .venv/bin/python benchmarks/exactness_cost.py exact-no-repack --threads 2
    PYTHONPATH=src .venv/bin/python benchmarks/exactness_cost.py exact --widths --reps 20

(`--widths` with no k times the plain step only. To compare two llama.cpp builds, unzip each
wheel's `llama_cpp/` into a directory and put that directory first on PYTHONPATH.)

One configuration per process: ggml reads GGML_CPU_TILED_MM once. Prefill `--context` tokens
(300) of this repository's README, then time forward(k) from that position (truncated back
after each): the median of `--reps` for k in 2..64, over the median of 3 x `--reps` single
steps. Prints one
line: the plain step in ms and C(k) in plain steps, plus the absolute ms of the widest verify,
which is what compares across configurations (each C(k) is relative to its own plain step).

    exact      models/llamacpp.py as shipped: FA on, K f16 / V bf16, repacked weights where
               the build has patches/llama.cpp/0005 (none on a stock build), tiled K-quant
               matmul off (a verify row equals the single-token row, bitwise)
    exact-no-repack  exact with the weights as in the file (no CPU_REPACK): what draftless ran
               before 0005, to price that one switch (on an AVX-512 machine it was the whole
               gap between our plain step and llama.cpp's)
    llama.cpp  llama.cpp's defaults: FA auto, K and V f16, repacked weights, tiled matmul on
               (rows of a batch differ from single-token rows: benchmarks/llamacpp_exact_rows.py)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

WIDTHS = (2, 4, 8, 16, 32, 64)


def load_model(config: str, name: str, threads: int):  # type: ignore[no-untyped-def]
    """The model under `config`: "exact" (as shipped), "exact-no-repack" (weights as in the
    file) or "llama.cpp" (its defaults). One configuration per process: ggml reads
    GGML_CPU_TILED_MM once."""
    if config == "llama.cpp":
        os.environ["GGML_CPU_TILED_MM"] = "1"  # before llamacpp's import sets it to 0

    from draftless.models import llamacpp
    from draftless.models.llamacpp import LlamaCppModel
    from draftless.models.registry import resolve

    if config == "llama.cpp":  # llamacpp_exact_rows.py's `today`: llama.cpp's defaults
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from llamacpp_exact_rows import CONFIGS

        context_params, model_params = CONFIGS["today"]
        llamacpp.EXACT_CONTEXT_PARAMS.update(context_params)
        llamacpp.EXACT_MODEL_PARAMS.update(model_params)
    elif config == "exact-no-repack":
        llamacpp.EXACT_MODEL_PARAMS.update({"use_extra_bufts": False})
    return LlamaCppModel.load(resolve(name), n_ctx=2048, n_threads=threads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", choices=("exact", "exact-no-repack", "llama.cpp"))
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--context", type=int, default=300, help="tokens in the cache first")
    parser.add_argument(
        "--widths", type=int, nargs="*", default=list(WIDTHS), help="k to time (none: the step)"
    )
    args = parser.parse_args()
    model = load_model(args.config, args.model, args.threads)
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    ids = model.tokenizer.encode(text * 4)[: args.context + max(args.widths, default=1)]
    c = args.context
    model.prefill(ids[:c])

    def seconds(k: int, reps: int) -> float:
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            model.forward(ids[c : c + k])
            times.append(time.perf_counter() - t0)
            model.truncate(c)
        return statistics.median(times)

    seconds(1, 3)  # warm-up
    step = seconds(1, 3 * args.reps)
    costs = {k: seconds(k, args.reps) for k in args.widths}
    cells = " ".join(f"C({k})={costs[k] / step:.2f}" for k in args.widths)
    widest = f" (forward({max(costs)}) {1000 * costs[max(costs)]:.0f} ms)" if costs else ""
    print(
        f"{args.config} {args.model} threads={args.threads} context={c}: "
        f"step {1000 * step:.1f} ms {cells}{widest}",
        flush=True,
    )
    model.close()
    sys.exit(0)


if __name__ == "__main__":
    main()
