"""The bench: task files, the measurement on a numpy model, the outputs, the CLI's errors."""

from __future__ import annotations

import gc
import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from draftless.bench import report
from draftless.bench.peers import peer_stats
from draftless.bench.runner import (
    DRAFTLESS,
    PLAIN,
    Job,
    Ours,
    Runner,
    Settings,
    first_mismatch,
    lockstep,
    paired_ratio,
)
from draftless.bench.tasks import (
    MIN_PROMPTS,
    TASK_ORDER,
    Task,
    TaskError,
    load_task,
    load_tasks,
)
from draftless.cli import main
from draftless.cli.bench import bench_backend, build_result, select_peers
from draftless.costs import CostTable
from draftless.metrics import DecodeStats
from fakes import InductionModel


# -- tasks ---------------------------------------------------------------------------------------
def test_every_task_loads_with_enough_prompts() -> None:
    tasks = load_tasks()
    assert [t.name for t in tasks] == list(TASK_ORDER)
    for task in tasks:
        assert len(task.prompts) >= MIN_PROMPTS, task.name
        assert task.kind in ("retrieval", "free")
        for p in task.prompts:
            assert p.text.strip() and "{{file:" not in p.text, (task.name, p.id)
            assert (p.seed is not None) == task.sampled
    kinds = {t.name: t.kind for t in tasks}
    assert kinds["free-form"] == "free"
    assert sum(k == "retrieval" for k in kinds.values()) == 5


def test_task_contents_match_the_issue() -> None:
    sampled = load_task("grounded-copy-sampled")
    copy = load_task("grounded-copy")
    assert sampled.temperature == 0.7
    assert [p.text for p in sampled.prompts] == [p.text for p in copy.prompts]
    assert len({p.seed for p in sampled.prompts}) == len(sampled.prompts)

    rag = load_task("rag-reference")
    assert len(rag.references) == 1 and len(rag.references[0]) > 500
    assert all(rag.references[0].strip() in p.text for p in rag.prompts)

    edit = load_task("code-edit")
    for p in edit.prompts:
        lines = p.text.split("```python\n", 1)[1].split("```", 1)[0].splitlines()
        assert 90 <= len(lines) <= 110, p.id  # a ~100-line source file, whole


def test_malformed_tasks_are_named(tmp_path: Path) -> None:
    (tmp_path / "few").mkdir()
    (tmp_path / "few" / "task.json").write_text(
        json.dumps(
            {
                "title": "Few",
                "kind": "free",
                "temperature": 0.0,
                "prompts": [{"id": "a", "text": "x"}, {"id": "b", "text": "y"}],
            }
        )
    )
    with pytest.raises(TaskError, match="at least 3"):
        load_task("few", tmp_path)
    (tmp_path / "missing").mkdir()
    (tmp_path / "missing" / "task.json").write_text(
        json.dumps(
            {
                "title": "M",
                "kind": "free",
                "temperature": 0.0,
                "prompts": [{"id": str(i), "text": "{{file:nope.txt}}"} for i in range(3)],
            }
        )
    )
    with pytest.raises(TaskError, match=r"nope\.txt"):
        load_task("missing", tmp_path)
    with pytest.raises(TaskError, match="unknown task 'zzz'"):
        load_tasks(["zzz"], tmp_path)


# -- small exact pieces --------------------------------------------------------------------------
def test_first_mismatch() -> None:
    assert first_mismatch([1, 2, 3], [1, 2, 3]) is None
    assert first_mismatch([1, 2, 3], [1, 5]) == 1
    assert first_mismatch([1, 2], [1, 2, 7]) == 2
    assert first_mismatch([], []) is None


def test_peer_stats_counts_forwards() -> None:
    # prompt of 5: the prompt forward commits 1; a forward of 3 verifies a 2-token draft and
    # commits 2 (1 accepted + correction); a plain forward commits 1.
    s = peer_stats([5, 3, 1], prompt_len=5, committed=4)
    assert (s.steps, s.verify_steps, s.plain_steps) == (3, 1, 2)
    assert (s.drafted, s.accepted, s.committed) == (2, 1, 4)
    # transformers drafts in the prompt forward already: 5 prompt + 4 drafted, all accepted
    s = peer_stats([9], prompt_len=5, committed=5)
    assert (s.drafted, s.accepted, s.verify_steps) == (4, 4, 1)


# -- the measurement on a numpy model, end to end --------------------------------------------------
@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DRAFTLESS_CACHE", str(tmp_path / "cache"))  # no stored cost tables
    return tmp_path


def test_quick_run_on_fake_model_is_identical_and_writes_reports(cache: Path) -> None:
    tasks = load_tasks()
    settings = Settings(
        quick=True,
        reps=2,
        max_new_tokens=24,
        prompts_per_task=2,
        tasks=tuple(t.name for t in tasks),
        backends=("fake",),
        peers=True,
    )
    lines: list[str] = []
    backend = bench_backend(
        lambda: InductionModel(vocab=50, seed=0), tasks, settings, log=lines.append
    )
    assert backend.backend == "fake" and backend.cost_table["origin"] == "default"
    assert any("no peers" in n for n in backend.notes)
    assert [t.task for t in backend.tasks] == list(TASK_ORDER)
    for task in backend.tasks:
        assert len(task.prompts) == 2
        for pr in task.prompts:
            assert pr.new_tokens == 24 and pr.stop_reason == "length"
            assert pr.methods[PLAIN].identical is True
            spec = pr.methods[DRAFTLESS]
            assert spec.identical is True, (task.task, pr.prompt_id, spec.first_mismatch)
            assert spec.speedup is not None and spec.speedup > 0
            assert spec.speedup_e2e is not None and spec.speedup_e2e > 0
            assert 0 < spec.median_decode_seconds < spec.median_seconds
            assert spec.decode_tokens < spec.tokens == 24
            assert len(spec.seconds) == 2
        assert task.summary[DRAFTLESS].identical is True
    drafted = sum(t.summary[DRAFTLESS].stats.drafted for t in backend.tasks)  # type: ignore[union-attr]
    assert drafted > 0  # the cascade did speculate somewhere

    result = build_result("draftless bench --quick", settings, [backend], 1.0)
    out = cache / "out"
    paths = report.write_outputs(result, out)
    data = json.loads(paths["json"].read_text())
    assert data["settings"]["quick"] is True
    assert data["machine"]["cores"] >= 1
    assert data["backends"][0]["tasks"][0]["summary"][DRAFTLESS]["identical"] is True
    md = paths["markdown"].read_text()
    assert "| Grounded copy |" in md and "## Targets" in md and "`draftless bench --quick`" in md
    assert paths["chart"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(os.listdir(out)) == ["results.json", "results.md", "speedups.png"]
    free = [t for t in result.targets if t.task == "free-form"]
    assert len(free) == 1 and free[0].needed == report.FREE_FORM_FLOOR
    # the free-form target is judged on the worst prompt, which the table shows beside the median
    (free_task,) = [t for t in backend.tasks if t.task == "free-form"]
    speedups = {p.prompt_id: p.methods[DRAFTLESS].speedup for p in free_task.prompts}
    worst_id = min(speedups, key=lambda k: speedups[k] or 0.0)
    assert free[0].got == speedups[worst_id] and f"worst prompt {worst_id}" in free[0].why
    assert "| Worst prompt |" in md and f"({worst_id})" in md
    # beside it, what its verifies model by the table, and the run's prompts with no verify
    table = report._table(backend)
    assert table is not None
    stats = {p.prompt_id: p.methods[DRAFTLESS].stats for p in free_task.prompts}
    worst_stats = stats[worst_id]
    assert worst_stats is not None
    if worst_stats.verify_steps:
        modeled = report.modeled_speedup(worst_stats, table)
        assert f"its verifies by the cost table: {modeled:.3f}x" in free[0].why
    else:
        assert f"worst prompt {worst_id} (no verify)" in free[0].why
    idle = [k for k, st in stats.items() if st is not None and st.verify_steps == 0]
    assert (f"{len(idle)} of {len(stats)} prompts made no verify" in free[0].why) == bool(idle)


def test_modeled_speedup_prices_every_forward_by_the_table() -> None:
    """Oracle by hand: 10 plain steps and two verifies of 3 draft tokens (C(4) = 2.0 each)
    committed 10 + 4 + 2 tokens at a cost of 10 + 2 x 2.0 plain steps."""
    table = CostTable((1, 2, 4, 8), (1.0, 1.5, 2.0, 3.0))
    stats = DecodeStats(steps=12, plain_steps=10, verify_steps=2, committed=16)
    stats.draft_lengths[3] = 2
    assert report.modeled_speedup(stats, table) == pytest.approx(16 / 14)
    plain = DecodeStats(steps=7, plain_steps=7, committed=7)
    assert report.modeled_speedup(plain, table) == 1.0  # plain decoding models at exactly 1
    assert report.modeled_speedup(DecodeStats(), table) is None


def test_outputs_are_replaced_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "results.md"
    report.write_atomic(path, b"old")

    def fail(src: object, dst: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(report.os, "replace", fail)
    with pytest.raises(OSError):
        report.write_atomic(path, b"new")
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["results.md"]  # no temporary file left behind


def test_a_task_folder_of_ones_own_loads_beside_the_suite(tmp_path: Path) -> None:
    mine = tmp_path / "my-prompts"
    mine.mkdir()
    (mine / "task.json").write_text(
        json.dumps(
            {
                "title": "Mine",
                "kind": "free",
                "temperature": 0.0,
                "prompts": [{"id": str(i), "text": f"Say {i}."} for i in range(3)],
            }
        )
    )
    tasks = load_tasks([str(mine), "free-form"])
    assert [t.name for t in tasks] == ["free-form", "my-prompts"]
    assert [p.text for p in tasks[1].prompts] == ["Say 0.", "Say 1.", "Say 2."]
    with pytest.raises(TaskError, match=r"or a folder holding a task\.json"):
        load_tasks([str(tmp_path / "nothing-here")])
    clash = tmp_path / "x" / "free-form"
    clash.mkdir(parents=True)
    (clash / "task.json").write_text((mine / "task.json").read_text())
    with pytest.raises(TaskError, match="two tasks are named 'free-form'"):
        load_tasks(["free-form", str(clash)])


# -- the command line ------------------------------------------------------------------------------
def test_bad_task_name_is_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--tasks", "grounded-copy", "no-such-task"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("draftless: error: unknown task 'no-such-task': use one of ")


@pytest.mark.parametrize(
    "flag",
    [
        ["--reps", "0"],
        ["--max-new-tokens", "0"],
        ["--prompts", "0"],
        ["--threads", "0"],
        ["--no-peers", "--peers", "lsrv-ngram-mod"],
    ],
)
def test_bad_numbers_are_one_line_errors(
    flag: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", *flag]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("draftless: error: --")


@dataclass
class _Peer:
    name: str
    baseline: str | None


def test_selected_peers_bring_their_baselines_and_keep_their_order() -> None:
    peers = [
        _Peer("lcp-generate", None),
        _Peer("lcp-pld-2", "lcp-generate"),
        _Peer("lsrv-plain", None),
        _Peer("lsrv-ngram-mod", "lsrv-plain"),
        _Peer("lsrv-ngram-simple", "lsrv-plain"),
    ]
    chosen = select_peers(peers, ["lsrv-ngram-simple", "lcp-pld-2"])  # type: ignore[arg-type]
    assert [p.name for p in chosen] == [
        "lcp-generate",
        "lcp-pld-2",
        "lsrv-plain",
        "lsrv-ngram-simple",
    ]
    assert [p.name for p in select_peers(peers, ["lsrv-plain"])] == ["lsrv-plain"]  # type: ignore[arg-type]
    # a name of another backend's peer selects nothing here (the caller notes it)
    assert select_peers(peers, ["hf-pld-10"]) == []  # type: ignore[arg-type]


def test_an_unknown_peer_is_refused_before_any_model_loads(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_load(*args: object, **kwargs: object) -> None:
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("draftless.cli.bench._load", no_load)
    assert main(["bench", "--peers", "lsrv-ngram-mod", "lsrv-eagle"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "unknown peer 'lsrv-eagle'; peers: hf-generate, " in err and "lsrv-draft" in err


def test_a_finished_backend_is_written_before_the_next_one_runs(
    cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two backends: the second fails with an error the bench does not expect; the first
    backend's report is on disk all the same."""
    loads: list[str] = []

    def load(model: str, backend: str, options: dict[str, object]) -> InductionModel:
        loads.append(backend)
        if backend == "hf":
            raise RuntimeError("the second backend broke")
        return InductionModel(vocab=50, seed=0)

    monkeypatch.setattr("draftless.cli.bench._load", load)
    out = cache / "out"
    args = ["bench", "--backend", "both", "--tasks", "repetition", "--prompts", "1"]
    args += ["--reps", "1", "-n", "8", "--no-peers", "--out", str(out)]
    with pytest.raises(RuntimeError, match="second backend"):
        main(args)
    assert loads == ["llamacpp", "hf"]
    data = json.loads((out / "results.json").read_text())
    assert [b["backend"] for b in data["backends"]] == ["fake"]
    assert "repetition" in (out / "results.md").read_text().lower()


def _one_repetition_prompt(lockstep: bool = False) -> tuple[list[Task], Settings]:
    """The repetition task's first prompt, one rep of 8 tokens, on a fake backend."""
    settings = Settings(
        quick=True,
        reps=1,
        max_new_tokens=8,
        prompts_per_task=1,
        tasks=("repetition",),
        backends=("fake",),
        peers=False,
        lockstep=lockstep,
    )
    return load_tasks(["repetition"]), settings


def test_threads_reach_the_model_and_the_report(cache: Path) -> None:
    tasks, settings = _one_repetition_prompt()
    model = InductionModel(vocab=50, seed=0)
    model.threads = 3  # type: ignore[misc]
    backend = bench_backend(lambda: model, tasks, settings)
    assert backend.threads == 3
    md = report.markdown(build_result("draftless bench", settings, [backend], 1.0))
    assert "; 3 threads." in md


# -- lockstep: ours a step each in turn, each on its own copy --------------------------------------
class _FakeClock:
    """Time moves only in forwards: each model copy charges its own price per forward."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def charge(self, model: InductionModel, price: float) -> InductionModel:
        def on_forward(ids: list[int]) -> None:
            self.now += price

        model.on_forward = on_forward
        return model


def _ours(model: InductionModel) -> list[Ours]:
    table = CostTable.from_mapping({1: 1.0, 2: 1.1, 64: 2.0})  # verifies nearly free
    return [Ours(model, spec=False, cost_table=table), Ours(model, spec=True, cost_table=table)]


def test_lockstep_charges_each_run_only_its_own_steps() -> None:
    clock = _FakeClock()
    cheap = clock.charge(InductionModel(vocab=50, seed=0), 1.0)
    dear = clock.charge(InductionModel(vocab=50, seed=0), 100.0)
    plain, spec = _ours(cheap)
    job = Job("t", "p", tuple(range(30)) * 2, (), 0.0, None, 40)
    runs = lockstep([plain.start(job, cheap, clock), spec.start(job, dear, clock)], clock)
    assert runs[0].token_ids == runs[1].token_ids and len(runs[0].token_ids) == 40
    # every step interleaved, yet each run is charged exactly its own forwards' prices
    cheap_calls, dear_calls = len(cheap.forward_calls), len(dear.forward_calls)
    assert dear_calls < cheap_calls == 40  # plain: a forward a token; spec verified drafts
    assert runs[0].seconds == cheap_calls * 1.0 and runs[0].first_seconds == 1.0
    assert runs[1].seconds == dear_calls * 100.0 and runs[1].first_seconds == 100.0
    assert runs[1].stats is not None and runs[1].stats.steps == dear_calls


def test_a_lockstep_bench_swaps_the_copies_every_rep() -> None:
    clock = _FakeClock()
    model = clock.charge(InductionModel(vocab=50, seed=0), 1.0)
    twin = clock.charge(InductionModel(vocab=50, seed=0), 10.0)
    runner = Runner(
        model, _ours(model), reps=2, max_new_tokens=24, log=lambda _: None, twin=twin, clock=clock
    )
    (task,) = runner.run(load_tasks(["grounded-copy"])[:1])
    for pr in task.prompts[:2]:
        plain, spec = pr.methods[PLAIN], pr.methods[DRAFTLESS]
        assert plain.identical is True and spec.identical is True
        # plain ran on the copy at 1 a forward, then on the one at 10: 23 forwards after its first
        assert plain.decode_seconds == (23.0, 230.0)
        # draftless the other way round, in fewer forwards (the same ones in both reps)
        assert spec.decode_seconds[0] == 10 * spec.decode_seconds[1] < 10 * 23.0
        assert spec.stats is not None and spec.stats.verify_steps > 0
        # the speedup pairs the reps; the copies' 10x cancels in logs (the median of the two
        # ratios would read 50.5 times the speedup over 10): plain's 1 a token on the cheap
        # copy over draftless's seconds a token there
        ours_per_token = spec.decode_seconds[1] / spec.decode_tokens
        assert spec.speedup == pytest.approx(1.0 / ours_per_token)


def test_a_lockstep_bench_reads_each_rep_against_its_own_pair() -> None:
    # the machine slows rep by rep (every forward costs 1, 2, 3 in reps 0, 1, 2, both runs
    # alike) and draftless stalls once on its own in rep 0: its speedup is each rep's ratio
    clock = _FakeClock()
    model, twin = InductionModel(vocab=50, seed=0), InductionModel(vocab=50, seed=0)
    runner = Runner(
        model,
        _ours(model),
        reps=3,
        max_new_tokens=24,
        prompts_per_task=1,
        warmup=False,
        warmup_each_prompt=False,
        log=lambda _: None,
        twin=twin,
        clock=clock,
    )
    task = load_tasks(["grounded-copy"])[0]
    prompt = len(runner.jobs(task)[0].ids)
    firsts, twins = [0], [0]  # runs started (two a rep), the twin's forwards

    def charge(copy: InductionModel) -> None:
        def on_forward(ids: list[int]) -> None:
            firsts[0] += copy.n_past == prompt - 1  # a run's first forward
            twins[0] += copy is twin
            stall = 30.0 if copy is twin and twins[0] == 2 else 0.0  # rep 0's draftless
            clock.now += (firsts[0] - 1) // 2 + 1 + stall

        copy.on_forward = on_forward

    charge(model)
    charge(twin)
    (result,) = runner.run([task])
    plain, spec = result.prompts[0].methods[PLAIN], result.prompts[0].methods[DRAFTLESS]
    assert plain.decode_seconds == (23.0, 46.0, 69.0)
    # its forwards after the first, x1 (+30: its gate reads the clock, so may decide
    # otherwise in that rep), x2, x3
    stalled, slow, slower = spec.decode_seconds
    assert stalled > 30 and slow / 2 == slower / 3 < 23
    per_token = zip(plain.decode_seconds, spec.decode_seconds, strict=True)
    ratios = [p / plain.decode_tokens / (s / spec.decode_tokens) for p, s in per_token]
    assert spec.speedup == pytest.approx(sorted(ratios)[1])  # rep 1's or rep 2's: equal
    assert ratios[1] == pytest.approx(ratios[2]) and ratios[0] < 0.9 * ratios[1]
    # each side's median pairs rep 1's plain with the stalled run: it would read 10% lower
    unpaired = 46.0 / plain.decode_tokens / (stalled / spec.decode_tokens)
    assert unpaired < 0.9 * spec.speedup


def test_a_paired_speedup_is_not_moved_by_drift_or_by_one_runs_stall() -> None:
    # the machine slows rep by rep (x1, x2, x3, both runs alike); draftless, 2.3x faster,
    # stalls once on its own (+15 in rep 0): each rep's own ratio still reads 2.3 in two of three
    plain, ours = [23.0, 46.0, 69.0], [10.0 + 15.0, 20.0, 30.0]
    assert paired_ratio(plain, 100, ours, 100) == pytest.approx(2.3)  # each side's median:
    # rep 1's plain over rep 0's stalled run, 46 / 25 = 1.84
    assert paired_ratio([1.0, 10.0], 1, [10.0, 1.0], 1) == pytest.approx(1.0)  # in logs
    # per token: rep 0 (2 / 10) / (1 / 5) = 1, rep 1 2; the geometric mean of the two
    assert paired_ratio([2.0, 4.0], 10, [1.0, 1.0], 5) == pytest.approx(2.0**0.5)
    assert paired_ratio([1.0, 1.0], 10, [0.0, 1.0], 10) is None  # a rep with no time
    with pytest.raises(ValueError):
        paired_ratio([1.0, 2.0], 1, [1.0], 1)


def test_lockstep_loads_a_twin_and_says_so(cache: Path) -> None:
    tasks, settings = _one_repetition_prompt(lockstep=True)
    loaded: list[InductionModel] = []

    def load() -> InductionModel:
        loaded.append(InductionModel(vocab=50, seed=0))
        return loaded[-1]

    gc.unfreeze()
    try:
        backend = bench_backend(load, tasks, settings)
        # both copies were left out of the collector's passes before the runs (settle_heap)
        assert gc.get_freeze_count() > 0
        assert not any(o is m for o in gc.get_objects() for m in loaded)
    finally:
        gc.unfreeze()
    assert len(loaded) == 2 and all(m.forward_calls for m in loaded)  # both copies decoded
    (pr,) = backend.tasks[0].prompts
    assert pr.methods[DRAFTLESS].identical is True
    md = report.markdown(build_result("draftless bench --lockstep", settings, [backend], 1.0))
    assert "; lockstep: draftless and its plain a step each in turn" in md


# -- a peer's first-forward accounting, on a tiny transformers model -------------------------------
@pytest.mark.hf
def test_transformers_peers_split_prefill_from_decode() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from test_hf import byte_tokenizer, tiny_model

    from draftless.bench.peers import TransformersGenerate
    from draftless.bench.runner import Job
    from draftless.decoder import generate
    from draftless.models.hf import HFModel

    model = HFModel.from_model(tiny_model("llama", seed=3), byte_tokenizer(), name="llama")
    ids = tuple((list(range(40, 48)) * 3)[:22])
    job = Job("t", "p", ids, (), 0.0, None, 30)
    plain = generate(model, list(ids), 30, stop_ids=sorted(model.eos_token_ids)).token_ids
    for n in (None, 3, 10):
        run = TransformersGenerate(model, n).run(job)
        assert list(run.token_ids) == plain, n  # float64: the peers see our rows
        assert 0 < run.first_seconds <= run.seconds
        assert run.first_tokens + run.decode_tokens == len(run.token_ids)
        assert run.stats is not None and run.stats.committed == len(plain)
        if n is None:  # plain generate: the prompt forward makes exactly one token
            assert run.first_tokens == 1 and run.stats.drafted == 0
        else:  # the prompt forward verifies at most a first draft of n
            assert 1 <= run.first_tokens <= n + 1
            assert run.stats.drafted > 0  # the repetitive prompt gives prompt lookup matches


def test_dtype_reaches_the_transformers_load_only_and_the_report(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--dtype is transformers' (bf16 where the CPU has AVX512_BF16, issue 11): with --backend
    both, llama.cpp loads without it, transformers with it, and its report names it."""
    loads: list[tuple[str, dict[str, object]]] = []

    def load(model: str, backend: str, options: dict[str, object]) -> InductionModel:
        loads.append((backend, dict(options)))
        fake = InductionModel(vocab=50, seed=0)
        if backend == "hf":
            fake.dtype = str(options["dtype"])  # type: ignore[attr-defined]
        return fake

    monkeypatch.setattr("draftless.cli.bench._load", load)
    out = cache / "out"
    args = ["bench", "--backend", "both", "--dtype", "bfloat16", "--tasks", "repetition"]
    args += ["--prompts", "1", "--reps", "1", "-n", "8", "--no-peers", "--out", str(out)]
    assert main(args) == 0
    assert [(b, "dtype" in o) for b, o in loads] == [("llamacpp", False), ("hf", True)]
    assert loads[1][1]["dtype"] == "bfloat16"
    data = json.loads((out / "results.json").read_text())
    assert [b["dtype"] for b in data["backends"]] == [None, "bfloat16"]
    assert "; bfloat16." in (out / "results.md").read_text()


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--dtype", "bfloat16", "--backend", "llamacpp"], "--dtype sets the transformers"),
        (["--dtype", "bfloat16", "--quick"], "--dtype sets the transformers"),
    ],
)
def test_dtype_without_transformers_is_a_one_line_error(
    flags: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err


def test_no_edits_reaches_the_index_the_bench_drafts_from(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`bench --no-edits` runs draftless with the edit learner off (a side-by-side of the
    learner is two bench runs); without it the learner is on."""
    sources: list[object] = []

    def load(model: str, backend: str, options: dict[str, object]) -> InductionModel:
        return InductionModel(vocab=50, seed=0)

    monkeypatch.setattr("draftless.cli.bench._load", load)
    original = bench_backend

    def spy(*args: object, **kw: object) -> object:
        make = kw.get("make_source")
        sources.append(make(InductionModel(vocab=50, seed=0)) if callable(make) else None)
        return original(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr("draftless.cli.bench.bench_backend", spy)
    args = ["bench", "--backend", "llamacpp", "--tasks", "repetition", "--prompts", "1"]
    args += ["--reps", "1", "-n", "8", "--no-peers", "--out", str(cache / "out")]
    assert main([*args, "--no-edits"]) == 0
    assert main(args) == 0
    off, default = sources
    assert off is not None and off.edit_stats() is None  # type: ignore[attr-defined]
    assert default is None  # the runner's own cascade, with the learner
    from draftless.bench.runner import _cascade

    assert _cascade(InductionModel(vocab=50, seed=0)).edit_stats() is not None
