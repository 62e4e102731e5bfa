"""The measurement: every method on every prompt, alternating, medians of several repetitions.

A *method* turns a prompt into tokens and two times: the wall time from prompt in to last
token out, and the time until the first forward after the prompt returned its tokens (prefill
plus first step). Ours are `plain` and `draftless` (the cascade + gate); peers (peers.py) bring
their own plain baseline. Per prompt:

    warm-up      every method once, a few tokens (full mode; every method runs once on the
                 first prompt of a backend in any mode, untimed)
    rep r        every method once, the order rotated by r so drift hits all alike
    speedup      decode speedup of method m over its baseline b
                 (decode tok/s): the tokens after the first forward over the time after it,
                 (d_b / k_b) / (d_m / k_m), d = median decode seconds over reps, k = decode
                 tokens; with identical output it is d_b / d_m. Prefill is the same work with
                 or without speculation, and on a slow CPU it would swamp the decode time.
    speedup_e2e  the same with the whole wall time, prefill included
    identical    every rep's tokens == our plain run's tokens (greedy: every method; sampled:
                 draftless only, same seed; a peer's sampler is not ours: n/a)

Per task: the median over prompts of the per-prompt speedups, the decode throughput ratio over
the whole task, and acceptance and tokens per step summed over every speculative run.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from draftless.bench.tasks import Task
from draftless.costs import CostTable
from draftless.decoder import SpecOptions, SpeculativeDecoder
from draftless.metrics import DecodeStats
from draftless.models.base import Model, ModelError
from draftless.sampling import SamplingOptions
from draftless.sources.cascade import SpeculationIndex

PLAIN = "plain"
DRAFTLESS = "draftless"
WARMUP_TOKENS = 4  # per prompt, before its reps (full mode)
WARMUP_FIRST_TOKENS = 32  # per backend, on the first prompt: enough to verify a few drafts


# -- what a method sees and returns -------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Job:
    """One prompt, tokenized for the backend under test."""

    task: str
    prompt_id: str
    ids: tuple[int, ...]  # chat-templated prompt tokens
    references: tuple[tuple[int, ...], ...]  # documents injected with add_reference
    temperature: float  # <= 0: greedy
    seed: int | None  # sampling seed, the same for every method and rep
    max_new_tokens: int


@dataclass(frozen=True, slots=True)
class Run:
    token_ids: tuple[int, ...]  # generated tokens, a stop token included
    seconds: float  # wall time, prompt in -> last token out
    first_seconds: float  # wall time until the first forward after the prompt returned
    first_tokens: int  # tokens that first forward committed (> 1 if it verified a draft)
    stats: DecodeStats | None = None  # per draft-source member in stats.members

    @property
    def decode_seconds(self) -> float:
        return self.seconds - self.first_seconds

    @property
    def decode_tokens(self) -> int:
        return len(self.token_ids) - self.first_tokens


class Method(Protocol):
    name: str  # key in results: "plain", "draftless", "hf-pld-10" ...
    label: str  # for tables: "transformers PLD n=10"
    baseline: str | None  # the method its speedup is measured against; None for baselines
    exact: bool  # our sampler: sampled tokens too must equal our plain run's (same seed)

    def run(self, job: Job) -> Run: ...


# -- our two methods --------------------------------------------------------------------------
class Ours:
    """Plain (source None) or speculative decoding through draftless' own decoder."""

    exact = True

    def __init__(
        self,
        model: Model,
        *,
        spec: bool,
        cost_table: CostTable,
        max_draft: int = SpecOptions().max_draft,
        make_source: Callable[[Model], Any] | None = None,
    ) -> None:
        self.model = model
        self.spec = spec
        self.name = DRAFTLESS if spec else PLAIN
        self.label = "draftless" if spec else "plain (draftless decoder)"
        self.baseline = PLAIN if spec else None
        self.cost_table = cost_table
        self.options = SpecOptions(max_draft=max_draft)
        self._make_source = make_source or _cascade

    def run(self, job: Job) -> Run:
        steps = self.start(job)  # building the index is per document, not per token: not timed
        t0 = time.perf_counter()
        tokens: list[int] = []
        first_seconds, first_tokens = 0.0, 0
        while (chunk := steps.step()) is not None:
            if not tokens:
                first_seconds, first_tokens = time.perf_counter() - t0, len(chunk)
            tokens.extend(chunk)
        seconds = time.perf_counter() - t0
        return Run(tuple(tokens), seconds, first_seconds, first_tokens, steps.stats)

    def start(
        self,
        job: Job,
        model: Model | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> Steps:
        """The run of `job` a decoder step at a time, on `model` (default: this method's;
        the bench's lockstep gives each of ours its own copy), the decoder timing its
        forwards with `clock` (the live-timed gate's)."""
        model = model or self.model
        source = None
        if self.spec:
            source = self._make_source(model)
            for ref in job.references:
                source.add_reference(list(ref))
        return Steps(self, job, model, source, clock)


class Steps:
    """One run of `Ours`, a decoder step per `step()`: the first clears the cache, prefills
    the prompt and makes the first forward; None once the run has ended."""

    def __init__(
        self, method: Ours, job: Job, model: Model, source: Any, clock: Callable[[], float]
    ) -> None:
        self._method, self._job, self._model, self._source = method, job, model, source
        self._clock = clock
        self._decoder: SpeculativeDecoder | None = None
        self._chunks: Iterator[list[int]] | None = None

    def step(self) -> list[int] | None:
        if self._chunks is None:
            job, method = self._job, self._method
            self._model.truncate(0)
            self._decoder = SpeculativeDecoder(
                self._model,
                sampling=SamplingOptions(temperature=max(0.0, job.temperature), seed=job.seed),
                source=self._source,
                options=method.options,
                cost_table=method.cost_table,
                clock=self._clock,
            )
            self._decoder.append(job.ids)
            self._chunks = self._decoder.stream(job.max_new_tokens)
        return next(self._chunks, None)

    @property
    def stats(self) -> DecodeStats | None:
        return None if self._decoder is None else self._decoder.stats


def lockstep(steps: Sequence[Steps], clock: Callable[[], float] = time.perf_counter) -> list[Run]:
    """Runs several a step each in turn until all have ended, each charged only the time of
    its own steps. Whatever else the machine does in a stretch of a few steps lands on every
    run alike, so their ratio is measured far more tightly than between whole runs made one
    after the other (the sequential bench reads identical work within ~3% per prompt on these
    shared machines; `benchmarks/noise_floor.py`)."""
    n = len(steps)
    spent = [0.0] * n
    tokens: list[list[int]] = [[] for _ in range(n)]
    first = [(0.0, 0)] * n
    live = list(range(n))
    while live:
        for i in tuple(live):
            t0 = clock()
            chunk = steps[i].step()
            spent[i] += clock() - t0
            if chunk is None:
                live.remove(i)
                continue
            if not tokens[i]:
                first[i] = (spent[i], len(chunk))
            tokens[i].extend(chunk)
    return [
        Run(tuple(tokens[i]), spent[i], first[i][0], first[i][1], steps[i].stats) for i in range(n)
    ]


def _cascade(model: Model) -> SpeculationIndex:
    return SpeculationIndex(model.vocab_size)


# -- results ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class MethodResult:
    """One method on one prompt."""

    method: str
    seconds: tuple[float, ...]  # wall time, one per rep, in rep order
    median_seconds: float
    decode_seconds: tuple[float, ...]  # after the first forward, one per rep
    median_decode_seconds: float
    tokens: int  # generated tokens (median over reps)
    decode_tokens: int  # tokens after the first forward (median over reps)
    tokens_per_second: float  # decode tok/s
    speedup: float | None  # decode speedup over its baseline; None for a baseline
    speedup_e2e: float | None  # wall-time speedup, prefill included
    identical: bool | None  # tokens == our plain run's on every rep; None: not comparable
    first_mismatch: int | None  # first differing position (over reps), None if identical
    # At first_mismatch: logit of our plain token minus logit of this method's token, in the
    # row our model gives after the plain prefix. Small (<< 1) means a near-tie that rounding
    # differences of a batched forward can flip; large means a real divergence.
    mismatch_gap: float | None
    stats: DecodeStats | None  # summed over reps, per member in stats.members


@dataclass(frozen=True, slots=True)
class PromptResult:
    task: str
    prompt_id: str
    prompt_tokens: int
    new_tokens: int  # of our plain run
    stop_reason: str  # "stop" (eos) or "length", of our plain run
    methods: dict[str, MethodResult]


@dataclass(frozen=True, slots=True)
class MethodSummary:
    """One method on one task."""

    method: str
    speedup: float | None  # median over prompts of the per-prompt decode speedup
    speedup_min: float | None
    speedup_max: float | None
    speedup_e2e: float | None  # median over prompts of the wall-time speedup
    throughput_ratio: float | None  # whole task: decode (sum k / sum d) over the baseline's
    tokens_per_second: float  # whole task, decode tok/s
    identical: bool | None  # every prompt identical; None: not comparable
    mismatches: tuple[str, ...]  # "prompt@position" of every mismatching prompt
    stats: DecodeStats | None


@dataclass(frozen=True, slots=True)
class TaskResult:
    task: str
    title: str
    kind: str
    temperature: float
    prompts: tuple[PromptResult, ...]
    summary: dict[str, MethodSummary]


@dataclass(frozen=True, slots=True)
class MethodInfo:
    name: str
    label: str
    baseline: str | None
    exact: bool


@dataclass(frozen=True, slots=True)
class BackendResult:
    backend: str
    model: str
    cost_table: dict[str, Any]  # {"origin": "probe"|"default"|"measured", "ks", "costs"}
    methods: tuple[MethodInfo, ...]
    notes: tuple[str, ...]  # skipped peers and why, and other caveats
    load_seconds: float
    tasks: tuple[TaskResult, ...]
    seconds: float  # wall time of this backend's whole run
    threads: int | None = None  # the model's CPU threads (None: the backend does not say)
    dtype: str | None = None  # what transformers computes in (None: llama.cpp, the GGUF's types)


@dataclass(frozen=True, slots=True)
class Settings:
    quick: bool
    reps: int
    max_new_tokens: int
    prompts_per_task: int | None  # None: all
    tasks: tuple[str, ...]
    backends: tuple[str, ...]
    peers: bool
    lockstep: bool = False  # ours a step each in turn, each on its own copy of the model


# -- the measurement ------------------------------------------------------------------------------
Log = Callable[[str], None]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass
class Runner:
    """Runs `methods` (ours first) over `tasks` on one model."""

    model: Model
    methods: Sequence[Method]
    reps: int = 3
    max_new_tokens: int = 192
    prompts_per_task: int | None = None
    warmup: bool = True  # every method once on the first prompt, before any timing
    warmup_each_prompt: bool = True  # and a few tokens of every method before each prompt
    log: Log = field(default=_stderr)
    # A second copy of the model: ours (plain and draftless) then run in lockstep, a step
    # each in turn, each on its own copy, the copies swapped every rep; peers run whole.
    twin: Model | None = None
    clock: Callable[[], float] = time.perf_counter  # lockstep's

    def __post_init__(self) -> None:
        if self.reps < 1:
            raise ValueError(f"reps must be >= 1, got {self.reps}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        names = [m.name for m in self.methods]
        if PLAIN not in names:
            raise ValueError("the methods must include our plain baseline")
        for m in self.methods:
            if m.baseline is not None and m.baseline not in names:
                raise ValueError(f"method {m.name}: baseline {m.baseline} is not run")

    def _split(self) -> tuple[list[Ours], list[Method]]:
        """(ours, to run in lockstep; the rest): ours is empty without a twin."""
        if self.twin is None:
            return [], list(self.methods)
        ours = [m for m in self.methods if isinstance(m, Ours)]
        return ours, [m for m in self.methods if not isinstance(m, Ours)]

    def _lockstep(self, ours: Sequence[Ours], job: Job, rep: int) -> list[Run]:
        """Ours on `job` in lockstep, the i-th on copy i + rep (mod 2): two copies of a model
        in one process run a few tenths of a percent apart, so every method spends as many
        reps on each (the order of the turns swaps with them)."""
        assert self.twin is not None
        copies = (self.model, self.twin)
        turn = [(i + rep) % 2 for i in range(len(ours))]
        order = sorted(range(len(ours)), key=lambda i: turn[i])
        steps = [ours[i].start(job, copies[turn[i]], self.clock) for i in order]
        runs = lockstep(steps, self.clock)
        return [runs[order.index(i)] for i in range(len(ours))]

    def _once_each(self, job: Job) -> None:
        """Every method once on `job`, untimed (with a twin, ours on both copies)."""
        ours, others = self._split()
        for m in others:
            m.run(job)
        for rep in range(2 if ours else 0):
            self._lockstep(ours, job, rep)

    def jobs(self, task: Task) -> list[Job]:
        tok = self.model.tokenizer
        refs = tuple(tuple(tok.encode(r)) for r in task.references)
        prompts = task.prompts[: self.prompts_per_task] if self.prompts_per_task else task.prompts
        return [
            Job(
                task.name,
                p.id,
                tuple(_chat_ids(self.model, p.text) + _encode(self.model, p.answer_prefix)),
                refs,
                task.temperature,
                p.seed,
                self.max_new_tokens,
            )
            for p in prompts
        ]

    def run(self, tasks: Sequence[Task]) -> list[TaskResult]:
        jobs = {t.name: self.jobs(t) for t in tasks}
        first = next((js[0] for js in jobs.values() if js), None)
        if self.warmup and first is not None:  # JIT compiles, allocator, thread pools
            short = replace(first, max_new_tokens=min(WARMUP_FIRST_TOKENS, first.max_new_tokens))
            self._once_each(short)
        return [self.run_task(t, jobs[t.name]) for t in tasks]

    def run_task(self, task: Task, jobs: Sequence[Job]) -> TaskResult:
        self.log(f"[{self.model.backend}] {task.name}: {task.title}")
        prompts = tuple(self.run_prompt(task, job) for job in jobs)
        summary = {m.name: summarize(m, prompts) for m in self.methods}
        return TaskResult(task.name, task.title, task.kind, task.temperature, prompts, summary)

    def run_prompt(self, task: Task, job: Job) -> PromptResult:
        if self.warmup and self.warmup_each_prompt:
            self._once_each(replace(job, max_new_tokens=min(WARMUP_TOKENS, job.max_new_tokens)))
        runs: dict[str, list[Run]] = {m.name: [] for m in self.methods}
        ours, others = self._split()
        order: list[Sequence[Method]] = (
            [ours, *([m] for m in others)] if ours else [[m] for m in self.methods]
        )
        for rep in range(self.reps):
            k = rep % len(order)
            for unit in order[k:] + order[:k]:
                if unit is ours:
                    for one, run in zip(ours, self._lockstep(ours, job, rep), strict=True):
                        runs[one.name].append(run)
                else:
                    runs[unit[0].name].append(unit[0].run(job))
        reference = runs[PLAIN][0]
        results: dict[str, MethodResult] = {}
        for m in self.methods:
            comparable = m.exact or not task.sampled  # greedy: argmax is argmax anywhere
            results[m.name] = _method_result(m, runs[m.name], reference, comparable)
        gaps: dict[tuple[int, int | None], float | None] = {}  # peers often share a mismatch
        for m in self.methods:
            r = results[m.name]
            at = r.first_mismatch
            if at is not None:
                other = next(
                    x.token_ids
                    for x in runs[m.name]
                    if first_mismatch(reference.token_ids, x.token_ids) == at
                )
                key = (at, other[at] if at < len(other) else None)
                if key not in gaps:
                    gaps[key] = logit_gap(self.model, job.ids, reference.token_ids, other, at)
                results[m.name] = replace(r, mismatch_gap=gaps[key])
        paired = {m.name for m in ours}  # ran in lockstep: each rep's two runs share its time
        for m in self.methods:  # speedups need every method's medians first
            if m.baseline is not None:
                mine, base = results[m.name], results[m.baseline]
                ratio = paired_ratio if {m.name, m.baseline} <= paired else median_ratio
                results[m.name] = replace(
                    mine,
                    speedup=ratio(
                        base.decode_seconds,
                        base.decode_tokens,
                        mine.decode_seconds,
                        mine.decode_tokens,
                    ),
                    speedup_e2e=ratio(base.seconds, base.tokens, mine.seconds, mine.tokens),
                )
        plain = results[PLAIN]
        stop = (
            "stop"
            if reference.token_ids and reference.token_ids[-1] in self.model.eos_token_ids
            else "length"
        )
        line = (
            f"  {task.name}/{job.prompt_id}: {len(job.ids)} prompt tokens, "
            f"{len(reference.token_ids)} new ({stop}); plain {plain.median_seconds:.2f}s "
            f"(decode {plain.median_decode_seconds:.2f}s)"
        )
        for m in self.methods:
            r = results[m.name]
            if r.speedup is not None:
                same = (
                    ""
                    if r.identical is not False
                    else f" DIFFERS@{r.first_mismatch}"
                    + (f" (gap {r.mismatch_gap:.3g})" if r.mismatch_gap is not None else "")
                )
                acc = r.stats.acceptance if r.stats else None
                line += (
                    f" | {m.name} {r.speedup:.2f}x"
                    + (f" acc {acc:.0%}" if acc is not None else "")
                    + same
                )
        self.log(line)
        return PromptResult(
            task.name, job.prompt_id, len(job.ids), len(reference.token_ids), stop, results
        )


def _encode(model: Model, text: str) -> list[int]:
    return model.tokenizer.encode(text) if text else []


def _chat_ids(model: Model, text: str) -> list[int]:
    try:
        return model.tokenizer.apply_chat_template([{"role": "user", "content": text}])
    except ModelError:  # a model without a chat template: the raw prompt
        return model.tokenizer.encode(text, add_special=True)


def _method_result(
    m: Method, runs: Sequence[Run], reference: Run, comparable: bool
) -> MethodResult:
    seconds = tuple(r.seconds for r in runs)
    med = statistics.median(seconds)
    decode = tuple(r.decode_seconds for r in runs)
    med_decode = statistics.median(decode)
    tokens = int(statistics.median(len(r.token_ids) for r in runs))
    decode_tokens = int(statistics.median(r.decode_tokens for r in runs))
    identical: bool | None = None
    mismatch: int | None = None
    if comparable:
        positions = [first_mismatch(reference.token_ids, r.token_ids) for r in runs]
        found = [p for p in positions if p is not None]
        identical = not found
        mismatch = min(found) if found else None
    stats = None
    if any(r.stats is not None for r in runs):
        stats = sum((r.stats for r in runs if r.stats is not None), DecodeStats())
    return MethodResult(
        m.name,
        seconds,
        med,
        decode,
        med_decode,
        tokens,
        decode_tokens,
        decode_tokens / med_decode if med_decode > 0 else 0.0,
        None,
        None,
        identical,
        mismatch,
        None,
        stats,
    )


def first_mismatch(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first position where a and b differ (a length difference counts); None if equal.

    first_mismatch([1, 2, 3], [1, 2, 3]) is None; first_mismatch([1, 2, 3], [1, 5]) == 1;
    first_mismatch([1, 2], [1, 2, 7]) == 2.
    """
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def logit_gap(
    model: Model, ids: Sequence[int], plain: Sequence[int], other: Sequence[int], at: int
) -> float | None:
    """Logit of plain[at] minus logit of other[at], after the prompt and plain[:at].

    None when either stream has ended by `at` (one stopped, the other went on).
    """
    if at >= len(plain) or at >= len(other):
        return None
    prefix = [*ids, *plain[:at]]
    model.truncate(0)
    if len(prefix) > 1:
        model.prefill(prefix[:-1])
    row = model.forward(prefix[-1:])[0]  # [vocab]
    model.truncate(0)
    return float(row[plain[at]]) - float(row[other[at]])


def _ratio(t_base: float, n_base: int, t_mine: float, n_mine: int) -> float | None:
    """Speedup (t_b / n_b) / (t_m / n_m): t_b / t_m when both made the same tokens."""
    if t_base <= 0 or t_mine <= 0 or n_base <= 0 or n_mine <= 0:
        return None
    return (t_base / n_base) / (t_mine / n_mine)


def median_ratio(
    base: Sequence[float], n_base: int, mine: Sequence[float], n_mine: int
) -> float | None:
    """The speedup of runs not paired rep by rep: each side's median seconds."""
    return _ratio(statistics.median(base), n_base, statistics.median(mine), n_mine)


def paired_ratio(
    base: Sequence[float], n_base: int, mine: Sequence[float], n_mine: int
) -> float | None:
    """The speedup of runs paired rep by rep (lockstep): the median of the reps' own ratios,
    taken in logs, so an even number of reps gives the geometric mean of the middle two.

    A rep's two runs share every stretch of the machine's time, so its ratio is the paired
    measurement; the median of each side's seconds would pair one rep's plain with another
    rep's draftless and let one run's own stall, or a drift across reps, move the ratio. In
    logs, the two copies of the model (which swap every rep and run a little apart) cancel
    over an even number of reps: paired_ratio([1, 10], 1, [10, 1], 1) == 1.0, where the
    median of the ratios [0.1, 10] would read 5.05.
    """
    ratios = [_ratio(b, n_base, m, n_mine) for b, m in zip(base, mine, strict=True)]
    if not ratios or any(r is None for r in ratios):
        return None
    return math.exp(statistics.median(math.log(r) for r in ratios if r is not None))


def summarize(m: Method, prompts: Sequence[PromptResult]) -> MethodSummary:
    mine = [p.methods[m.name] for p in prompts]
    speedups = [r.speedup for r in mine if r.speedup is not None]
    e2e = [r.speedup_e2e for r in mine if r.speedup_e2e is not None]
    k = sum(r.decode_tokens for r in mine)
    d = sum(r.median_decode_seconds for r in mine)
    throughput = None
    if m.baseline is not None:
        base = [p.methods[m.baseline] for p in prompts]
        kb = sum(r.decode_tokens for r in base)
        db = sum(r.median_decode_seconds for r in base)
        throughput = _ratio(db, kb, d, k)
    flags = [r.identical for r in mine]
    identical = None if any(f is None for f in flags) else all(flags)
    mismatches = tuple(
        f"{p.prompt_id}@{r.first_mismatch}"
        + (f" (gap {r.mismatch_gap:.3g})" if r.mismatch_gap is not None else "")
        for p, r in zip(prompts, mine, strict=True)
        if r.identical is False
    )
    stats = [r.stats for r in mine if r.stats is not None]
    return MethodSummary(
        m.name,
        statistics.median(speedups) if speedups else None,
        min(speedups) if speedups else None,
        max(speedups) if speedups else None,
        statistics.median(e2e) if e2e else None,
        throughput,
        k / d if d > 0 else 0.0,
        identical,
        mismatches,
        sum(stats, DecodeStats()) if stats else None,
    )


def method_info(methods: Sequence[Method]) -> tuple[MethodInfo, ...]:
    return tuple(MethodInfo(m.name, m.label, m.baseline, m.exact) for m in methods)
