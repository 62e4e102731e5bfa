"""Bench outputs: results.json (everything), results.md (the tables), speedups.png (the chart).

Each file is written to a temporary sibling and renamed into place, so a reader never sees a
half-written report. The Markdown ends with the targets, met or missed, and for a
missed one the numbers that explain it: acceptance, tokens per step, mean draft, the verify
cost C(k) of that draft, and what the gate did.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import platform
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from draftless.bench.runner import (
    DRAFTLESS,
    PLAIN,
    BackendResult,
    MethodResult,
    MethodSummary,
    Settings,
    TaskResult,
)
from draftless.costs import CostTable
from draftless.metrics import DecodeStats

FREE_FORM_FLOOR = 0.98  # free-form: the worst prompt's speedup at least this (issues 11, 12)
PACKAGES = ("numpy", "torch", "transformers", "llama_cpp_python", "numba", "matplotlib")


@dataclass(frozen=True, slots=True)
class Machine:
    cpu: str
    cores: int
    system: str
    python: str
    packages: dict[str, str | None]


@dataclass(frozen=True, slots=True)
class Target:
    backend: str
    task: str
    goal: str  # "free-form >= 0.97x" or "speedup >= best peer"
    needed: float | None  # the speedup to reach; None: no peer measured
    got: float | None
    met: bool | None  # None: could not be judged
    why: str  # the numbers behind a miss (or a met target's margin)


@dataclass(frozen=True, slots=True)
class BenchResult:
    command: str
    date: str
    machine: Machine
    settings: Settings
    backends: tuple[BackendResult, ...]
    targets: tuple[Target, ...]
    seconds: float


def machine_info() -> Machine:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name.replace("_", "-"))
        except metadata.PackageNotFoundError:
            versions[name] = None
    return Machine(
        cpu,
        os.cpu_count() or 1,
        f"{platform.system()} {platform.release()}",
        sys.version.split()[0],
        versions,
    )


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")


# -- targets -------------------------------------------------------------------------------------
def targets_for(backend: BackendResult) -> list[Target]:
    """Free-form: draftless's worst prompt >= FREE_FORM_FLOOR x plain (a median would hide
    the prompt that loses). Retrieval: draftless's median >= the best peer's."""
    out = []
    table = _table(backend)
    labels = {m.name: m.label for m in backend.methods}
    peers = [m.name for m in backend.methods if m.baseline is not None and m.name != DRAFTLESS]
    for task in backend.tasks:
        ours = task.summary.get(DRAFTLESS)
        got = ours.speedup if ours else None
        why = _diagnosis(task, table)
        if task.kind == "free":
            worst = worst_prompt(task)
            got = worst[1] if worst else None
            met = None if got is None else got >= FREE_FORM_FLOOR
            where = _worst_and_noise(task, worst, table)
            out.append(
                Target(
                    backend.backend,
                    task.task,
                    f">= {FREE_FORM_FLOOR:.2f}x of plain on every prompt",
                    FREE_FORM_FLOOR,
                    got,
                    met,
                    "; ".join(p for p in (where, why) if p),
                )
            )
            continue
        best_name, best = None, None
        for name in peers:
            s = task.summary[name].speedup
            if s is not None and (best is None or s > best):
                best_name, best = name, s
        if best is None or got is None:
            out.append(
                Target(
                    backend.backend,
                    task.task,
                    ">= best peer",
                    None,
                    got,
                    None,
                    "no peer measured" + (f"; {why}" if why else ""),
                )
            )
            continue
        goal = f">= best peer ({labels[best_name or '']})"
        out.append(Target(backend.backend, task.task, goal, best, got, got >= best, why))
    return out


def worst_prompt(task: TaskResult) -> tuple[str, float] | None:
    """(prompt id, speedup) of draftless's slowest prompt in a task; None if none measured."""
    speedups = [
        (p.prompt_id, m.speedup)
        for p in task.prompts
        if (m := p.methods.get(DRAFTLESS)) is not None and m.speedup is not None
    ]
    return min(speedups, key=lambda ps: ps[1]) if speedups else None


def modeled_speedup(stats: DecodeStats, table: CostTable) -> float | None:
    """Committed tokens over what a run's forwards cost by the cost table (a plain step 1, a
    verify of d draft tokens C(1 + d)): the speedup the gate's verifies earn by the table,
    free of the machine's noise and of the decoder's own time per step. None: no step."""
    cost = stats.plain_steps + sum(n * table.cost(1 + d) for d, n in stats.draft_lengths.items())
    return stats.committed / cost if cost > 0 else None


def _worst_and_noise(
    task: TaskResult, worst: tuple[str, float] | None, table: CostTable | None
) -> str:
    """The worst prompt, what its verifies model by the table, and the speedups of this run's
    prompts that made no verify: they run the same forwards as plain, so they read this run's
    noise and the decoder's own time per step, the yardstick a per-prompt floor is read by."""
    if worst is None:
        return ""
    text = f"worst prompt {worst[0]}"
    stats = next(p.methods[DRAFTLESS] for p in task.prompts if p.prompt_id == worst[0]).stats
    if stats is not None and stats.verify_steps == 0:
        text += " (no verify)"
    elif stats is not None and table is not None:
        text += f" (its verifies by the cost table: {modeled_speedup(stats, table):.3f}x)"
    idle = sorted(
        m.speedup
        for p in task.prompts
        if (m := p.methods.get(DRAFTLESS)) is not None
        and m.speedup is not None
        and m.stats is not None
        and m.stats.verify_steps == 0
    )
    if idle:
        text += (
            f"; {len(idle)} of {len(task.prompts)} prompts made no verify (plain's forwards: "
            f"the run's noise and per-step time) median {statistics.median(idle):.3f}x, "
            f"lowest {idle[0]:.3f}x"
        )
    return text


def _table(backend: BackendResult) -> CostTable | None:
    try:
        return CostTable(tuple(backend.cost_table["ks"]), tuple(backend.cost_table["costs"]))
    except (KeyError, TypeError, ValueError):
        return None


def _diagnosis(task: TaskResult, table: CostTable | None) -> str:
    """Acceptance, tokens/step, the verify cost of the mean draft, and the gate's doing."""
    ours = task.summary.get(DRAFTLESS)
    if ours is None or ours.stats is None:
        return ""
    s = ours.stats
    parts = []
    if s.drafted:
        parts.append(f"acceptance {s.acceptance:.0%} ({s.accepted}/{s.drafted})")
    else:
        parts.append("nothing drafted")
    if s.steps:
        parts.append(f"{s.tokens_per_step:.2f} tok/step")
    if s.verify_steps and table is not None:
        width = round(s.mean_draft) + 1
        cost = table.cost(width)
        parts.append(
            f"mean draft {s.mean_draft:.1f} -> C({width}) = {cost:.2f} plain steps, "
            f"break-even {max(0.0, cost - 1) / (width - 1):.0%} acceptance"
        )
    steps = s.steps or 1
    parts.append(f"{s.verify_steps}/{steps} steps verified ({s.verify_steps / steps:.0%})")
    parts.append(f"gate off {s.gate_off}x, on {s.gate_on}x, shadow checks {s.shadow_checks}")
    members = [f"{name} {m.accepted}/{m.drafted}" for name, m in sorted(s.members.items())]
    if members:
        parts.append("by source: " + ", ".join(members))
    gates = []
    for name, m in sorted(s.evidence.items()):
        text = f"{name} {m.accepted}/{m.drafted} in {m.verifies} verifies"
        if m.gate_off or m.gate_on or m.shadow_checks:
            text += f" (off {m.gate_off}x, on {m.gate_on}x, {m.shadow_checks} shadow)"
        gates.append(text)
    if gates:
        parts.append("by gate (member/match length): " + ", ".join(gates))
    if s.draft_lengths:
        lengths = ", ".join(f"{k}: {v}" for k, v in sorted(s.draft_lengths.items()))
        parts.append(f"draft lengths (tokens: verifies) {lengths}")
    if s.resync_gaps:
        gaps = ", ".join(f"{k}: {v}" for k, v in sorted(s.resync_gaps.items()))
        parts.append(f"re-sync gaps after a rejection (tokens: times) {gaps}")
    return "; ".join(parts)


# -- Markdown ------------------------------------------------------------------------------------
def _x(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}x"


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.0%}"


def _same(flag: bool | None) -> str:
    return {True: "yes", False: "**NO**", None: "n/a"}[flag]


def markdown(result: BenchResult) -> str:
    out = io.StringIO()
    w = out.write
    st = result.settings
    m = result.machine
    w("# draftless bench\n\n")
    w(f"Command: `{result.command}`  \n")
    w(f"Date: {result.date}; wall time {result.seconds / 60:.1f} min  \n")
    versions = ", ".join(f"{k} {v}" for k, v in m.packages.items() if v)
    w(f"Machine: {m.cpu}, {m.cores} cores, {m.system}; Python {m.python}; {versions}  \n")
    prompts = (
        "all prompts" if st.prompts_per_task is None else f"{st.prompts_per_task} prompts per task"
    )
    w(
        f"Mode: {'quick' if st.quick else 'full'} ({prompts}, {st.reps} reps, "
        f"{st.max_new_tokens} new tokens at most, greedy unless noted)"
        + (
            "; lockstep: draftless and its plain a step each in turn, each on its own copy "
            "of the model, the copies swapped every rep (peers run whole); their speedup on a "
            "prompt is the median of each rep's own ratio (in logs: an even number of reps "
            "gives the geometric mean of the middle two)"
            if st.lockstep
            else ""
        )
        + "\n\n"
    )
    w(
        "Speedup = decode speedup: the method's decode tokens/s over "
        "its own baseline's, where decode is everything after the first forward that follows "
        "the prompt (prefill and time to first token excluded: they are the same work with or "
        "without speculation). Median seconds over reps on the same prompt (with identical "
        "output: plain decode seconds / method decode seconds), then the median over the "
        "task's prompts. *End-to-end* is the same ratio on the whole wall time, prefill "
        "included. draftless is measured against plain decoding in draftless' decoder; each "
        "peer against its own library's plain generate. *Identical* = every rep's tokens equal "
        "our plain run's.\n\n"
    )
    for backend in result.backends:
        _backend_md(w, backend)
    if result.targets:
        w("## Targets\n\n")
        w("| Backend | Task | Target | Needed | draftless | Met | Why |\n")
        w("|---|---|---|---|---|---|---|\n")
        for t in result.targets:
            met = {True: "yes", False: "**missed**", None: "–"}[t.met]
            w(
                f"| {t.backend} | {t.task} | {t.goal} | {_x(t.needed)} | {_x(t.got)} | {met} | "
                f"{t.why} |\n"
            )
        w("\n")
    return out.getvalue()


def _backend_md(w: Any, b: BackendResult) -> None:
    labels = {m.name: m.label for m in b.methods}
    peers = [m for m in b.methods if m.baseline is not None and m.name != DRAFTLESS]
    bases = [m for m in b.methods if m.baseline is None and m.name != PLAIN]
    w(f"## {b.backend}: {b.model}\n\n")
    ct = b.cost_table
    costs = ", ".join(f"C({k})={c:.2f}" for k, c in zip(ct["ks"], ct["costs"], strict=True))
    w(
        f"Verify costs the gate used ({ct['origin']}): {costs} plain steps. "
        f"Model load {b.load_seconds:.1f} s; run {b.seconds / 60:.1f} min"
        + (f"; {b.threads} thread{'s' if b.threads != 1 else ''}" if b.threads else "")
        + (f"; {b.dtype}" if b.dtype else "")
        + ".\n\n"
    )
    for note in b.notes:
        w(f"- {note}\n")
    if b.notes:
        w("\n")
    head = [
        "Task",
        "Prompts",
        "Plain decode tok/s",
        "draftless",
        "Worst prompt",
        "End-to-end",
        "Acceptance",
        "Tok/step",
        "Identical",
        "Gate off/on/shadow",
    ]
    head += [f"{labels[p.name]} decode tok/s" for p in bases] + [labels[p.name] for p in peers]
    w("| " + " | ".join(head) + " |\n")
    w("|" + "---|" * len(head) + "\n")
    for task in b.tasks:
        ours = task.summary.get(DRAFTLESS)
        plain = task.summary[PLAIN]
        s = ours.stats if ours else None
        title = task.title
        worst = worst_prompt(task)
        row = [
            title,
            str(len(task.prompts)),
            f"{plain.tokens_per_second:.1f}",
            f"**{_x(ours.speedup)}**" if ours else "–",
            f"{_x(worst[1])} ({worst[0]})" if worst else "–",
            _x(ours.speedup_e2e) if ours else "–",
            _pct(s.acceptance if s else None),
            "–" if s is None or s.tokens_per_step is None else f"{s.tokens_per_step:.2f}",
            _same_summary(ours) if ours else "–",
            f"{s.gate_off}/{s.gate_on}/{s.shadow_checks}" if s else "–",
        ]
        row += [f"{task.summary[p.name].tokens_per_second:.1f}" for p in bases]
        row += [_peer_cell(task.summary[p.name]) for p in peers]
        w("| " + " | ".join(row) + " |\n")
    w("\n")
    if peers:
        w(
            "Peer cells: speedup over the peer library's own plain generate (acceptance, "
            "identical to our plain output; n/a when sampled by the peer's own sampler). "
            "Decode tok/s columns are absolute throughputs of the plain baselines. Per prompt "
            "below: seconds are whole wall times (decode seconds in brackets)."
            "\n\n"
        )
    w("<details><summary>Per prompt</summary>\n\n")
    names = [m.name for m in b.methods]
    w(
        "| Task | Prompt | Prompt tok | New tok | Stop | "
        + " | ".join(f"{labels[n]} s" for n in names)
        + " | draftless | "
        + " | ".join(labels[p.name] for p in peers)
        + " |\n"
    )
    w("|" + "---|" * (5 + len(names) + 1 + len(peers)) + "\n")
    for task in b.tasks:
        for pr in task.prompts:
            secs = [
                f"{pr.methods[n].median_seconds:.2f} ({pr.methods[n].median_decode_seconds:.2f})"
                for n in names
            ]
            ours_r = pr.methods.get(DRAFTLESS)
            cells = [_prompt_cell(ours_r)] + [_prompt_cell(pr.methods[p.name]) for p in peers]
            w(
                f"| {task.task} | {pr.prompt_id} | {pr.prompt_tokens} | {pr.new_tokens} | "
                f"{pr.stop_reason} | " + " | ".join(secs) + " | " + " | ".join(cells) + " |\n"
            )
    w("\n</details>\n\n")


def _same_summary(s: MethodSummary) -> str:
    if s.identical is False:
        return "**NO**: " + ", ".join(s.mismatches)
    return _same(s.identical)


def _peer_cell(s: MethodSummary) -> str:
    acc = s.stats.acceptance if s.stats and s.stats.drafted else None
    same = _same_summary(s)
    return f"{_x(s.speedup)} ({_pct(acc)}, {same})"


def _prompt_cell(r: MethodResult | None) -> str:
    if r is None:
        return "–"
    acc = r.stats.acceptance if r.stats and r.stats.drafted else None
    cell = f"{_x(r.speedup)} {_pct(acc)}"
    if r.identical is False:
        cell += f" DIFFERS@{r.first_mismatch}"
        if r.mismatch_gap is not None:
            cell += f" (gap {r.mismatch_gap:.3g})"
    return cell


# -- JSON ----------------------------------------------------------------------------------------
def to_json(result: BenchResult) -> str:
    def default(obj: Any) -> Any:
        raise TypeError(f"not JSON serializable: {type(obj).__name__}")

    data = dataclasses.asdict(result)
    # derived ratios, for readers of the JSON
    for backend, raw in zip(result.backends, data["backends"], strict=True):
        for task, raw_task in zip(backend.tasks, raw["tasks"], strict=True):
            for name, summary in task.summary.items():
                if summary.stats is not None:
                    raw_task["summary"][name]["acceptance"] = summary.stats.acceptance
                    raw_task["summary"][name]["tokens_per_step"] = summary.stats.tokens_per_step
    return json.dumps(data, indent=1, default=default) + "\n"


# -- chart ---------------------------------------------------------------------------------------
def chart_png(result: BenchResult) -> bytes:
    """Grouped bars: speedup per task for draftless and every peer, one panel per backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    backends = [b for b in result.backends if b.tasks]
    fig, axes = plt.subplots(
        len(backends) or 1, 1, figsize=(11, 4.2 * max(1, len(backends))), squeeze=False
    )
    for ax, b in zip(axes[:, 0], backends, strict=False):
        labels = {m.name: m.label for m in b.methods}
        series = [m.name for m in b.methods if m.baseline is not None]
        width = 0.8 / max(1, len(series))
        xs = range(len(b.tasks))
        for i, name in enumerate(series):
            ys = [t.summary[name].speedup or 0.0 for t in b.tasks]
            pos = [x - 0.4 + width * (i + 0.5) for x in xs]
            bars = ax.bar(pos, ys, width, label=labels[name])
            for bar, y in zip(bars, ys, strict=True):
                ax.annotate(
                    f"{y:.2f}",
                    (bar.get_x() + bar.get_width() / 2, y),
                    ha="center",
                    va="bottom",
                    fontsize=7,
                )
        ax.axhline(1.0, color="black", linewidth=1, linestyle="--")
        ax.set_xticks(list(xs))
        ax.set_xticklabels([t.title for t in b.tasks], fontsize=8)
        ax.set_ylabel("speedup over its own plain (x)")
        ax.set_title(f"{b.model} on {b.backend}")
        ax.legend(fontsize=8, loc="upper right")
    mode = "quick" if result.settings.quick else "full"
    fig.suptitle(
        f"draftless bench ({mode}, {result.date}; {result.machine.cpu}, "
        f"{result.machine.cores} cores)",
        fontsize=10,
    )
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


# -- writing -------------------------------------------------------------------------------------
def write_atomic(path: Path, data: bytes) -> None:
    """Write to a temporary sibling, then rename over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_outputs(result: BenchResult, out_dir: Path) -> dict[str, Path]:
    paths = {
        "json": out_dir / "results.json",
        "markdown": out_dir / "results.md",
        "chart": out_dir / "speedups.png",
    }
    write_atomic(paths["json"], to_json(result).encode())
    write_atomic(paths["markdown"], markdown(result).encode())
    write_atomic(paths["chart"], chart_png(result))
    return paths


def all_targets(backends: Sequence[BackendResult]) -> tuple[Target, ...]:
    return tuple(t for b in backends for t in targets_for(b))
