"""How far a per-prompt speedup moves when nothing differs: draftless runs that made no verify
do the same forwards as plain, so their decode speedup over plain is the bench's noise.

    python benchmarks/noise_floor.py docs/bench/**/results.json

Over every prompt in the given `draftless bench` reports where draftless verified nothing,
per model: how many, the root mean square of log(speedup), the lowest speedup, their
geometric mean (the bias: what --spec's own per-step time costs), the spread around it and
the share under the issues' 0.98 floor, for three estimators of a prompt's speedup from its
reps' decode seconds: the bench's (median plain over median draftless), the median of the
per-rep ratios (a rep's two runs are back to back), and the fastest rep of each. A per-prompt
floor closer to 1 than a few times that spread cannot be shown on the machine the reports
came from at their reps.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections.abc import Callable
from pathlib import Path

FLOOR = 0.98  # the issues' free-form floor, per prompt
Estimator = Callable[[list[float], list[float]], float]
ESTIMATORS: dict[str, Estimator] = {
    "ratio of medians (the bench's)": lambda a, b: statistics.median(a) / statistics.median(b),
    "median of per-rep ratios": lambda a, b: statistics.median(
        x / y for x, y in zip(a, b, strict=True)
    ),
    "ratio of the fastest reps": lambda a, b: min(a) / min(b),
}


def idle_prompts(paths: list[Path]) -> dict[str, list[tuple[list[float], list[float]]]]:
    """Per model: (plain decode seconds, draftless decode seconds) of each prompt on which
    draftless made no verify, with at least 3 reps."""
    found: dict[str, list[tuple[list[float], list[float]]]] = {}
    for path in paths:
        for backend in json.loads(path.read_text())["backends"]:
            for task in backend["tasks"]:
                for prompt in task["prompts"]:
                    methods = prompt["methods"]
                    ours, plain = methods.get("draftless"), methods.get("plain")
                    if not ours or not plain or not ours.get("stats"):
                        continue
                    a, b = plain["decode_seconds"], ours["decode_seconds"]
                    if ours["stats"]["verify_steps"] == 0 and len(a) == len(b) >= 3:
                        key = f"{backend['backend']} {backend['model']}"
                        found.setdefault(key, []).append((a, b))
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("reports", nargs="+", type=Path)
    args = ap.parse_args()
    missing = [str(p) for p in args.reports if not p.is_file()]
    if missing:
        ap.error(f"no such report: {', '.join(missing)}")
    for model, pairs in sorted(idle_prompts(args.reports).items()):
        print(f"{model}: {len(pairs)} prompt runs with no verify")
        for name, estimate in ESTIMATORS.items():
            ratios = [estimate(a, b) for a, b in pairs]
            logs = [math.log(r) for r in ratios]
            rms = math.sqrt(statistics.fmean(x * x for x in logs))
            below = sum(r < FLOOR for r in ratios) / len(ratios)
            print(
                f"  {name:32} rms {100 * rms:.1f}%, lowest {min(ratios):.3f}; "
                f"geometric mean {math.exp(statistics.fmean(logs)):.4f}, "
                f"sd {100 * statistics.pstdev(logs):.1f}%, {100 * below:.0f}% under {FLOOR}"
            )


if __name__ == "__main__":
    main()
