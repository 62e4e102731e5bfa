"""Bench reports side by side, prompt by prompt: draftless's speedup over its own plain, its
verify steps and accepted/drafted tokens (summed over reps), then each task's median and worst.

    python benchmarks/ab_table.py RUN_A1 RUN_B1 RUN_A2 RUN_B2     # `draftless bench --out` dirs

Two runs of the same tree that made the same verifies (the same counts) and read different
speedups show the noise of a per-prompt ratio on this machine; runs of two trees that made
different verifies show what the change decided.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def rows_of(run: Path) -> dict[str, tuple[float, int, int, int]]:
    """task/prompt -> (speedup, verify steps, accepted, drafted) of draftless in one report."""
    data = json.loads((run / "results.json").read_text())
    rows = {}
    for backend in data["backends"]:
        for task in backend["tasks"]:
            for prompt in task["prompts"]:
                m = prompt["methods"]["draftless"]
                s = m["stats"]
                key = f"{task['task']}/{prompt['prompt_id']}"
                rows[key] = (m["speedup"], s["verify_steps"], s["accepted"], s["drafted"])
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    args = ap.parse_args()
    runs = [rows_of(r) for r in args.runs]
    keys = [k for k in runs[0] if all(k in r for r in runs)]
    print(f"{'':34}" + "".join(f"{r.name:>22}" for r in args.runs))
    for key in keys:
        cells = "".join(
            f"{r[key][0]:>9.3f} ({r[key][1]}v {r[key][2]}/{r[key][3]})".rjust(22) for r in runs
        )
        print(f"{key:34.34}{cells}")
    for task in dict.fromkeys(k.split("/")[0] for k in keys):
        cells = ""
        for r in runs:
            values = [r[k][0] for k in keys if k.startswith(task + "/")]
            cells += f"{statistics.median(values):.3f} / {min(values):.3f}".rjust(22)
        print(f"{task + ' median / worst':34.34}{cells}")


if __name__ == "__main__":
    main()
