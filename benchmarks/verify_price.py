"""What a run's verifies cost beyond the cost table: per prompt, the measured decode speedup
over the speedup its forwards model by the table (a plain step 1, a verify of d drafts
C(1 + d), `report.modeled_speedup`), against its verifies per committed token.

    python benchmarks/verify_price.py docs/bench/avx2/s30-lockstep/q15-free-form/results.json

A least-squares line through the prompts, ratio = a + b x (verifies per token): a is what the
decoder's own time per step costs (1 where it costs nothing), -b what a verify costs beyond
the table, in plain steps. On whole runs made one after the other the ratios wander by ~3%
(`noise_floor.py`) and say little; read it on a `draftless bench --lockstep` report.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from draftless.bench.report import modeled_speedup
from draftless.costs import CostTable
from draftless.metrics import DecodeStats


def stats_of(raw: dict) -> DecodeStats:
    """The counts `modeled_speedup` reads, from a report's stats object."""
    s = DecodeStats()
    s.plain_steps, s.committed = raw["plain_steps"], raw["committed"]
    s.draft_lengths = {int(k): n for k, n in raw["draft_lengths"].items()}
    return s


def table_of(raw: dict, extra: float = 0.0) -> CostTable:
    """A report's cost table, with `extra` plain steps added to every verify (C(k), k > 1)."""
    costs = (c + extra if k > 1 else c for k, c in zip(raw["ks"], raw["costs"], strict=True))
    return CostTable(tuple(raw["ks"]), tuple(costs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("report", type=Path, help="a draftless bench results.json")
    args = ap.parse_args()
    for backend in json.loads(args.report.read_text())["backends"]:
        table = table_of(backend["cost_table"])
        xs: list[float] = []
        ys: list[float] = []
        for task in backend["tasks"]:
            for prompt in task["prompts"]:
                mine = prompt["methods"].get("draftless")
                if not mine or not mine["stats"] or mine["speedup"] is None:
                    continue
                stats = stats_of(mine["stats"])
                modeled = modeled_speedup(stats, table)
                if modeled is None:
                    continue
                per_token = mine["stats"]["verify_steps"] / stats.committed
                xs.append(per_token)
                ys.append(mine["speedup"] / modeled)
                print(
                    f"{backend['model']} {prompt['task']}/{prompt['prompt_id']}: speedup "
                    f"{mine['speedup']:.3f}, by the table {modeled:.3f}, ratio {ys[-1]:.4f}, "
                    f"verifies per token {per_token:.3f}"
                )
        if len(xs) < 2 or len(set(xs)) < 2:
            continue
        mx, my = statistics.mean(xs), statistics.mean(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
            (x - mx) ** 2 for x in xs
        )
        print(
            f"{backend['model']}: ratio = {my - slope * mx:.4f} {slope:+.4f} x verifies per "
            f"token over {len(xs)} prompts: a verify costs {-slope:.2f} plain steps beyond "
            "the table"
        )


if __name__ == "__main__":
    main()
