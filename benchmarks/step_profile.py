"""Where a plain llama.cpp step's CPU time goes, and whether two llama.cpp builds compute the
same logits: the two measurements behind patches/llama.cpp/0002.

    PYTHONPATH=src .venv/bin/python benchmarks/step_profile.py profile exact --threads 2
    PYTHONPATH=src .venv/bin/python benchmarks/step_profile.py profile llama.cpp --threads 2
    PYTHONPATH=src .venv/bin/python benchmarks/step_profile.py logits OUT.npy --threads 2

profile: prefill `--context` tokens (700) of this repository's README, attach `perf record` to
this process, run `--steps` (60) single-token forwards, and print perf's shares by symbol.
Wall time on a shared machine moves by ~20% from run to run; the shares do not, and the Q6_K
kernel, which both configurations run unchanged, is the yardstick to compare them in.
Needs `perf` on PATH. `exact` and `llama.cpp` are the configurations of exactness_cost.py.

logits: a 16-token verify and 8 single steps after 600 tokens of the README, saved as one
float32 array [24, vocab]. Run it with two builds (an unzipped wheel's `llama_cpp/` first on
PYTHONPATH) and compare the files' bytes.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from exactness_cost import load_model

README = Path(__file__).resolve().parents[1] / "README.md"


def profile(args: argparse.Namespace) -> None:
    model = load_model(args.config, args.model, args.threads)
    ids = model.tokenizer.encode(README.read_text() * 4)[: args.context + args.steps]
    model.prefill(ids[: args.context])
    with tempfile.TemporaryDirectory() as tmp:
        data = str(Path(tmp) / "perf.data")
        perf = subprocess.Popen(
            ["perf", "record", "-F", "999", "-p", str(os.getpid()), "-o", data],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)  # perf attaches
        t0, c0 = time.perf_counter(), time.process_time()
        for i in range(args.steps):
            model.forward(ids[args.context + i : args.context + i + 1])
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        perf.send_signal(signal.SIGINT)
        perf.wait()
        report = subprocess.run(
            ["perf", "report", "-i", data, "--no-children", "--sort", "symbol", "--stdio"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    print(
        f"{args.config} {args.model} threads={args.threads} context={args.context}: "
        f"{1000 * wall / args.steps:.1f} ms/step wall, {1000 * cpu / args.steps:.1f} ms/step CPU"
    )
    rows = [line for line in report.splitlines() if line.strip() and not line.startswith("#")]
    print("\n".join(rows[: args.top]))
    model.close()


def logits(args: argparse.Namespace) -> None:
    import numpy as np

    model = load_model("exact", args.model, args.threads)
    ids = model.tokenizer.encode(README.read_text() * 4)
    model.prefill(ids[:600])
    rows = [model.forward(ids[600:616])]
    rows += [model.forward(ids[i : i + 1]) for i in range(616, 624)]
    np.save(args.out, np.concatenate(rows))
    model.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("profile")
    p.add_argument("config", choices=("exact", "llama.cpp"))
    p.add_argument("--context", type=int, default=700)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--top", type=int, default=12, help="symbols to print")
    q = sub.add_parser("logits")
    q.add_argument("out")
    for parser_ in (p, q):
        parser_.add_argument("--model", default="qwen2.5-coder-1.5b")
        parser_.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if args.command == "profile":
        profile(args)
    else:
        logits(args)


if __name__ == "__main__":
    main()
