"""`draftless bench`: the task suite on a model and backend, side by side with the peers.

    draftless bench --quick                       2 prompts per task, 1 rep, 96 tokens, llamacpp
    draftless bench                               every prompt, 3 reps, 192 tokens, both backends
    draftless bench --backend hf --tasks code-edit free-form --reps 5 --out /tmp/b

Writes results.json, results.md and speedups.png to --out and prints the Markdown.
"""

from __future__ import annotations

import argparse
import functools
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftless.bench.report import (
    BenchResult,
    all_targets,
    machine_info,
    markdown,
    now,
    write_outputs,
)
from draftless.bench.runner import (
    BackendResult,
    Log,
    Method,
    Ours,
    Runner,
    Settings,
    method_info,
)
from draftless.bench.tasks import Task, TaskError, load_tasks, task_names
from draftless.cli.common import (
    MAX_DRAFT,
    add_dtype_option,
    add_no_edits_option,
    make_source,
    settle_heap,
)
from draftless.errors import UsageError
from draftless.models.base import Model, ModelError

# --backend's choices, and the backends each one runs
BACKEND_RUNS: dict[str, tuple[str, ...]] = {
    "llamacpp": ("llamacpp",),
    "hf": ("hf",),
    "both": ("llamacpp", "hf"),
}


@dataclass(frozen=True, slots=True)
class Preset:
    reps: int
    max_new_tokens: int
    prompts: int | None  # prompts per task; None: all
    backend: str


# Quick: one rep, because prefill dominates a run on a slow CPU (an ~800-token code-edit prompt
# takes ~9 s to prefill on one llama.cpp thread) and two would not fit in 10 minutes.
QUICK = Preset(reps=1, max_new_tokens=96, prompts=2, backend="llamacpp")
FULL = Preset(reps=3, max_new_tokens=192, prompts=None, backend="both")
N_CTX = 2048  # prompts stay under ~900 tokens; the llama-cpp-python peers use the same


def _usage_error(message: str) -> Exception:
    return UsageError(message)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "bench",
        help="speedups vs plain decoding and the prompt-lookup peers on a task suite",
        description=__doc__.split("\n\n", 1)[0] if __doc__ else None,
    )
    p.add_argument("--model", "-m", default="smollm2", help="registry name or path")
    p.add_argument(
        "--backend",
        choices=tuple(BACKEND_RUNS),
        default=None,
        help="default: llamacpp with --quick, both otherwise",
    )
    p.add_argument(
        "--tasks",
        nargs="+",
        default=None,
        metavar="TASK",
        help=f"tasks to run (default all): {', '.join(task_names())}; or a folder holding "
        "a task.json in the same format (your own prompts)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="2 prompts per task, 1 rep, 96 new tokens, one backend (< 10 min)",
    )
    p.add_argument("--reps", type=int, default=None, help="repetitions per prompt (3; quick 1)")
    p.add_argument(
        "--max-new-tokens",
        "-n",
        type=int,
        default=None,
        help="new tokens per generation at most (192; quick 96)",
    )
    p.add_argument(
        "--prompts", type=int, default=None, help="prompts per task (default all; quick 2)"
    )
    p.add_argument("--out", default="bench-out", help="output directory (default bench-out)")
    p.add_argument("--no-peers", action="store_true", help="skip every peer")
    p.add_argument(
        "--peers",
        nargs="+",
        default=None,
        metavar="NAME",
        help="run only these peers (e.g. lsrv-ngram-mod lcp-pld-2; each with its own plain "
        "baseline); an unknown name lists the peers the backend has",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads for the model and the peers (default: the backend's; at most the cores)",
    )
    p.add_argument("--max-draft", type=int, default=MAX_DRAFT)
    add_no_edits_option(p)
    p.add_argument(
        "--probe",
        action="store_true",
        help="measure this machine's verify costs first and let the gate use them",
    )
    p.add_argument(
        "--lockstep",
        action="store_true",
        help="run draftless and its plain a step each in turn, each on its own copy of the "
        "model (loaded twice), so the machine's noise lands on both alike: per-prompt "
        "speedups to a few tenths of a percent where whole runs wander by a few percent",
    )
    p.add_argument("--device", default=None, help="transformers device (cpu, cuda)")
    add_dtype_option(p)
    p.set_defaults(func=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    preset = QUICK if args.quick else FULL
    reps: int = preset.reps if args.reps is None else args.reps
    max_new: int = preset.max_new_tokens if args.max_new_tokens is None else args.max_new_tokens
    prompts: int | None = preset.prompts if args.prompts is None else args.prompts
    backend: str = args.backend or preset.backend
    if reps < 1:
        raise _usage_error(f"--reps must be >= 1, got {reps}")
    if max_new < 1:
        raise _usage_error(f"--max-new-tokens must be >= 1, got {max_new}")
    if prompts is not None and prompts < 1:
        raise _usage_error(f"--prompts must be >= 1, got {prompts}")
    if args.max_draft < 1:
        raise _usage_error(f"--max-draft must be >= 1, got {args.max_draft}")
    if args.threads is not None and args.threads < 1:
        raise _usage_error(f"--threads must be >= 1, got {args.threads}")
    if args.dtype and "hf" not in BACKEND_RUNS[backend]:
        raise _usage_error("--dtype sets the transformers backend's: add --backend hf or both")
    if args.no_peers and args.peers:
        raise _usage_error("--no-peers and --peers exclude each other")
    only_peers = _task_list(args.peers, what="--peers", item="peer name")
    if only_peers:
        from draftless.bench.peers import peer_names

        known = peer_names()
        unknown = [n for n in only_peers if n not in known]
        if unknown:  # checked before any model is loaded
            raise _usage_error(f"unknown peer {unknown[0]!r}; peers: {', '.join(known)}")
    names = _task_list(args.tasks)
    try:
        tasks = load_tasks(names)
    except TaskError as err:
        raise _usage_error(str(err)) from None
    backends = BACKEND_RUNS[backend]
    settings = Settings(
        quick=args.quick,
        reps=reps,
        max_new_tokens=max_new,
        prompts_per_task=prompts,
        tasks=tuple(t.name for t in tasks),
        backends=backends,
        peers=not args.no_peers,
        lockstep=args.lockstep,
    )
    command = "draftless " + " ".join(shlex.quote(a) for a in _argv())
    t0 = time.perf_counter()
    results = []
    for name in backends:
        options: dict[str, Any] = {"n_ctx": N_CTX}
        if args.device and name == "hf":
            options["device"] = args.device
        if args.dtype and name == "hf":
            options["dtype"] = args.dtype
        if args.threads is not None:
            options["n_threads"] = args.threads
        try:
            load = functools.partial(_load, args.model, name, options)
            results.append(
                bench_backend(
                    load,
                    tasks,
                    settings,
                    max_draft=args.max_draft,
                    probe=args.probe,
                    only_peers=only_peers,
                    make_source=(
                        functools.partial(make_source, paths=(), edits=False)
                        if args.no_edits
                        else None
                    ),
                )
            )
            if len(results) < len(backends):  # keep what is done if a later backend fails
                partial = build_result(command, settings, results, time.perf_counter() - t0)
                write_outputs(partial, Path(args.out))
                print(f"draftless bench: {name} done, written to {args.out}", file=sys.stderr)
        except ModelError as err:
            if len(backends) == 1:
                raise
            print(f"draftless bench: backend {name} skipped: {err}", file=sys.stderr)
    if not results:
        raise _usage_error("no backend could be run")
    result = build_result(command, settings, results, time.perf_counter() - t0)
    paths = write_outputs(result, Path(args.out))
    print(markdown(result))
    print("wrote " + ", ".join(str(p) for p in paths.values()), file=sys.stderr)
    ok = all(
        s.identical is not False
        for b in results
        for t in b.tasks
        for name, s in t.summary.items()
        if name in ("plain", "draftless")
    )
    return 0 if ok else 1


def _argv() -> list[str]:
    argv = sys.argv[1:]
    return argv if "bench" in argv else ["bench", *argv]


def _task_list(
    raw: Sequence[str] | None, *, what: str = "--tasks", item: str = "task name"
) -> list[str] | None:
    """--tasks a b, or --tasks a,b (and the same for --peers)."""
    if raw is None:
        return None
    names = [n.strip() for part in raw for n in part.split(",") if n.strip()]
    if not names:
        raise _usage_error(f"{what} needs at least one {item}")
    return names


def select_peers(peers: Sequence[Method], only: Sequence[str]) -> list[Method]:
    """The peers named in `only` that this backend has (the others belong to another backend
    or were skipped), each with the baseline its speedup is measured against."""
    by_name = {p.name: p for p in peers}
    named = [n for n in only if n in by_name]
    wanted = set(named) | {by_name[n].baseline for n in named if by_name[n].baseline}
    return [p for p in peers if p.name in wanted]


def _load(model: str, backend: str, options: dict[str, Any]) -> Model:
    from draftless.models.registry import load_model

    return load_model(model, backend=backend, **options)


def bench_backend(
    load: Callable[[], Model],
    tasks: Sequence[Task],
    settings: Settings,
    *,
    max_draft: int = MAX_DRAFT,
    probe: bool = False,
    log: Log | None = None,
    make_source: Callable[[Model], Any] | None = None,
    only_peers: Sequence[str] | None = None,
) -> BackendResult:
    """Load one model, run every task on it with ours and (if asked) the peers."""
    from draftless.costs import measure, table_for

    say = log or (lambda line: print(line, file=sys.stderr, flush=True))
    t0 = time.perf_counter()
    model = load()
    load_seconds = time.perf_counter() - t0
    say(f"[{model.backend}] {model.name} loaded in {load_seconds:.1f} s")
    twin: Model | None = None
    try:
        if settings.lockstep:
            twin = load()  # its own cache; each of ours runs on one copy, then on the other
        settle_heap()
        if probe:
            table, origin = measure(model).table, "measured"
        else:
            table, origin = table_for(model)
        say(f"[{model.backend}] verify costs ({origin}): {table.summary()}")
        methods: list[Method] = [
            Ours(model, spec=False, cost_table=table, max_draft=max_draft),
            Ours(model, spec=True, cost_table=table, max_draft=max_draft, make_source=make_source),
        ]
        notes: list[str] = []
        if settings.peers:
            from draftless.bench.peers import peers_for

            peers, notes = peers_for(model)
            chosen = select_peers(peers, only_peers) if only_peers else peers
            if only_peers and not chosen:
                notes.append(f"none of --peers {' '.join(only_peers)} runs on {model.backend}")
            methods += chosen
            for note in notes:
                say(f"[{model.backend}] {note}")
        if any(t.sampled for t in tasks) and settings.peers:
            notes.append(
                "sampled task: peers sample with their own samplers (same temperature "
                "and seed, no top-k/top-p), so their output is not comparable "
                "token for token (n/a); their speedup is a tokens/s ratio"
            )
        runner = Runner(
            model,
            methods,
            reps=settings.reps,
            max_new_tokens=settings.max_new_tokens,
            prompts_per_task=settings.prompts_per_task,
            log=say,
            warmup_each_prompt=not settings.quick,
            twin=twin,
        )
        results = runner.run(tasks)
        return BackendResult(
            backend=model.backend,
            model=model.name,
            cost_table={"origin": origin, "ks": list(table.ks), "costs": list(table.costs)},
            methods=method_info(methods),
            notes=tuple(notes),
            load_seconds=load_seconds,
            tasks=tuple(results),
            seconds=time.perf_counter() - t0,
            threads=model.threads,
            dtype=getattr(model, "dtype", None),
        )
    finally:
        model.close()
        if twin is not None:
            twin.close()


def build_result(
    command: str, settings: Settings, backends: Sequence[BackendResult], seconds: float
) -> BenchResult:
    return BenchResult(
        command, now(), machine_info(), settings, tuple(backends), all_targets(backends), seconds
    )
