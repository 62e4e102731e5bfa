"""bench/llama_server.py: the llama-server peer's command line, requests, answers and lifecycle.

Most tests drive tests/fake_llama_server.py, a stand-in that speaks llama-server's command line
and HTTP API (no binary needed); the last runs the real binary on SmolLM2 when it is built.
"""

from __future__ import annotations

import itertools
import json
import os
import stat
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from draftless.bench import llama_server as ls
from draftless.bench.runner import Job
from draftless.metrics import DecodeStats

FAKE = Path(__file__).with_name("fake_llama_server.py")


@dataclass
class FakeModel:
    path: Path
    name: str = "fake"
    backend: str = "llamacpp"
    eos_token_ids: tuple[int, ...] = (2,)
    n_ctx: int = 1024
    n_batch: int = 256
    threads: int = 2
    kernels: str = ""
    tokenizer: object = field(default=None)


def _job(ids: tuple[int, ...] = (10, 11, 12, 13, 14), n: int = 4, temp: float = 0.0) -> Job:
    return Job("code-edit", "p1", ids, (), temp, 42 if temp else None, n)


@pytest.fixture
def fake_binary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    wrapper = tmp_path / "llama-server"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("FAKE_LLAMA_SERVER_LOG", str(tmp_path / "fake.log"))
    return wrapper


def _log(tmp_path: Path) -> list[dict[str, object]]:
    path = tmp_path / "fake.log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _pairs(argv: list[str]) -> dict[str, str]:
    return {a: b for a, b in itertools.pairwise(argv) if a.startswith("--")}


def test_server_command_matches_our_context(tmp_path: Path) -> None:
    argv = ls.server_command(
        Path("/bin/llama-server"),
        tmp_path / "m.gguf",
        port=8123,
        threads=3,
        threads_batch=4,
        n_ctx=2048,
        n_batch=512,
        extra=("--spec-type", "ngram-mod"),
    )
    assert argv[0] == "/bin/llama-server"
    opts = _pairs(argv)
    assert opts["--model"] == str(tmp_path / "m.gguf")
    assert opts["--host"] == "127.0.0.1" and opts["--port"] == "8123"
    assert opts["--threads"] == "3" and opts["--threads-batch"] == "4"
    assert opts["--ctx-size"] == "2048" and opts["--parallel"] == "1"
    assert opts["--batch-size"] == opts["--ubatch-size"] == "512"
    assert argv[-2:] == ["--spec-type", "ngram-mod"]


def test_server_flags_exist_in_the_vendored_llama_cpp() -> None:
    """Every option we pass is one llama-server's arg.cpp defines (when the sdist is at hand)."""
    arg_cpp = os.environ.get("DRAFTLESS_LLAMA_ARG_CPP")
    if not arg_cpp or not Path(arg_cpp).is_file():
        pytest.skip("set DRAFTLESS_LLAMA_ARG_CPP to the sdist's vendor/llama.cpp/common/arg.cpp")
    text = Path(arg_cpp).read_text()
    argv = ls.server_command(
        Path("x"), Path("m"), port=1, threads=1, threads_batch=1, n_ctx=1, n_batch=1
    )
    draft = ls.draft_config(Path("d.gguf"), "d", 1, 1).args
    for opt in [a for a in [*argv, *draft] if a.startswith("--")]:
        assert f'"{opt}"' in text, opt
    speculative = Path(arg_cpp).with_name("speculative.cpp").read_text()
    for spec_type in ["ngram-simple", "ngram-map-k", "ngram-mod", "draft-simple"]:
        assert f'{{"{spec_type}",' in speculative, spec_type


def test_completion_body_greedy_and_sampled() -> None:
    greedy = ls.completion_body(_job())
    assert greedy["prompt"] == [10, 11, 12, 13, 14]
    assert greedy["n_predict"] == 4 and greedy["return_tokens"] is True
    assert greedy["cache_prompt"] is False and greedy["stream"] is False
    assert greedy["top_k"] == 1 and greedy["temperature"] == 0.0
    sampled = ls.completion_body(_job(temp=0.7))
    assert sampled["temperature"] == 0.7 and sampled["top_k"] == 0 and sampled["seed"] == 42
    assert sampled["top_p"] == 1.0 and sampled["min_p"] == 0.0 and sampled["repeat_penalty"] == 1


ANSWER = {  # the shape llama-server 0.3.36's /completion returns (fields we do not read cut)
    "index": 0,
    "content": " world",
    "tokens": [1917, 0, 2],
    "id_slot": 0,
    "stop": True,
    "model": "m.gguf",
    "tokens_predicted": 3,
    "tokens_evaluated": 5,
    "stop_type": "eos",
    "timings": {
        "cache_n": 0,
        "prompt_n": 5,
        "prompt_ms": 40.0,
        "prompt_per_token_ms": 8.0,
        "prompt_per_second": 125.0,
        "predicted_n": 3,
        "predicted_ms": 50.0,
        "predicted_per_token_ms": 25.0,
        "predicted_per_second": 40.0,
        "draft_n": 4,
        "draft_n_accepted": 1,
    },
}


def test_parse_and_time_an_answer() -> None:
    done = ls.parse_completion(ANSWER)
    assert done.tokens == (1917, 0, 2)
    assert (done.prompt_n, done.predicted_n, done.draft_n, done.draft_accepted) == (5, 3, 4, 1)
    run = ls.to_run(done, frozenset({2}), limit=10)
    assert run.token_ids == (1917, 0, 2)
    assert run.first_seconds == pytest.approx(0.040)
    assert run.seconds == pytest.approx(0.090)
    # the runner's decode tok/s is the server's own predicted_per_second
    assert run.decode_tokens / run.decode_seconds == pytest.approx(done.predicted_per_second)
    assert run.stats == DecodeStats(steps=2, committed=3, drafted=4, accepted=1)


def test_answer_cut_at_our_stop_and_limit() -> None:
    done = ls.parse_completion({**ANSWER, "tokens": [5, 2, 7, 8]})
    assert ls.to_run(done, frozenset({2}), limit=10).token_ids == (5, 2)
    assert ls.to_run(done, frozenset(), limit=3).token_ids == (5, 2, 7)


@pytest.mark.parametrize(
    "broken",
    [
        {k: v for k, v in ANSWER.items() if k != "tokens"},  # return_tokens ignored
        {k: v for k, v in ANSWER.items() if k != "timings"},
        {**ANSWER, "tokens": ["a", "b"]},
        {**ANSWER, "tokens": [True]},
        {**ANSWER, "timings": {"prompt_n": 5}},
        ["not", "an", "object"],
    ],
)
def test_unreadable_answers_are_server_errors(broken: object) -> None:
    with pytest.raises(ls.ServerError, match=r"unreadable|not a list"):
        ls.parse_completion(broken)


def test_peers_drive_the_fake_server_end_to_end(fake_binary: Path, tmp_path: Path) -> None:
    model = FakeModel(tmp_path / "target.gguf")
    draft = tmp_path / "draft.gguf"
    peers, notes = ls.llama_server_peers(model, binary=fake_binary, draft=draft)  # type: ignore[arg-type]
    names = [p.name for p in peers]
    assert names == [
        "lsrv-plain",
        "lsrv-ngram-simple",
        "lsrv-ngram-map-k",
        "lsrv-ngram-mod",
        "lsrv-draft",
    ]
    assert [p.baseline for p in peers] == [None] + ["lsrv-plain"] * 4
    assert not any(p.exact for p in peers)
    try:
        job = _job()
        runs = {p.name: [p.run(job), p.run(job)] for p in peers}
        log = _log(tmp_path)
        starts = [r for r in log if "argv" in r]
        bodies = [r for r in log if "body" in r]
        assert len(bodies) == 10
        assert all(b["body"]["prompt"] == [10, 11, 12, 13, 14] for b in bodies)
        # stateless configurations keep their server; stateful ones restart before a rerun
        per_config = {}
        for s in starts:
            argv = s["argv"]
            kind = argv[argv.index("--spec-type") + 1] if "--spec-type" in argv else "plain"
            per_config[kind] = per_config.get(kind, 0) + 1
            assert _pairs(argv)["--threads"] == "2" and _pairs(argv)["--ctx-size"] == "1024"
            assert _pairs(argv)["--batch-size"] == "512"  # the backend batch
        assert per_config == {
            "plain": 1,
            "ngram-simple": 1,
            "ngram-map-k": 2,
            "ngram-mod": 2,
            "draft-simple": 2,
        }
        draft_argv = next(s["argv"] for s in starts if "draft-simple" in s["argv"])
        assert _pairs(draft_argv)["--spec-draft-model"] == str(draft)
        assert _pairs(draft_argv)["--spec-draft-threads"] == "2"
        # tokens come back cut at n_predict, timed by the server's clock
        plain = runs["lsrv-plain"][0]
        assert plain.token_ids == (11, 12, 13, 14)
        assert plain.decode_tokens / plain.decode_seconds == pytest.approx(10.0)
        assert runs["lsrv-ngram-simple"][0].stats is not None
        assert runs["lsrv-ngram-simple"][0].stats.drafted == 6
        # ngram-mod answers differently in the fake: noted against llama-server plain only
        assert runs["lsrv-ngram-mod"][0].token_ids == (12, 13, 14, 15)
        assert notes == [
            "lsrv-ngram-mod: differs from llama-server plain on code-edit/p1 at token 0"
        ]
        # between requests every server is stopped, taking no CPU from the method being timed
        for p in peers:
            assert p.server.proc is not None
            assert _state_soon(p.server.proc.pid, "T") == "T", p.name
    finally:
        procs = [p.server.proc for p in peers]
        peers[0].group.close()
    assert all(p.server.proc is None for p in peers)
    assert all(proc is None or proc.poll() is not None for proc in procs)


def _state_soon(pid: int, want: str, wait: float = 5.0) -> str:
    """The process state letter from /proc, polled until it is `want` (signals are async)."""
    deadline = time.monotonic() + wait
    while True:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state == want or time.monotonic() > deadline:
            return state
        time.sleep(0.02)


def test_own_plain_comparison_waits_for_plain(fake_binary: Path, tmp_path: Path) -> None:
    peers, notes = ls.llama_server_peers(FakeModel(tmp_path / "t.gguf"), binary=fake_binary)  # type: ignore[arg-type]
    by = {p.name: p for p in peers}
    try:
        by["lsrv-ngram-mod"].run(_job())  # before plain: nothing to compare with yet
        assert notes == []
        by["lsrv-plain"].run(_job())
        assert len(notes) == 1 and "at token 0" in notes[0]
        by["lsrv-ngram-simple"].run(_job(n=2))  # another job key: compared with nothing
        assert len(notes) == 1
    finally:
        peers[0].group.close()


def test_stop_token_ends_the_run(
    fake_binary: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_LLAMA_SERVER_MODE", "eos")
    peers, _ = ls.llama_server_peers(FakeModel(tmp_path / "t.gguf"), binary=fake_binary)  # type: ignore[arg-type]
    try:
        assert peers[0].run(_job()).token_ids == (7, 2)
    finally:
        peers[0].group.close()


def test_a_server_that_dies_is_reported_with_its_log(
    fake_binary: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_LLAMA_SERVER_MODE", "die")
    peers, _ = ls.llama_server_peers(FakeModel(tmp_path / "t.gguf"), binary=fake_binary)  # type: ignore[arg-type]
    with pytest.raises(ls.ServerError, match=r"exited with status 3: .*failed to load model"):
        peers[0].run(_job())
    assert peers[0].server.proc is None


def test_non_json_answer_is_a_server_error(
    fake_binary: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_LLAMA_SERVER_MODE", "garbage")
    peers, _ = ls.llama_server_peers(FakeModel(tmp_path / "t.gguf"), binary=fake_binary)  # type: ignore[arg-type]
    try:
        with pytest.raises(ls.ServerError, match="non-JSON"):
            peers[0].run(_job())
    finally:
        peers[0].group.close()


def test_no_binary_is_a_note_not_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRAFTLESS_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.delenv(ls.BINARY_ENV, raising=False)
    assert ls.find_binary() is None
    peers, notes = ls.llama_server_peers(FakeModel(tmp_path / "t.gguf"))  # type: ignore[arg-type]
    assert peers == [] and len(notes) == 1 and "build-llama-server.sh" in notes[0]
    monkeypatch.setenv(ls.BINARY_ENV, str(tmp_path / "missing"))
    assert ls.find_binary() is None


def test_find_binary_prefers_the_env_then_the_newest_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRAFTLESS_CACHE", str(tmp_path))
    monkeypatch.delenv(ls.BINARY_ENV, raising=False)
    paths = []
    for i, key in enumerate(["aaa", "bbb"]):
        p = tmp_path / f"llama-server-{key}" / "llama-server"
        p.parent.mkdir()
        p.write_text("#!/bin/sh\n")
        p.chmod(0o755)
        os.utime(p, (1000 + i, 1000 + (1 - i) * 10))  # aaa is newer
        paths.append(p)
    assert ls.find_binary() == paths[0]
    monkeypatch.setenv(ls.BINARY_ENV, str(paths[1]))
    assert ls.find_binary() == paths[1]


def test_draft_peer_only_for_a_known_pair_when_cached(
    fake_binary: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DRAFTLESS_CACHE", str(tmp_path / "cache"))
    target = FakeModel(tmp_path / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    peers, notes = ls.llama_server_peers(target, binary=fake_binary)  # type: ignore[arg-type]
    assert "lsrv-draft" not in [p.name for p in peers]
    assert notes == [
        "llama-server draft peer skipped: qwen2.5-coder-0.5b is not cached "
        "(draftless pull qwen2.5-coder-0.5b)"
    ]
    other, notes = ls.llama_server_peers(FakeModel(tmp_path / "x.gguf"), binary=fake_binary)  # type: ignore[arg-type]
    assert "lsrv-draft" not in [p.name for p in other] and notes == []


@pytest.mark.slow
@pytest.mark.llamacpp
def test_real_llama_server_on_smollm2() -> None:
    binary = ls.find_binary()
    if binary is None:
        pytest.skip(f"no llama-server binary; {ls.BUILD_HINT}")
    pytest.importorskip("llama_cpp")
    import numpy as np

    from draftless.models.registry import load_model

    model = load_model("smollm2", n_threads=1)
    try:
        ids = tuple(
            model.tokenizer.apply_chat_template([{"role": "user", "content": "Count: 1 2 3 4"}])
        )
        model.prefill(list(ids[:-1]))
        first = int(np.argmax(model.forward([ids[-1]])[-1]))
        peers, notes = ls.llama_server_peers(model, configs=ls.CONFIGS[:2])
        assert [p.name for p in peers] == ["lsrv-plain", "lsrv-ngram-simple"]
        try:
            job = Job("t", "p", ids, (), 0.0, None, 24)
            plain = peers[0].run(job)
            spec = peers[1].run(job)
            done = peers[0].server.complete(ls.completion_body(job))
        finally:
            peers[0].group.close()
        assert done.prompt_n == len(ids)  # the token ids went in as they are
        assert done.predicted_per_second > 0 and plain.decode_seconds > 0
        assert plain.token_ids[0] == first  # the prompt's argmax, as our model computes it
        assert all(0 <= t < model.vocab_size for t in plain.token_ids)
        assert spec.token_ids == plain.token_ids and notes == []
    finally:
        model.close()
