"""Bench reports side by side, prompt by prompt: draftless's speedup over its own plain, its
verify steps and accepted/drafted tokens (summed over reps), then each task's median and worst.

    python benchmarks/ab_table.py RUN_A1 RUN_B1 RUN_A2 RUN_B2     # `draftless bench --out` dirs

Two runs of the same tree that made the same verifies (the same counts) and read different
speedups show the noise of a per-prompt ratio on this machine; runs of two trees that made
different verifies show what the change decided. So each task's median and worst are also
given as the verifies model them by the report's cost table (`report.modeled_speedup`), free
of the machine's noise, and with `--verify-extra X`, with X plain steps more a verify (what a
verify costs beyond the table: `verify_price.py`).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from verify_price import stats_of, table_of

from draftless.bench.report import modeled_speedup


def rows_of(run: Path, extra: float = 0.0) -> dict[str, tuple[float, int, int, int, float]]:
    """task/prompt -> (speedup, verify steps, accepted, drafted, modeled speedup with `extra`
    plain steps a verify) of draftless in one report."""
    data = json.loads((run / "results.json").read_text())
    rows = {}
    for backend in data["backends"]:
        table = table_of(backend["cost_table"], extra)  # C(1) stays a plain step
        for task in backend["tasks"]:
            for prompt in task["prompts"]:
                m = prompt["methods"]["draftless"]
                s = m["stats"]
                key = f"{task['task']}/{prompt['prompt_id']}"
                modeled = modeled_speedup(stats_of(s), table) or 1.0
                rows[key] = (m["speedup"], s["verify_steps"], s["accepted"], s["drafted"], modeled)
    return rows


def _medians(runs: list[dict], keys: list[str], column: int, label: str) -> None:
    for task in dict.fromkeys(k.split("/")[0] for k in keys):
        cells = ""
        for r in runs:
            values = [r[k][column] for k in keys if k.startswith(task + "/")]
            cells += f"{statistics.median(values):.3f} / {min(values):.3f}".rjust(22)
        print(f"{task + ' ' + label:34.34}{cells}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--verify-extra", type=float, default=None, metavar="X")
    args = ap.parse_args()
    runs = [rows_of(r) for r in args.runs]
    keys = [k for k in runs[0] if all(k in r for r in runs)]
    print(f"{'':34}" + "".join(f"{r.name:>22}" for r in args.runs))
    for key in keys:
        cells = "".join(
            f"{r[key][0]:>9.3f} ({r[key][1]}v {r[key][2]}/{r[key][3]})".rjust(22) for r in runs
        )
        print(f"{key:34.34}{cells}")
    _medians(runs, keys, 0, "median / worst")
    print("by the cost table, median / worst:")
    _medians(runs, keys, 4, "")
    if args.verify_extra is not None:
        print(f"by the cost table, {args.verify_extra} plain steps more a verify:")
        _medians([rows_of(r, args.verify_extra) for r in args.runs], keys, 4, "")


if __name__ == "__main__":
    main()
