"""Scratch (session 34): a bench report's prompts rep by rep, and each prompt's speedup by the
bench's two statistics (`draftless.bench.runner`): `median_ratio`, each side's median seconds
(what runs not in lockstep use, and lockstep runs did before session 34), and `paired_ratio`,
the median of each rep's own ratio in logs (lockstep runs since). Per prompt: each rep's
ratio (plain decode seconds over draftless's), draftless's verifies, accepted / drafted
tokens and shadow checks (summed over reps), plain's decode seconds per rep; per family, the
median and the worst prompt by each statistic.

    PYTHONPATH=src python docs/bench/avx2/s34/reps.py DIR
"""

import json
import statistics
import sys
from pathlib import Path

from draftless.bench.runner import median_ratio, paired_ratio

report = json.loads((Path(sys.argv[1]) / "results.json").read_text())
for backend in report["backends"]:
    for task in backend["tasks"]:
        rows = []
        for p in task["prompts"]:
            plain, ours = p["methods"]["plain"], p["methods"]["draftless"]
            args = (
                plain["decode_seconds"],
                plain["decode_tokens"],
                ours["decode_seconds"],
                ours["decode_tokens"],
            )
            rows.append((p["prompt_id"], median_ratio(*args), paired_ratio(*args)))
            s = ours["stats"]
            ratios = " ".join(
                f"{a / b:.3f}"
                for a, b in zip(plain["decode_seconds"], ours["decode_seconds"], strict=True)
            )
            seconds = " ".join(f"{a:.1f}" for a in plain["decode_seconds"])
            print(
                f"{task['task'][:16]:16} {p['prompt_id'][:18]:18} {p['new_tokens']:3} | {ratios}"
                f" | median {rows[-1][1]:.3f} paired {rows[-1][2]:.3f}"
                f" | {s['verify_steps']:3}v {s['accepted']:3}/{s['drafted']:<3}"
                f" {s['shadow_checks']:4} shadow | plain {seconds}"
            )
        for k, how in ((1, "median_ratio"), (2, "paired_ratio")):
            worst = min(rows, key=lambda r: r[k])
            print(
                f"  {task['task']}, {how}: median {statistics.median(r[k] for r in rows):.3f},"
                f" worst {worst[k]:.3f} ({worst[0]})"
            )
