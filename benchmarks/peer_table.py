"""Draftless against llama-server's speculative modes in absolute decode tok/s, per prompt, from a
`draftless bench` report (results.json) that ran the `lsrv-*` peers.

    PYTHONPATH=src .venv/bin/python benchmarks/peer_table.py bench-out/results.json

Prints a markdown table: each prompt's decode tok/s (the median of its reps) for draftless
plain, llama-server plain and their ratio, draftless and each llama-server speculative peer
(ngram modes, the draft model; each over its own plain in brackets), and draftless over the
best ngram peer on that prompt (over the best peer when the report ran no ngram mode); then,
per task, the median and worst of that last ratio and of the plain ratio; then, per task,
every method's speedup over its own plain (median / worst prompt), the peers not only ngram.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path)
    args = parser.parse_args()
    backend = json.loads(args.report.read_text())["backends"][0]
    tasks = backend["tasks"]
    names = sorted(
        {
            m
            for t in tasks
            for p in t["prompts"]
            for m in p["methods"]
            if m.startswith("lsrv-") and m != "lsrv-plain"
        }
    )
    ngram = [n for n in names if n.startswith("lsrv-ngram")]
    best_of, best_label = (ngram, "ngram") if ngram else (names, "llama-server peer")
    if not best_of:
        raise SystemExit(f"{args.report}: no llama-server speculative peer ran")
    head = ["prompt", "draftless plain", "llama-server plain", "plain ratio", "draftless"]
    head += [n.removeprefix("lsrv-") for n in names] + [f"draftless / best {best_label}"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    summary = []
    for task in tasks:
        over_best, plain_ratio = [], []
        for p in task["prompts"]:
            m = p["methods"]
            tps = {k: v["tokens_per_second"] for k, v in m.items()}
            ours, plain, lsrv = tps["draftless"], tps["plain"], tps["lsrv-plain"]
            best = max(tps[n] for n in best_of)
            over_best.append(ours / best)
            plain_ratio.append(plain / lsrv)
            cells = [f"{task['task']}: {p['prompt_id']}", f"{plain:.1f}", f"{lsrv:.1f}"]
            cells += [f"{plain / lsrv:.2f}", f"{ours:.1f} ({m['draftless']['speedup']:.2f}x)"]
            cells += [f"{tps[n]:.1f} ({m[n]['speedup']:.2f}x)" for n in names]
            cells.append(f"{ours / best:.2f}")
            print("| " + " | ".join(cells) + " |")
        summary.append((task["task"], over_best, plain_ratio))
    print()
    for name, over_best, plain_ratio in summary:
        print(
            f"{name}: draftless / best {best_label} median {statistics.median(over_best):.2f}, "
            f"worst {min(over_best):.2f}; plain ratio median {statistics.median(plain_ratio):.2f}, "
            f"worst {min(plain_ratio):.2f}"
        )
    print()
    methods = [  # every method with a speedup (a baseline has none), in the report's order
        m
        for m in tasks[0]["prompts"][0]["methods"]
        if any(
            p["methods"].get(m, {}).get("speedup") is not None for t in tasks for p in t["prompts"]
        )
    ]
    print("| task (prompts) | " + " | ".join(methods) + " |")
    print("|" + "---|" * (len(methods) + 1))
    for task in tasks:
        cells = [f"{task['task']} ({len(task['prompts'])})"]
        for name in methods:
            speedups = [
                p["methods"][name]["speedup"]
                for p in task["prompts"]
                if name in p["methods"] and p["methods"][name]["speedup"] is not None
            ]
            if speedups:
                cells.append(f"{statistics.median(speedups):.2f} / {min(speedups):.2f}")
            else:
                cells.append("n/a")
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
