"""The gate's decisions, without timing noise: every forward costed by the cost table.

    PYTHONPATH=src python benchmarks/gate_policy.py run -m smollm2 --out after.json
    PYTHONPATH=OTHER/src python benchmarks/gate_policy.py run -m smollm2 --out before.json
    python benchmarks/gate_policy.py compare before.json after.json

`run` decodes every prompt of the bench's greedy tasks, plus the held-out families
(`gate_sim.all_tasks`: benchmarks/heldout-free-form.json and heldout-real.json), with the
cascade and the gate on the llama.cpp backend, the decoder's clock off: the gate sees no live
timings and its scale stays 1, so two runs of the same code decide alike. Per prompt it
reports the modeled speedup, committed tokens / (plain steps + sum of C(1 + draft) over
verifies), with C the table the gate used. That isolates a change of gate policy from this
machine's ±20% noise; the wall time of the result is `draftless bench`'s to measure.
`gate_sim.py` gives the same numbers from recorded streams in seconds, without the model;
this is the reference it is checked against (`gate_sim.py replay --check`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import gate_sim  # benchmarks/, the script's own directory

TASKS = gate_sim.TASKS


def run(args: argparse.Namespace) -> None:
    from draftless import SpecOptions, SpeculativeDecoder, load_model, table_for
    from draftless.bench.runner import Ours, Runner
    from draftless.costs import default_table
    from draftless.sources.cascade import SpeculationIndex

    model = load_model(args.model, backend="llamacpp", n_threads=args.threads)
    # the table the gate would use here, or a backend's shipped one: "hf" runs the policy as
    # it decides on transformers' flat table, with SmolLM2's llama.cpp outputs as the text
    table = table_for(model)[0] if args.table == "stored" else default_table(args.table)
    runner = Runner(model, [Ours(model, spec=False, cost_table=table)], max_new_tokens=args.n)
    rows = {}
    for task in gate_sim.all_tasks(model, args.tasks):
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
            row = rows[f"{task.name}/{job.prompt_id}"] = gate_sim.modeled_row(dec.stats, table)
            print(f"{task.name}/{job.prompt_id}: {row['modeled_speedup']:.3f}", file=sys.stderr)
    args.out.write_text(json.dumps({"model": args.model, "table": table.to_json(), "rows": rows}))


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
        gate_sim.compare(args.before, args.after)


if __name__ == "__main__":
    main()
