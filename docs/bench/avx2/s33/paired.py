"""Scratch (session 33): a lockstep report's prompts read as the median of per-rep ratios.

    python docs/bench/avx2/s33/paired.py DIR [DIR ...]

The bench reads a prompt as plain's median decode seconds over draftless's median. In
lockstep a rep's two runs share every stretch of the machine's time, step by step, so each
rep's own ratio is the paired measurement; this prints, per family, the median and the worst
prompt both ways, and the prompt behind each worst.
"""

import json
import statistics
import sys
from pathlib import Path


def prompts(path: Path):
    def walk(o, task=None):
        if isinstance(o, dict):
            if "prompt_id" in o and "methods" in o:
                yield task, o
            for v in o.values():
                yield from walk(v, o.get("name", task) if "prompts" in o else task)
        elif isinstance(o, list):
            for v in o:
                yield from walk(v, task)

    yield from walk(json.loads((path / "results.json").read_text()))


for d in map(Path, sys.argv[1:]):
    print(f"# {d}")
    families: dict[str, list[tuple[str, float, float]]] = {}
    for task, p in prompts(d):
        plain = p["methods"]["plain"]["decode_seconds"]
        ours = p["methods"]["draftless"]["decode_seconds"]
        unpaired = statistics.median(plain) / statistics.median(ours)
        paired = statistics.median(a / b for a, b in zip(plain, ours, strict=True))
        families.setdefault(task or p.get("task", "?"), []).append(
            (p["prompt_id"], unpaired, paired)
        )
    for task, rows in families.items():
        for k, how in ((1, "median of medians"), (2, "median of rep ratios")):
            vals = [r[k] for r in rows]
            worst = min(rows, key=lambda r: r[k])
            print(
                f"  {task:18} {how:21} median {statistics.median(vals):.3f}"
                f" worst {worst[k]:.3f} ({worst[0]})"
            )
