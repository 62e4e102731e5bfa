"""User mistakes on the command line: one line on stderr, exit status 2, no traceback,
and no output file left behind."""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from draftless.cli import common
from draftless.costs import PROBE_KS

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, stdin: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    return subprocess.run(
        [sys.executable, "-m", "draftless", *args],
        input=stdin,
        text=True,
        capture_output=True,
        env=env,
        timeout=timeout,
        cwd=ROOT,
    )


def assert_user_error(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("draftless: error: ")
    for fragment in fragments:
        assert fragment in lines[0]
    assert proc.stdout == ""


def test_missing_model_file(tmp_path: Path) -> None:
    assert_user_error(
        run("generate", "--model", str(tmp_path / "nope.gguf"), "-p", "hi"), "not found"
    )


def test_file_that_is_not_gguf(tmp_path: Path) -> None:
    bogus = tmp_path / "model.gguf"
    bogus.write_bytes(b"PK\x03\x04 this is a zip, not a model")
    assert_user_error(run("generate", "--model", str(bogus), "-p", "hi"), "not a GGUF")


def test_unknown_model_name() -> None:
    assert_user_error(
        run("generate", "--model", "llama-9000", "-p", "hi"), "unknown model", "smollm2"
    )


def test_unknown_backend_is_refused_by_the_parser() -> None:
    proc = run("generate", "--backend", "onnx", "-p", "hi")
    assert (
        proc.returncode == 2 and "Traceback" not in proc.stderr and "invalid choice" in proc.stderr
    )


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--top-k", "-1"], "top_k"),
        (["--top-p", "0"], "top_p"),
        (["--top-p", "1.5"], "top_p"),
        (["--min-p", "-0.5"], "min_p"),
        (["--repeat-penalty", "0"], "repeat_penalty"),
        (["--temperature", "nan"], "temperature"),
        (["--penalty-last-n", "-7"], "penalty_last_n"),
        (["--seed", "-1"], "seed"),
        (["--max-new-tokens", "0"], "max-new-tokens"),
        (["--spec", "--max-draft", "0"], "max_draft"),
        (["--stop", ""], "--stop needs non-empty text"),
        (["--no-edits"], "--no-edits needs --spec"),
        (["--logprobs", "2"], "--logprobs needs --json"),
        (["--json", "--logprobs", "21"], "--logprobs needs --json and a count in [0, 20]"),
    ],
)
def test_invalid_options(flags: list[str], fragment: str) -> None:
    assert_user_error(run("generate", "--model", "llama-9000", "-p", "hi", *flags), fragment)


def test_prompt_and_prompt_file_are_exclusive(tmp_path: Path) -> None:
    f = tmp_path / "p.txt"
    f.write_text("hello")
    assert_user_error(run("generate", "-p", "hi", "--prompt-file", str(f)), "exactly one")
    assert_user_error(run("generate"), "exactly one")


def test_missing_and_binary_prompt_files(tmp_path: Path) -> None:
    assert_user_error(run("generate", "--prompt-file", str(tmp_path / "none.txt")), "not found")
    binary = tmp_path / "b.bin"
    binary.write_bytes(b"\x00\x01\x02binary")
    assert_user_error(run("generate", "--prompt-file", str(binary)), "binary")


def test_too_many_references(tmp_path: Path) -> None:
    refs = []
    for i in range(9):
        f = tmp_path / f"r{i}.txt"
        f.write_text("text")
        refs += ["--spec-ref", str(f)]
    assert_user_error(run("generate", "-p", "hi", "--spec", *refs), "at most 8")


def test_reference_needs_spec(tmp_path: Path) -> None:
    f = tmp_path / "r.txt"
    f.write_text("text")
    assert_user_error(run("generate", "-p", "hi", "--spec-ref", str(f)), "--spec")


def test_empty_prompt(tmp_path: Path) -> None:
    assert_user_error(run("generate", "-p", "   "), "empty")
    assert_user_error(run("generate", "--prompt-file", "-", stdin=" \n"), "empty")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    assert_user_error(run("generate", "--prompt-file", str(empty)), "empty")


def test_unsupported_non_rewindable_model(tmp_path: Path) -> None:
    """A recurrent model's state cannot be cut back: refused at load, one line."""
    transformers = pytest.importorskip("transformers")
    config = transformers.MambaConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1)
    config.save_pretrained(tmp_path / "mamba")
    proc = run("generate", "--model", str(tmp_path / "mamba"), "--backend", "hf", "-p", "hi")
    assert_user_error(proc, "mamba")


SMOLLM2 = pytest.mark.skipif(
    not __import__("draftless.models.registry", fromlist=["x"]).llamacpp_available(),
    reason="needs llama_cpp",
)


@pytest.mark.slow
@SMOLLM2
def test_generate_json_reports_text_and_speculation_stats(tmp_path: Path) -> None:
    import json

    ref = tmp_path / "ref.txt"
    ref.write_text("The quick brown fox jumps over the lazy dog. " * 4)
    proc = run(
        "generate",
        "--json",
        "--spec",
        "--spec-ref",
        str(ref),
        "-n",
        "24",
        "--prompt",
        "Copy this: The quick brown fox jumps over the lazy dog. The quick brown fox",
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    for key in ("text", "token_ids", "prompt_tokens", "new_tokens", "seconds", "tokens_per_second"):
        assert key in out
    assert out["new_tokens"] == len(out["token_ids"]) <= 24
    spec = out["spec"]
    for key in (
        "steps",
        "committed",
        "tokens_per_step",
        "drafted",
        "accepted",
        "acceptance",
        "gate_off",
        "gate_on",
        "members",
    ):
        assert key in spec
    assert spec["committed"] == out["new_tokens"]
    members = spec["members"]
    assert set(members) <= {"conversation", "reference[0]", "recycling"}
    assert sum(m["drafted"] for m in members.values()) == spec["drafted"]
    assert sum(m["accepted"] for m in members.values()) == spec["accepted"]
    # per gate (member/bucket), the draft-length histogram and the verify share (issue 12)
    gates = spec["evidence"]
    assert all(name.split("/")[0] in members for name in gates)
    assert sum(g["drafted"] for g in gates.values()) == spec["drafted"]
    lengths = spec["draft_lengths"]
    assert sum(int(k) * v for k, v in lengths.items()) == spec["drafted"]
    assert sum(lengths.values()) == spec["verify_steps"]
    assert spec["verify_share"] == round(spec["verify_steps"] / spec["steps"], 4)
    assert isinstance(spec["resync_gaps"], dict)
    assert set(spec["edits"]) == {"learned", "in_use", "held", "broken"}


@pytest.mark.slow
@SMOLLM2
def test_no_edits_writes_what_plain_writes_and_reports_no_learner() -> None:
    import json

    code = "def area(w, h):\n    return w * h\n\n\nprint(area(2, 3), area(4, 5))\n"
    prompt = f"Rewrite this code with `area` renamed to `surface`:\n{code}"
    args = ["generate", "--json", "--chat", "-n", "48", "--prompt", prompt]
    plain = json.loads(run(*args).stdout)
    runs = {
        flag: json.loads(run(*args, "--spec", "--no-gate", *flag).stdout)
        for flag in ((), ("--no-edits",))
    }
    for out in runs.values():
        assert out["token_ids"] == plain["token_ids"]
        assert out["spec"]["drafted"] > 0
    assert runs[("--no-edits",)]["spec"]["edits"] is None
    assert set(runs[()]["spec"]["edits"]) == {"learned", "in_use", "held", "broken"}
    text = run(*[a for a in args if a != "--json"], "--spec")
    assert text.returncode == 0 and "\nedits: learned " in text.stderr, text.stderr
    text = run(*[a for a in args if a != "--json"], "--spec", "--no-edits")
    assert text.returncode == 0 and "spec: steps=" in text.stderr
    assert "edits:" not in text.stderr


@pytest.mark.slow
@SMOLLM2
def test_logprobs_are_the_same_with_spec_and_name_each_new_token() -> None:
    import json

    prompt = "Repeat exactly: Tea is grown on hills. It is picked by hand. It is dried in sun."
    args = ["generate", "--json", "--chat", "-n", "30", "--logprobs", "2", "--prompt", prompt]
    plain = json.loads(run(*args).stdout)
    spec = json.loads(run(*args, "--spec", "--no-gate").stdout)
    assert spec["spec"]["accepted"] > 0
    assert spec["logprobs"] == plain["logprobs"]
    assert [e["token_id"] for e in plain["logprobs"]] == plain["token_ids"]
    for e in plain["logprobs"]:
        assert e["logprob"] <= 0 and len(e["top"]) == 2
        assert e["top"][0][0] == e["token_id"] and e["top"][0][2] == e["logprob"]  # greedy


def test_a_text_stop_ends_speculative_output_where_plain_ends() -> None:
    import json

    prompt = "Repeat exactly: Tea is grown on hills. It is picked by hand. It is dried in sun."
    args = ["generate", "--json", "--chat", "-n", "40", "--prompt", prompt]
    full = json.loads(run(*args).stdout)
    assert len(full["text"]) > 30, full
    stop = full["text"][20:23]
    cut = full["text"].index(stop)
    outs = [
        json.loads(run(*args, *extra, "--stop", stop).stdout)
        for extra in ([], ["--spec", "--no-gate"])
    ]
    for out in outs:
        assert out["stop_reason"] == "stop_sequence" and out["text"] == full["text"][:cut]
        assert out["token_ids"] == outs[0]["token_ids"]
        assert out["token_ids"] == full["token_ids"][: len(out["token_ids"])]
    assert outs[1]["spec"]["accepted"] > 0


@pytest.mark.slow
@SMOLLM2
def test_a_stop_id_outside_the_vocabulary_is_refused() -> None:
    assert_user_error(run("generate", "-p", "hi", "--stop-id", "49152"), "--stop-id 49152")


@pytest.mark.slow
@SMOLLM2
def test_plain_generate_streams_text_and_a_speed_line() -> None:
    proc = run("generate", "-n", "8", "--prompt", "Once upon a time")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()
    assert "tok/s" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
@SMOLLM2
def test_probe_prints_the_table_without_storing(tmp_path: Path) -> None:
    env_cache = tmp_path / "cache"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "draftless",
            "probe",
            "--reps",
            "1",
            "--context",
            "32",
            "--no-store",
        ],
        text=True,
        capture_output=True,
        timeout=300,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT / "src"), DRAFTLESS_CACHE=str(env_cache)),
    )
    assert proc.returncode == 0, proc.stderr
    rows = [line.split("\t") for line in proc.stdout.splitlines() if line[:1].isdigit()]
    assert [int(r[0]) for r in rows] == list(PROBE_KS)  # every width to 32, then sparser
    assert float(rows[0][1]) == 1.0 and all(float(r[1]) >= 1.0 for r in rows)
    assert not (env_cache / "costs").exists()


# -- hardening: what a hostile new user found ------------------------------------------------


def test_a_prompt_argument_that_is_not_utf8_is_a_one_line_error() -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run(
        [sys.executable, "-m", "draftless", "generate", "-p", b"Hello \xff world", "-n", "4"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert_user_error(proc, "--prompt is not UTF-8", "0xff")


def test_a_prompt_file_that_is_a_directory(tmp_path: Path) -> None:
    assert_user_error(run("generate", "--prompt-file", str(tmp_path), "-n", "4"), "is a directory")


def _feed_fifo(path: Path, data: bytes) -> threading.Thread:
    """A named pipe at `path` that a thread writes `data` into once a reader opens it."""
    os.mkfifo(path)

    def write() -> None:
        with contextlib.suppress(BrokenPipeError), path.open("wb") as f:
            f.write(data)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    return writer


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes on this platform")
def test_a_prompt_file_that_is_a_pipe_is_read_not_called_missing(tmp_path: Path) -> None:
    """`--prompt-file <(...)` hands over a pipe, not a regular file: it is read (here it holds
    only blanks, so the error is the empty prompt's, before any model loads), as is /dev/null."""
    pipe = tmp_path / "prompt"
    writer = _feed_fifo(pipe, b"  \n")
    assert_user_error(run("generate", "--prompt-file", str(pipe), "-n", "4"), "the prompt is empty")
    writer.join(timeout=10)
    assert not writer.is_alive()
    empty = run("generate", "--prompt-file", os.devnull, "-n", "4")
    assert_user_error(empty, "the prompt is empty")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes on this platform")
def test_a_reference_on_a_pipe_is_held_to_the_size_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pipe has no size to check first: the reference limit holds on what is read."""
    monkeypatch.setattr(common, "MAX_REFERENCE_BYTES", 16)
    fits, over = tmp_path / "fits", tmp_path / "over"
    _feed_fifo(fits, b"x" * 16)
    assert common.read_text_file(str(fits), "reference") == "x" * 16
    _feed_fifo(over, b"x" * 17)
    with pytest.raises(common.UsageError, match="more than 16 bytes; the limit is 16"):
        common.read_text_file(str(over), "reference")
    regular = tmp_path / "regular.txt"
    regular.write_bytes(b"y" * 17)
    with pytest.raises(common.UsageError, match="is 17 bytes; the limit is 16"):
        common.read_text_file(str(regular), "reference")


@pytest.mark.slow
@SMOLLM2
def test_a_prompt_longer_than_the_context_says_so_in_words(tmp_path: Path) -> None:
    prompt = tmp_path / "long.txt"
    prompt.write_text("word " * 400)
    proc = run("generate", "--prompt-file", str(prompt), "--n-ctx", "256", "-n", "4")
    assert_user_error(proc, "the prompt is 40", "tokens; the context holds 256")


@pytest.mark.slow
@SMOLLM2
@pytest.mark.parametrize("spec", [False, True], ids=["plain", "spec"])
def test_a_full_context_ends_the_output_with_stop_reason_context(spec: bool) -> None:
    """Reaching the context's end is not a user error: everything generated is printed, with
    a note; speculation (drafts as long as allowed, no gate) ends exactly where plain ends."""
    import json

    args = ["generate", "-p", "Count: 1, 2, 3,", "-n", "1000000", "--n-ctx", "256", "--json"]
    plain = run(*args)
    assert plain.returncode == 0, plain.stderr
    out = json.loads(plain.stdout)
    assert out["stop_reason"] == "context" and out["n_ctx"] == 256
    assert out["prompt_tokens"] + out["new_tokens"] == 256 + 1  # the last one is never cached
    assert "context (256 tokens) is full" in plain.stderr and "Traceback" not in plain.stderr
    if spec:
        fast = run(*args, "--spec", "--no-gate", "--max-draft", "100000")
        assert fast.returncode == 0, fast.stderr
        got = json.loads(fast.stdout)
        assert got["token_ids"] == out["token_ids"] and got["stop_reason"] == "context"
        assert got["spec"]["drafted"] > 0
    text = run(*args[:-1])  # text mode: the output, then the note
    assert text.returncode == 0 and text.stdout.strip() and "is full" in text.stderr


# -- a fuzz test of the options ---------------------------------------------------------------


def argv_text(max_size: int) -> st.SearchStrategy[str]:
    """Any text a command line can carry: all but NUL and lone surrogates (no argv holds them)."""
    return st.text(
        st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=max_size
    )


FLOATS = st.one_of(
    st.sampled_from(["0", "1", "-1", "0.5", "1.5", "nan", "inf", "-inf", "1e308", "2"]),
    st.floats(allow_nan=False, allow_infinity=False, width=32).map(repr),
)
INTS = st.one_of(
    st.sampled_from(["0", "1", "-1", "2", "7", "64", "999", "100000", str(2**70)]),
    st.integers(-5, 300).map(str),
)
OPTIONS = {
    "--temperature": FLOATS,
    "--top-k": INTS,
    "--top-p": FLOATS,
    "--min-p": FLOATS,
    "--repeat-penalty": FLOATS,
    "--frequency-penalty": FLOATS,
    "--presence-penalty": FLOATS,
    "--penalty-last-n": INTS,
    "--seed": INTS,
    "--max-draft": INTS,
    "--n-ctx": st.sampled_from(["0", "1", "8", "64", "256", "-3"]),
    "--threads": st.sampled_from(["0", "1", "2", "-1", "999"]),
    "--stop": st.text(st.sampled_from("ab \n.,\\<|>"), max_size=4),
    "--stop-id": INTS,
    "--max-new-tokens": st.sampled_from(["0", "1", "3", "12", "-2"]),
    "--system": argv_text(max_size=8),
}
FLAGS = ("--spec", "--no-gate", "--chat", "--json")
PROMPTS = st.one_of(
    st.sampled_from(["Count: 1, 2, 3,", "", "   ", "<|im_start|>user", "a" * 600]),
    argv_text(max_size=40),
)


@st.composite
def command_lines(draw: st.DrawFn) -> list[str]:
    names = draw(st.lists(st.sampled_from(sorted(OPTIONS)), max_size=5, unique=True))
    args = [f"{name}={draw(OPTIONS[name])}" for name in names]
    args += draw(st.lists(st.sampled_from(FLAGS), max_size=4, unique=True))
    args.append(f"--prompt={draw(PROMPTS)}")
    if not any(a.startswith("--max-new-tokens") for a in args):
        args.append("--max-new-tokens=6")
    return draw(st.permutations(args))


@pytest.mark.slow
@SMOLLM2
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(command_lines())
def test_any_options_exit_0_with_output_or_2_with_one_line(args: list[str]) -> None:
    """Hypothesis over the option space of `generate`, short runs on SmolLM2: never a
    traceback, never a signal; a run either succeeds with output or is one line of error."""
    proc = run("generate", *args, timeout=300)
    assert proc.returncode in (0, 2), (args, proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, (args, proc.stderr[-2000:])
    if proc.returncode == 2:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("draftless: error: "), (args, lines)
        assert proc.stdout == ""
    elif "--json" in args:
        import json

        out = json.loads(proc.stdout)
        assert out["new_tokens"] == len(out["token_ids"]) >= 1
    else:  # the text (maybe only whitespace), then the speed line
        assert proc.stdout.endswith("\n") and "tokens in" in proc.stderr


def test_an_unknown_dtype_is_refused_by_the_parser() -> None:
    proc = run("generate", "--dtype", "int8", "-p", "hi")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "invalid choice: 'int8'" in proc.stderr


@SMOLLM2
def test_a_dtype_for_llama_cpp_is_a_one_line_error() -> None:
    """llama.cpp computes in the GGUF's own types: --dtype there says so, it does not vanish."""
    proc = run("generate", "--backend", "llamacpp", "--dtype", "bfloat16", "-p", "hi")
    assert_user_error(proc, "dtype is a transformers option", "hf backend")


def tiny_llama_dir(tmp_path: Path, *, vocab: int) -> Path:
    """A one-layer random Llama with `vocab` rows and the tests' byte tokenizer (ids 0-259)."""
    transformers = pytest.importorskip("transformers")
    sys.path.insert(0, str(ROOT / "tests" / "models"))
    import torch
    from test_hf import byte_tokenizer

    torch.manual_seed(0)  # the same weights every run (a random draw could favour EOS)
    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
    )  # fmt: skip
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "tiny")
    byte_tokenizer().save_pretrained(tmp_path / "tiny")
    return tmp_path / "tiny"


@pytest.mark.parametrize("dtype", ["bfloat16", "float64"])
def test_dtype_reaches_the_transformers_model(tmp_path: Path, dtype: str) -> None:
    """`generate --backend hf --dtype X` computes in X (issue 11: bf16 where the CPU has
    AVX512_BF16), greedy and speculative alike, and says so in --json."""
    import json

    tiny = tiny_llama_dir(tmp_path, vocab=260)
    outputs = []
    for spec in ([], ["--spec"]):
        args = ["--backend", "hf", "--model", str(tiny), "--dtype", dtype]
        proc = run("generate", *args, *spec, "--json", "-n", "12", "-p", "abcabcabcabc")
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        assert (out["backend"], out["dtype"]) == ("hf", dtype)
        outputs.append(out["token_ids"])
    assert len(outputs[0]) == 12
    if dtype == "float64":  # exact rows: the speculative stream is plain's
        assert outputs[1] == outputs[0]


def test_a_tokenizer_past_its_models_vocabulary_is_a_one_line_error(tmp_path: Path) -> None:
    """A model directory whose tokenizer emits ids its weights have no row for (here the
    BOS, 256, of a 256-row model) is a user's mismatched pair: one line, not a traceback."""
    tiny = tiny_llama_dir(tmp_path, vocab=256)
    proc = run("generate", "--backend", "hf", "--model", str(tiny), "-p", "hi")
    assert_user_error(proc, "token id 256", "does not match its weights")


RECORD_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "year": {"type": "integer"}},
    "required": ["city", "year"],
    "additionalProperties": False,
}


@pytest.mark.slow
@SMOLLM2
def test_a_json_schema_holds_the_output_with_spec_and_without(tmp_path: Path) -> None:
    import json

    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(RECORD_SCHEMA))
    prompt = "The record: city Lyon, year 1998. Write it as JSON with keys city and year."
    args = ["generate", "--json", "--chat", "-n", "60", "--prompt", prompt]
    free = json.loads(run(*args).stdout)
    held = [
        json.loads(run(*args, "--json-schema", str(schema), *flag).stdout)
        for flag in ((), ("--spec", "--no-gate"))
    ]
    assert held[0]["token_ids"] == held[1]["token_ids"]
    assert held[0]["stop_reason"] == "stop"
    value = json.loads(held[0]["text"])
    assert set(value) == {"city", "year"} and isinstance(value["year"], int)
    assert free["text"] != held[0]["text"]
    grammar = tmp_path / "yn.gbnf"
    grammar.write_text('root ::= "yes" | "no"')
    answer = json.loads(run(*args, "--grammar", str(grammar), "--spec").stdout)
    assert answer["text"] in ("yes", "no")


@pytest.mark.parametrize(
    ("content", "flag", "fragment"),
    [
        ("{oops", "--json-schema", "not JSON"),
        ('{"type": "nope"}', "--json-schema", "bad JSON schema"),
        ('{"type": "string", "pattern": "("}', "--json-schema", "unclosed group"),
        ("root ::= missing_rule", "--grammar", "grammar"),
        (None, "--json-schema", "not found"),
    ],
)
def test_a_schema_or_grammar_that_cannot_be_used_is_one_clear_line(
    tmp_path: Path, content: str | None, flag: str, fragment: str
) -> None:
    path = tmp_path / "held.txt"
    if content is not None:
        path.write_text(content)
    proc = run("generate", "-n", "4", "--prompt", "hi", flag, str(path))
    assert_user_error(proc, fragment)


def test_only_one_of_schema_object_and_grammar(tmp_path: Path) -> None:
    proc = run("generate", "--prompt", "hi", "--json-object", "--grammar", "g")
    assert proc.returncode == 2 and "not allowed with" in proc.stderr


def test_a_loaded_model_is_left_out_of_the_collectors_passes(monkeypatch) -> None:
    """Every command loads through load_with_notes, which then freezes what is alive
    (settle_heap): a full collection visits only what was made since, not the model and
    every module (~70 ms a pass with SmolLM2 on llama.cpp, at a random decode step)."""
    model = {"weights": [[1.0, 2.0]]}  # a container the collector tracks
    monkeypatch.setattr(common, "load_model", lambda *a, **k: model)
    args = argparse.Namespace(
        model="smollm2", backend="llamacpp", device=None, dtype=None, n_ctx=None, threads=None
    )
    gc.unfreeze()
    try:
        assert any(o is model for o in gc.get_objects())
        loaded, notes = common.load_with_notes(args, quiet=True)
        assert loaded is model and notes == []
        assert gc.get_freeze_count() > 0
        assert not any(o is model for o in gc.get_objects())  # frozen: in no generation
    finally:
        gc.unfreeze()
