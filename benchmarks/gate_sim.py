"""The gate's policy replayed offline: record each prompt's stream once, then decide in seconds.

    PYTHONPATH=src python benchmarks/gate_sim.py record -m smollm2 --out streams.json
    PYTHONPATH=src python benchmarks/gate_sim.py replay streams.json [--table llamacpp|hf|T.json]
        [--truth T.json]
    python benchmarks/gate_sim.py compare before.json after.json    # two replay --out files

Why it is exact. Greedy decoding is lossless, so the committed stream of a prompt is the same
whatever the gate decides; and the cascade's state is a function of that stream alone (it
observes committed tokens and the top-k of committed rows, which a verify row gives bitwise
as a plain step does on the exact configuration). So `record` decodes every prompt plainly
once (the bench's greedy tasks, benchmarks/heldout-free-form.json and the three held-out
families of benchmarks/heldout-real.json: copies of stdlib docstrings, renames in stdlib
functions, free-form) and keeps, at every position, the draft the cascade would propose there
(64 tokens at most: a shorter budget takes a prefix of it, the source protocol's promise).
`replay` then runs the real `SpeculativeDecoder` and `CostGate` on a model that answers with
the recorded stream and a source that answers with the recorded drafts, clock off, every
forward costed by the cost table, as `gate_policy.py run` does with the model itself; `replay
--check FILE` compares with that run's output (tests/test_gate_sim.py proves the replay equal
to the decoder on an exact fake model, with the edit learner off: see below). A gate change
is then measured on the bench's prompts and the held-out ones in under two seconds, beside
`oracle_speedup`, the ceiling of any gate on the cascade's drafts.

One approximation: the decoder computes top-k rows for recycling only while recycling's gate
is on (`SpeculativeDecoder._wants_topk`), and a recording keeps them at every step, so a
recycling draft made while its gate is off can differ. On the 81 prompts, SmolLM2 on both
tables, `gate_policy.py run` (the real decoder) and the replay still agree prompt for prompt:
recycling's gate never comes back on there.

A second: the cascade's edit learner (`sources/edits.py`) reads each proposal, and a recording
proposes at every position where the decoder proposes once a step. It sees the same departures
either way (a proposal's expectation runs past its draft), but counts a substitution's holds
and breaks per proposal, so where the stream goes both ways a recording can drop or keep a
substitution at a different point than the decoder would.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
TASKS = ["free-form", "grounded-copy", "code-edit", "rag-reference", "repetition"]
MAX_DRAFT = 64


class _Recorder:
    """A source that records what the cascade would propose at each position, and drafts
    nothing: the decoder then decodes plainly, one position per step."""

    def __init__(self, cascade, start: int) -> None:
        self.cascade = cascade
        self.wants_topk = cascade.wants_topk
        self.topk_member = None  # top-k rows at every step: the recording keeps them all
        self.at = start  # stream position the next proposal continues
        self.drafts: dict[int, tuple[list[int], str, int]] = {}

    def propose(self, budget: int):
        draft = self.cascade.propose(MAX_DRAFT)
        if draft is not None:
            self.drafts[self.at] = ([int(t) for t in draft.tokens], draft.member, draft.match_len)
        return None

    def observe(self, committed: Sequence[int]) -> None:
        self.cascade.observe(committed)
        self.at += len(committed)

    def observe_topk(self, token_ids, topk_ids) -> None:
        self.cascade.observe_topk(token_ids, topk_ids)


def record_stream(
    model,
    prompt: Sequence[int],
    references: Sequence[Sequence[int]],
    max_new_tokens: int,
    edits: bool = True,
) -> dict:
    """One prompt decoded greedily and plainly, with the cascade's draft at every position
    (`edits`: the cascade's edit learner on, as the decoder runs it)."""
    from draftless import SpecOptions, SpeculativeDecoder
    from draftless.sources.cascade import SpeculationIndex

    cascade = SpeculationIndex(model.vocab_size, edits=edits)
    for ref in references:
        cascade.add_reference(list(ref))
    rec = _Recorder(cascade, 0)
    dec = SpeculativeDecoder(model, source=rec, options=SpecOptions(), clock=None)
    dec.append(prompt)
    stops = sorted(model.eos_token_ids)
    generated = [t for chunk in dec.stream(max_new_tokens, stops) for t in chunk]
    return {
        "prompt": [int(t) for t in prompt],
        "generated": generated,
        "max_new_tokens": max_new_tokens,
        "stops": stops,
        "drafts": {str(k): v for k, v in rec.drafts.items()},
    }


def all_tasks(model, names: Sequence[str]) -> list:
    """The bench's tasks `names`, then the held-out families: benchmarks/heldout-free-form.json
    and the three of benchmarks/heldout-real.json."""
    from draftless.bench.tasks import Prompt, Task, load_tasks

    tasks = load_tasks(list(names))
    held = json.loads((HERE / "heldout-free-form.json").read_text())
    prompts = tuple(Prompt(f"h{i}", text, None) for i, text in enumerate(held))
    tasks.append(Task("held-out", "free-form, not in the bench", "free", "", 0.0, prompts, ()))
    real = json.loads((HERE / "heldout-real.json").read_text())["families"]
    for name, items in real.items():
        ps = tuple(Prompt(item["id"], item["text"], None) for item in items)
        tasks.append(Task(name, "held out: real text and code", "free", "", 0.0, ps, ()))
    return tasks


def record(args: argparse.Namespace) -> None:
    from draftless import load_model
    from draftless.bench.runner import Ours, Runner

    model = load_model(args.model, backend="llamacpp", n_threads=args.threads)
    runner = Runner(model, [Ours(model, spec=False, cost_table=None)], max_new_tokens=args.n)
    out = {"model": args.model, "vocab_size": model.vocab_size, "streams": {}}
    for task in all_tasks(model, args.tasks):
        for job in runner.jobs(task):
            entry = record_stream(model, job.ids, job.references, job.max_new_tokens)
            out["streams"][f"{task.name}/{job.prompt_id}"] = entry
            print(f"{task.name}/{job.prompt_id}: {len(entry['generated'])} tokens", file=sys.stderr)
    args.out.write_text(json.dumps(out))


class _ReplayModel:
    """Answers every forward with one-hot rows of the recorded stream: row i of a forward at
    cache length n picks stream[n + i + 1], what the real model's greedy row picked."""

    name, backend, path, threads, tokenizer, kernels = "replay", "replay", None, None, None, ""
    n_ctx = None

    def __init__(self, stream: list[int], vocab: int, stops: Sequence[int]) -> None:
        self.stream, self.vocab_size = stream, vocab
        self.eos_token_ids = frozenset(stops)
        self.n_past = 0

    def forward(self, token_ids: Sequence[int]) -> np.ndarray:
        rows = np.zeros((len(token_ids), self.vocab_size), dtype=np.float32)
        for i in range(len(token_ids)):
            at = self.n_past + i + 1
            rows[i, self.stream[at] if at < len(self.stream) else 0] = 1.0
        self.n_past += len(token_ids)
        return rows

    def prefill(self, token_ids: Sequence[int]) -> None:
        self.n_past += len(token_ids)

    def truncate(self, n: int) -> None:
        self.n_past = min(self.n_past, n)

    def close(self) -> None:
        pass


class _ReplaySource:
    wants_topk = False
    topk_member = None

    def __init__(self, drafts: dict[str, list]) -> None:
        self.drafts = {int(k): v for k, v in drafts.items()}
        self.at = 0

    def propose(self, budget: int):
        from draftless.sources.base import Draft

        got = self.drafts.get(self.at)
        if got is None or budget <= 0:
            return None
        tokens, member, match_len = got
        return Draft(tokens[:budget], member, match_len)

    def observe(self, committed: Sequence[int]) -> None:
        self.at += len(committed)

    def observe_topk(self, token_ids, topk_ids) -> None:
        pass


def replay_one(entry: dict, vocab: int, table, truth=None) -> dict:
    """The decoder and gate on one recorded prompt, deciding on `table`; the modeled speedup
    is costed by `truth` (default: the same table), what the machine's forwards cost."""
    from draftless import SpecOptions, SpeculativeDecoder

    stream = entry["prompt"] + entry["generated"]
    model = _ReplayModel(stream, vocab, entry["stops"])
    source = _ReplaySource(entry["drafts"])
    dec = SpeculativeDecoder(
        model, source=source, options=SpecOptions(), cost_table=table, clock=None
    )
    dec.append(entry["prompt"])
    got = [t for chunk in dec.stream(entry["max_new_tokens"], entry["stops"]) for t in chunk]
    if got != entry["generated"]:
        raise AssertionError("the replay left the recorded stream")
    return modeled_row(dec.stats, truth or table)


def modeled_row(s, table) -> dict:
    """A run's stats -> its modeled speedup (committed tokens over plain steps plus the
    table's C(1 + draft) per verify) and the counts behind it."""
    from draftless.bench.report import modeled_speedup

    return {
        "modeled_speedup": modeled_speedup(s, table),
        "verifies": s.verify_steps,
        "drafted": s.drafted,
        "accepted": s.accepted,
        "plain_steps": s.plain_steps,
        "shadow_checks": s.shadow_checks,
        "draft_lengths": dict(s.draft_lengths),
    }


def oracle_speedup(entry: dict, table, min_draft: int = 2) -> float:
    """The modeled speedup of a gate that knew the future: at each position a plain step, or
    a verify of the cascade's draft cut to any length d >= min_draft (committing the accepted
    tokens of the first d, plus one), whichever reaches the end cheapest (a shortest path over
    positions). The ceiling of any gate on the cascade's drafts, against which `replay`
    reports each policy's share of the gain."""
    stream = entry["prompt"] + entry["generated"]
    start, end = len(entry["prompt"]), len(stream)
    drafts = {int(k): v[0] for k, v in entry["drafts"].items()}
    cost = [0.0] + [table.cost(k) for k in range(1, MAX_DRAFT + 2)]
    best = [0.0] * (end + 1)  # best[t]: least cost from position t to the end
    for t in range(end - 1, start - 1, -1):
        tokens, accepted = drafts.get(t, []), 0
        while (
            accepted < len(tokens)
            and t + accepted < end
            and tokens[accepted] == stream[t + accepted]
        ):
            accepted += 1
        best[t] = 1.0 + best[t + 1]
        for d in range(min_draft, min(len(tokens), end - t - 1) + 1):
            committed = min(d, accepted) + 1
            best[t] = min(best[t], cost[d + 1] + best[t + committed])
    return (end - start) / best[start] if end > start else 1.0


def replay(args: argparse.Namespace) -> None:
    from draftless.costs import CostTable, default_table

    data = json.loads(args.streams.read_text())

    def load(name: str) -> CostTable:
        if name in ("llamacpp", "hf"):
            return default_table(name)
        spec = json.loads(Path(name).read_text())  # e.g. a probed table: {"ks": [], "costs": []}
        return CostTable(tuple(spec["ks"]), tuple(spec["costs"]))

    table = load(args.table)
    truth = load(args.truth) if args.truth else table
    streams = data["streams"]
    rows = {key: replay_one(e, data["vocab_size"], table, truth) for key, e in streams.items()}
    if args.out:
        args.out.write_text(json.dumps({"model": data["model"], "table": args.table, "rows": rows}))
    if args.check:
        ref = json.loads(args.check.read_text())["rows"]
        bad = [
            k
            for k in ref
            if k in rows and abs(ref[k]["modeled_speedup"] - rows[k]["modeled_speedup"]) > 1e-9
        ]
        print(f"check: {len(ref) - len(bad)}/{len(ref)} prompts equal to {args.check}")
        for k in bad:
            print(f"  {k}: {ref[k]['modeled_speedup']:.4f} vs {rows[k]['modeled_speedup']:.4f}")
    families: dict[str, list[tuple[str, float, float]]] = {}
    for key, row in rows.items():
        oracle = oracle_speedup(data["streams"][key], truth)
        families.setdefault(key.split("/")[0], []).append((key, row["modeled_speedup"], oracle))
    print("family          median  worst (prompt)                        oracle  share of its gain")
    for name, rows_ in sorted(families.items()):
        worst = min(rows_, key=lambda r: r[1])
        share = [(v - 1) / (o - 1) if o > 1.001 else 1.0 for _, v, o in rows_]
        print(
            f"{name:15} {statistics.median(r[1] for r in rows_):.3f}   {worst[1]:.3f} "
            f"({worst[0]:30.30}) {statistics.median(r[2] for r in rows_):.3f}   "
            f"{statistics.median(share):.2f}"
        )


def compare(before_path: Path, after_path: Path) -> None:
    """Per prompt and per family (median, worst), two `replay --out` or `gate_policy.py run
    --out` files side by side."""
    a = json.loads(before_path.read_text())["rows"]
    b = json.loads(after_path.read_text())["rows"]
    families: dict[str, list[tuple[float, float]]] = {}
    for key in sorted(a.keys() & b.keys()):
        x, y = a[key], b[key]
        families.setdefault(key.split("/")[0], []).append(
            (x["modeled_speedup"], y["modeled_speedup"])
        )
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
    r = sub.add_parser("record")
    r.add_argument("-m", "--model", default="smollm2")
    r.add_argument("--threads", type=int, default=2)
    r.add_argument("--tasks", nargs="+", default=TASKS)
    r.add_argument("-n", type=int, default=192, help="new tokens per prompt at most")
    r.add_argument("--out", type=Path, required=True)
    p = sub.add_parser("replay")
    p.add_argument("streams", type=Path)
    p.add_argument(
        "--table", default="llamacpp", help='llamacpp, hf, or a JSON file {"ks": [], "costs": []}'
    )
    p.add_argument(
        "--truth",
        help="cost the result by this table (the machine's), while the gate decides on --table",
    )
    p.add_argument("--out", type=Path)
    p.add_argument("--check", type=Path, help="a gate_policy.py run --out file to compare with")
    c = sub.add_parser("compare")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    args = ap.parse_args()
    if args.cmd == "compare":
        compare(args.before, args.after)
    else:
        record(args) if args.cmd == "record" else replay(args)


if __name__ == "__main__":
    main()
