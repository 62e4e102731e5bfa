"""`draftless tokenize`: ids one per line, bad files, and the `--compare` parity oracle."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_repl import smollm2_problem

from draftless.cli import main
from draftless.cli.tokenize import compare
from test_chat import PIECES, ChatTokenizer

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = (
    "Hello world! Grüße, 東京 — naïve café.\n\n"
    "def f(x):\n\treturn x ** 2  # squared\n"
    "    indented   spaces\r\nand a URL: https://example.com/a?b=1&c=2\n"
    "<|im_start|>user\nspecial tokens are parsed<|im_end|>\n"
)


class NoMergeTokenizer(ChatTokenizer):
    """ChatTokenizer without the "ll" piece: it spells "hello" he|l|l|o."""

    def encode(self, text: str, *, add_special: bool = False) -> list[int]:
        out: list[int] = []
        for t in super().encode(text):
            out += [PIECES.index("l")] * 2 if PIECES[t] == "ll" else [t]
        return out


def test_compare_reports_identical_tokenizers() -> None:
    result = compare("hello world", ChatTokenizer(), ChatTokenizer())
    assert result.identical and result.report == f"identical: {len(result.left)} tokens"


def test_compare_reports_the_first_mismatch_with_both_ids_and_the_text_around_it() -> None:
    text = "oh, hello there. well."
    result = compare(text, ChatTokenizer(), NoMergeTokenizer(), names=("left", "right"))
    assert not result.identical
    assert result.position == 5  # o h , ' ' he | ll vs l
    assert result.left[5] == PIECES.index("ll") and result.right[5] == PIECES.index("l")
    lines = result.report.splitlines()
    assert lines[0] == (
        f"mismatch at token 5: left has {len(result.left)} tokens, right has {len(result.right)}"
    )
    assert f"id {PIECES.index('ll')} 'll'" in lines[1] and "'he' |" in lines[1]
    assert f"id {PIECES.index('l')} 'l'" in lines[2]
    assert lines[3] == "  text at character 6: 'oh, he' | 'llo there. well.'"


def test_compare_when_one_side_is_a_prefix_of_the_other() -> None:
    class Shorter(ChatTokenizer):
        def encode(self, text: str, *, add_special: bool = False) -> list[int]:
            return super().encode(text)[:-1]

    result = compare("abc", ChatTokenizer(), Shorter())
    assert result.position == 2 and "(no more tokens)" in result.report


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["tokenize", *args])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code: int, out: str, err: str, fragment: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and out == "" and len(lines) == 1, err
    assert lines[0].startswith("draftless: error: ") and fragment in lines[0]


def test_bad_files_and_models_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    binary = tmp_path / "blob.bin"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00\x00\x00")
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("café".encode("latin-1"))
    text = tmp_path / "ok.txt"
    text.write_text("hello")
    assert_one_line_error(*cli(capsys, str(tmp_path / "missing.txt")), "not found")
    assert_one_line_error(*cli(capsys, str(binary)), "binary")
    assert_one_line_error(*cli(capsys, str(latin1)), "not UTF-8")
    assert_one_line_error(*cli(capsys, "--model", "llama-9000", str(text)), "unknown model")
    hf_dir = tmp_path / "hf-model"
    hf_dir.mkdir()
    (hf_dir / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert_one_line_error(
        *cli(capsys, "--model", str(hf_dir), "--compare", str(text)), "needs a GGUF"
    )


# -- slow: SmolLM2 ---------------------------------------------------------------------------
@pytest.fixture
def smollm2() -> None:
    problem = smollm2_problem()
    if problem:
        pytest.skip(problem)


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    return subprocess.run(
        [sys.executable, "-m", "draftless", "tokenize", *args],
        input=stdin,
        text=True,
        capture_output=True,
        env=env,
        timeout=300,
        cwd=ROOT,
    )


@pytest.mark.slow
@pytest.mark.llamacpp
def test_smollm2_ids_one_per_line(smollm2, tmp_path: Path) -> None:
    doc = tmp_path / "doc.txt"
    doc.write_text("Hello world!")
    proc = run("--model", "smollm2", "--backend", "llamacpp", str(doc))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "19556\n905\n17\n"  # SmolLM2's vocabulary, no BOS
    assert proc.stderr == ""  # no spinner on a pipe
    with_bos = run(
        "--model", "smollm2", "--backend", "llamacpp", "--add-special", "-", stdin="Hello world!"
    )
    assert with_bos.returncode == 0 and with_bos.stdout.splitlines()[-3:] == ["19556", "905", "17"]


@pytest.mark.slow
@pytest.mark.llamacpp
@pytest.mark.hf
def test_smollm2_compare_transformers_with_llamacpp(smollm2, tmp_path: Path) -> None:
    doc = tmp_path / "fixture.txt"
    doc.write_bytes(FIXTURE.encode())
    proc = run("--model", "smollm2", "--compare", str(doc))
    assert "Traceback" not in proc.stderr
    lines = proc.stdout.splitlines()
    if proc.returncode == 0:
        n = len(run("--model", "smollm2", "--backend", "llamacpp", str(doc)).stdout.split())
        assert lines == [f"identical: {n} tokens"]
    else:  # a parity bug in one of them: it must be reported precisely
        assert proc.returncode == 1, proc.stderr
        assert lines[0].startswith("mismatch at token ")
        assert "llama.cpp" in lines[1] and "transformers" in lines[2]
        assert lines[3].startswith("  text at character ")
