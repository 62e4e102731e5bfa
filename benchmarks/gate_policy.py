"""The gate's decisions, without timing noise: every forward costed by the cost table.

    PYTHONPATH=src python benchmarks/gate_policy.py run -m smollm2 --out after.json
    PYTHONPATH=OTHER/src python benchmarks/gate_policy.py run -m smollm2 --out before.json
    python benchmarks/gate_policy.py compare before.json after.json

`run` decodes every prompt of the bench's greedy tasks, plus the free-form prompts in
benchmarks/heldout-free-form.json (not in the bench), with the cascade and the gate on the
llama.cpp backend, the decoder's clock off: the gate sees no live timings and its scale stays
1, so two runs of the same code decide alike. Per prompt it reports the modeled speedup,
committed tokens / (plain steps + sum of C(1 + draft) over verifies), with C the table the
gate used. That isolates a change of gate policy from this machine's ±20% noise; the wall
time of the result is `draftless bench`'s to measure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TASKS = ["free-form", "grounded-copy", "code-edit", "rag-reference", "repetition"]


def run(args: argparse.Namespace) -> None:
    from draftless import SpecOptions, SpeculativeDecoder, load_model, table_for
    from draftless.bench.runner import Ours, Runner
    from draftless.bench.tasks import Prompt, Task, load_tasks
    from draftless.costs import default_table
    from draftless.sources.cascade import SpeculationIndex

    model = load_model(args.model, backend="llamacpp", n_threads=args.threads)
    # the table the gate would use here, or a backend's shipped one: "hf" runs the policy as
    # it decides on transformers' flat table, with SmolLM2's llama.cpp outputs as the text
    table = table_for(model)[0] if args.table == "stored" else default_table(args.table)
    tasks = load_tasks(args.tasks)
    held = json.loads((HERE / "heldout-free-form.json").read_text())
    prompts = tuple(Prompt(f"h{i}", text, None) for i, text in enumerate(held))
    tasks.append(Task("held-out", "free-form, not in the bench", "free", "", 0.0, prompts, ()))
    runner = Runner(model, [Ours(model, spec=False, cost_table=table)], max_new_tokens=args.n)
    rows = {}
    for task in tasks:
        for job in runner.jobs(task):
            source = SpeculationIndex(model.vocab_size)
            for ref in job.references:
                source.add_reference(list(ref))
            dec = SpeculativeDecoder(
                model, source=source, options=SpecOptions(), cost_table=table, clock=None
            )
            dec.append(job.ids)
            for _ in dec.stream(job.max_new_tokens):
                pass
            s = dec.stats
            cost = s.plain_steps + sum(n * table.cost(1 + d) for d, n in s.draft_lengths.items())
            rows[f"{task.name}/{job.prompt_id}"] = {
                "modeled_speedup": s.committed / cost,
                "verifies": s.verify_steps,
                "drafted": s.drafted,
                "accepted": s.accepted,
            }
            print(f"{task.name}/{job.prompt_id}: {s.committed / cost:.3f}", file=sys.stderr)
    args.out.write_text(json.dumps({"model": args.model, "table": table.to_json(), "rows": rows}))


def compare(args: argparse.Namespace) -> None:
    a = json.loads(args.before.read_text())["rows"]
    b = json.loads(args.after.read_text())["rows"]
    families: dict[str, list[tuple[float, float]]] = {}
    for key in a.keys() & b.keys():
        families.setdefault(key.split("/")[0], []).append(
            (a[key]["modeled_speedup"], b[key]["modeled_speedup"])
        )
    for key in sorted(a.keys() & b.keys()):
        x, y = a[key], b[key]
        print(
            f"{key:42} {x['modeled_speedup']:.3f} ({x['verifies']}v {x['accepted']}/"
            f"{x['drafted']})  ->  {y['modeled_speedup']:.3f} ({y['verifies']}v "
            f"{y['accepted']}/{y['drafted']})"
        )
    for name, pairs in sorted(families.items()):
        before, after = [p[0] for p in pairs], [p[1] for p in pairs]
        print(
            f"{name:15} median {statistics.median(before):.3f} -> {statistics.median(after):.3f}"
            f"   worst {min(before):.3f} -> {min(after):.3f}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("-m", "--model", default="smollm2")
    r.add_argument("--threads", type=int, default=2)
    r.add_argument("--tasks", nargs="+", default=TASKS)
    r.add_argument("-n", type=int, default=192, help="new tokens per prompt at most")
    r.add_argument("--table", choices=["stored", "llamacpp", "hf"], default="stored")
    r.add_argument("--out", type=Path, required=True)
    c = sub.add_parser("compare")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    args = ap.parse_args()
    if args.cmd == "run":
        run(args)
    else:
        compare(args)


if __name__ == "__main__":
    main()
