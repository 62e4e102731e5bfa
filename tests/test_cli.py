"""User mistakes on the command line: one line on stderr, exit status 2, no traceback,
and no output file left behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


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
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    assert_user_error(run("generate", "--prompt-file", str(empty)), "empty")
