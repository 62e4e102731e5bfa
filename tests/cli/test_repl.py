"""`draftless chat`, driven as a person would: lines fed on stdin, and keys typed into a
pseudo-terminal (Ctrl-C mid-reply, Ctrl-C twice at the prompt, Ctrl-D).

The fast tests run the real REPL in a child process over the exact numpy models of
test_chat.py (`python -c "... test_repl.serve_fake()"`); the slow ones run
`python -m draftless chat --model smollm2` on llama.cpp.
"""

from __future__ import annotations

import importlib.util
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from functools import cache
from pathlib import Path

import pytest

from draftless.cli import main

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
FAKE = ["-c", "import test_repl; test_repl.serve_fake()"]
LONG_REPLY = "abcdefghij klmnopqrst " * 20


def env(tmp_path: Path) -> dict[str, str]:
    return dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(TESTS), str(TESTS / "cli")]),
        DRAFTLESS_CACHE=str(tmp_path / "cache"),  # the readline history file goes here
        TERM="dumb",
        PYTHONUNBUFFERED="1",
    )


def serve_fake() -> None:
    """The child of the fast tests: the REPL over a scripted model. Options in argv:
    --spec, --slow (a long reply at 50 tokens/s), -n N (max new tokens), --stop TEXT."""
    from draftless.chat import Conversation
    from draftless.cli.chat import Repl
    from test_chat import ALWAYS, ScriptModel, ids

    argv = sys.argv[1:]
    slow = "--slow" in argv
    n = int(argv[argv.index("-n") + 1]) if "-n" in argv else 64
    replies = (
        [ids(LONG_REPLY), ids("ok.")] if slow else [ids("hello there."), ids("general kenobi.")]
    )
    model = ScriptModel(replies)
    if slow:
        model.on_forward = lambda _ids: time.sleep(0.02)
    stops = [argv[argv.index("--stop") + 1]] if "--stop" in argv else []
    conv = Conversation(
        model,
        speculation="--spec" in argv,
        spec_options=ALWAYS,
        max_new_tokens=n,
        stop_sequences=stops,
    )
    code = Repl(conv).run()
    conv.check_integrity()  # cache, history and index agree after whatever happened
    print(f"[integrity ok: {conv.turns} turns, {len(conv.history)} tokens]", file=sys.stderr)
    raise SystemExit(code)


def run_fake(tmp_path: Path, stdin: str, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *FAKE, *flags],
        input=stdin,
        text=True,
        capture_output=True,
        env=env(tmp_path),
        timeout=60,
        cwd=TESTS,
    )


def user_errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error: ")]


# -- a pseudo-terminal -----------------------------------------------------------------------
class Terminal:
    """A child process on a pseudo-terminal: type keys, wait for output."""

    def __init__(self, argv: list[str], environ: dict[str, str], cwd: Path) -> None:
        pid, fd = pty.fork()
        if pid == 0:  # the child: the pty is its controlling terminal
            try:
                # Ctrl-C as a user's shell delivers it: a runner started in the background
                # (`cmd &` in a script) ignores SIGINT, and an exec'd child inherits that
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                os.chdir(cwd)
                os.execve(sys.executable, [sys.executable, *argv], environ)
            finally:
                os._exit(127)
        self.pid, self.fd = pid, fd
        self.output = ""
        self._seen = 0  # expect() searches output after this offset
        self.status: int | None = None

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return False
        try:
            data = os.read(self.fd, 4096)
        except OSError:  # EIO: the child closed the terminal
            data = b""
        if not data:
            return False
        self.output += data.decode("utf-8", errors="replace").replace("\r\n", "\n")
        return True

    def expect(self, pattern: str, timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern)
        while True:
            match = regex.search(self.output, self._seen)
            if match:
                self._seen = match.end()
                return match.group(0)
            left = deadline - time.monotonic()
            if left <= 0 or (not self._read(min(left, 0.5)) and not self.alive()):
                raise AssertionError(f"no {pattern!r} in the output:\n{self.output}")

    def type(self, keys: str) -> None:
        os.write(self.fd, keys.encode())

    def ctrl_c_at_the_prompt(self) -> None:
        """Ctrl-C once the REPL waits in readline. The prompt is written just before CPython's
        readline blocks in select() with no timeout; a SIGINT landing in between is handled
        but wakes nothing, so the keypress seems lost until the next key (seen once under
        load). A short pause puts the key after the select() starts; if nothing but the echo
        follows within 3 s (it landed before the select() anyway), Ctrl-B, a
        key that edits nothing on an empty line, wakes readline to act on it."""
        time.sleep(0.5)
        seen = len(self.output)
        self.type("\x03")
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            if self.output[seen:].replace("^C", "").strip() or not self.alive():
                return
            self._read(0.2)
        self.type("\x02")

    def alive(self) -> bool:
        if self.status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(status)
        return self.status is None

    def wait(self, timeout: float = 30) -> int:
        deadline = time.monotonic() + timeout
        while self.alive():
            if time.monotonic() > deadline:
                raise AssertionError(f"still running:\n{self.output}")
            self._read(0.1)
        while self._read(0.05):
            pass
        assert self.status is not None
        return self.status

    def close(self) -> None:
        if self.alive():
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        os.close(self.fd)


@pytest.fixture
def terminal(tmp_path: Path):
    opened: list[Terminal] = []

    def start(*argv: str) -> Terminal:
        t = Terminal(list(argv), env(tmp_path), TESTS)
        opened.append(t)
        return t

    yield start
    for t in opened:
        t.close()


# -- fast: the REPL over a scripted model ------------------------------------------------------
def test_a_piped_session_replies_line_by_line_and_exits_0_at_eof(tmp_path: Path) -> None:
    proc = run_fake(tmp_path, "hi\n\n   \nhow are you\n", "--spec")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "hello there.\ngeneral kenobi.\n"  # empty lines send nothing
    assert "> " not in proc.stdout  # no prompt on a pipe
    spec_lines = [line for line in proc.stderr.splitlines() if "spec: steps=" in line]
    assert len(spec_lines) == 2  # one summary per turn, on stderr
    assert "[integrity ok: 2 turns" in proc.stderr


@pytest.mark.parametrize("spec", [False, True])
def test_a_stop_sequence_trims_the_streamed_reply(tmp_path: Path, spec: bool) -> None:
    flags = ("--stop", " there", *(["--spec"] if spec else []))
    proc = run_fake(tmp_path, "hi\nhow are you\n", *flags)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "hello\ngeneral kenobi.\n"
    assert "[integrity ok: 2 turns" in proc.stderr


def test_commands_and_mistakes_inside_the_repl(tmp_path: Path) -> None:
    good = tmp_path / "ref.txt"
    good.write_text("general kenobi. you are a bold one.")
    binary = tmp_path / "blob.bin"
    binary.write_bytes(b"\x7fELF\x00\x00binary")
    big = tmp_path / "big.txt"
    with big.open("wb") as fh:  # sparse: over the 4 MiB limit without writing it
        fh.truncate(4 * 1024 * 1024 + 1)
    lines = [
        "/help",
        f"/ref {tmp_path / 'missing.txt'}",
        f"/ref {binary}",
        f"/ref {big}",
        "/ref",
        "/frobnicate",
        f"/ref {good}",
        "hi",
        "how are you",
        "/stats",
        "/reset",
        "hi",
        "//slash is a message",
        "/quit",
        "never read",
    ]
    proc = run_fake(tmp_path, "\n".join(lines) + "\n", "--spec")
    assert proc.returncode == 0, proc.stderr
    errors = user_errors(proc.stderr)
    assert len(errors) == 5, proc.stderr
    assert "not found" in errors[0] and "binary" in errors[1] and "limit" in errors[2]
    assert "usage: /ref FILE" in errors[3] and "unknown command /frobnicate" in errors[4]
    out = proc.stdout
    assert "/reset" in out and "/ref FILE" in out  # the help
    assert "(reference[0]: " in out and "tokens)" in out
    assert "turns 2," in out and "reference[0] " in out and "references: 1" in out
    assert "(new conversation; 1 reference(s) kept)" in out
    # after /reset the script restarts: the first reply again; "//..." was sent as "/..."
    assert out.count("hello there.") == 2 and out.count("general kenobi.") == 2
    assert "[integrity ok: 2 turns" in proc.stderr  # /reset, then two turns


def test_ref_needs_spec_and_at_most_eight(tmp_path: Path) -> None:
    doc = tmp_path / "doc.txt"
    doc.write_text("some reference text")
    proc = run_fake(tmp_path, f"/ref {doc}\nhi\n")
    assert proc.returncode == 0 and proc.stdout.endswith("hello there.\n")
    assert "needs speculation" in user_errors(proc.stderr)[0]
    proc = run_fake(tmp_path, f"/ref {doc}\n" * 9 + "hi\n", "--spec")
    assert proc.returncode == 0
    errors = user_errors(proc.stderr)
    assert len(errors) == 1 and "at most 8" in errors[0]
    assert proc.stdout.count("(reference[") == 8 and proc.stdout.endswith("hello there.\n")


def test_sigint_mid_reply_on_a_pipe_ends_the_turn_and_the_repl_goes_on(tmp_path: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, *FAKE, "--slow", "-n", "400"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env(tmp_path),
        cwd=TESTS,
    )
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write(b"go\n")
    child.stdin.flush()
    first = os.read(child.stdout.fileno(), 64)  # the reply has started
    assert first
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(b"again\n", timeout=60)
    text = (first + out).decode()
    assert child.returncode == 0, err.decode()
    assert "[interrupted]" in err.decode()
    replies = text.split("\n")
    assert len(replies[0]) < len(LONG_REPLY.strip())  # cut short
    assert "[integrity ok: 2 turns" in err.decode()


def test_a_terminal_session_ctrl_c_mid_reply_then_twice_at_the_prompt(terminal) -> None:
    t = terminal(*FAKE, "--slow", "-n", "400", "--spec")
    t.expect(r"/help for commands")
    t.expect(r"> ")
    t.type("go\n")
    t.expect(r"abcdefghij")  # streaming
    t.type("\x03")  # Ctrl-C: the turn ends after the current step
    t.expect(r"\[interrupted\]")
    t.expect(r"spec: steps=")
    t.expect(r"> ")
    t.type("/stats\n")
    t.expect(r"turns 1, \d+ tokens")
    t.type("more\n")
    t.expect(r"ok\.")
    t.expect(r"> ")
    t.ctrl_c_at_the_prompt()  # a hint, the REPL stays
    t.expect(r"Ctrl-C again")
    t.expect(r"> ")
    t.ctrl_c_at_the_prompt()  # twice in a row: leave
    assert t.wait() == 0
    assert "[integrity ok: 2 turns" in t.output
    assert "Traceback" not in t.output


def test_a_terminal_session_ends_with_ctrl_d(terminal, tmp_path: Path) -> None:
    t = terminal(*FAKE)
    t.expect(r"> ")
    t.type("hi\n")
    t.expect(r"hello there\.")
    t.expect(r"> ")
    t.type("\x04")  # Ctrl-D
    assert t.wait() == 0
    assert "[integrity ok: 1 turns" in t.output
    assert (tmp_path / "cache" / "chat_history").read_text().strip().endswith("hi")


# -- start-up mistakes: one line, exit 2, before any model is loaded ---------------------------
# `python -m draftless`, with one llama.cpp thread (n_threads defaults to os.cpu_count(); two
# threads that spin-wait on each other crawl when other jobs load a 2-core machine)
CLI = [
    "-c",
    "import os; os.cpu_count = lambda: 1; from draftless.cli import main; raise SystemExit(main())",
]


def run_cli(tmp_path: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *CLI, "chat", *args],
        input=stdin,
        text=True,
        capture_output=True,
        env=env(tmp_path),
        timeout=120,
        cwd=ROOT,
    )


def assert_user_error(proc: subprocess.CompletedProcess, fragment: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("draftless: error: "), proc.stderr
    assert fragment in lines[0]
    assert proc.stdout == ""


def test_startup_mistakes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = tmp_path / "doc.txt"
    doc.write_text("text")
    binary = tmp_path / "blob.bin"
    binary.write_bytes(b"\x00\x01\x02")
    big = tmp_path / "big.txt"
    with big.open("wb") as fh:
        fh.truncate(4 * 1024 * 1024 + 1)
    bogus = ["--model", str(tmp_path / "absent.gguf")]  # would fail later: these fail first
    nine = [arg for _ in range(9) for arg in ("--spec-ref", str(doc))]
    cases = [
        (["--spec", "--spec-ref", str(tmp_path / "x")], "not found"),
        (["--spec", "--spec-ref", str(binary)], "binary"),
        (["--spec", "--spec-ref", str(big)], "limit"),
        (["--spec", *nine], "at most 8"),
        (["--spec-ref", str(doc)], "needs --spec"),
        (["--no-edits"], "--no-edits needs --spec"),
        (["-n", "0"], "--max-new-tokens"),
        (["--system", " "], "--system"),
        ([], "not found"),  # and then the model
    ]
    for flags, fragment in cases:
        assert main(["chat", *bogus, *flags]) == 2
        out, err = capsys.readouterr()
        lines = [line for line in err.splitlines() if line.strip()]
        assert out == "" and len(lines) == 1, err
        assert lines[0].startswith("draftless: error: ") and fragment in lines[0], err
    # and once as a person would see it
    assert_user_error(run_cli(tmp_path, *bogus, "--spec", "--spec-ref", str(binary)), "binary")


# -- slow: the real CLI on SmolLM2 through llama.cpp ---------------------------------------------
@cache
def smollm2_problem() -> str | None:
    """Why the real model cannot run here (None if it can): checked in a child process,
    because a llama.cpp build for the wrong CPU dies with SIGILL."""
    if importlib.util.find_spec("llama_cpp") is None:
        return "llama_cpp is not importable"
    probe = "from draftless.models.registry import load_model; load_model('smollm2').close()"
    proc = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT / "src")),
        timeout=120,
    )
    if proc.returncode != 0:
        return f"smollm2 on llama.cpp fails here (exit {proc.returncode}): {proc.stderr[-200:]}"
    return None


@pytest.fixture
def smollm2() -> None:
    problem = smollm2_problem()
    if problem:
        pytest.skip(problem)


SMOLLM2 = ["--model", "smollm2", "--backend", "llamacpp", "-n", "32"]


@pytest.mark.slow
@pytest.mark.llamacpp
def test_smollm2_piped_chat_speculative_equals_plain(smollm2, tmp_path: Path) -> None:
    ref = tmp_path / "rhine.txt"
    ref.write_text("The Rhine rises in the Swiss Alps and flows into the North Sea.\n")
    script = (
        "What is the capital of France?\n"
        "Repeat this sentence: The Rhine rises in the Swiss Alps and flows into the North "
        "Sea.\n"
    )
    plain = run_cli(tmp_path, *SMOLLM2, stdin=script)
    spec = run_cli(
        tmp_path,
        *SMOLLM2,
        "--spec",
        "--spec-ref",
        str(ref),
        stdin=script
        + f"/ref {ref}\n/ref {tmp_path / 'missing.txt'}\n/stats\n/reset\n"
        + "What is the capital of France?\n",
    )
    assert plain.returncode == 0 and spec.returncode == 0, spec.stderr
    # lossless through the whole CLI: the same replies, turn after turn, and after /reset
    plain_replies = plain.stdout.splitlines()
    assert spec.stdout.startswith(plain.stdout)
    assert spec.stdout.rstrip("\n").endswith(plain_replies[0])
    assert len([line for line in spec.stderr.splitlines() if "spec: steps=" in line]) == 3
    assert "reference[0] " in spec.stdout and "(reference[1]: " in spec.stdout
    assert "\nedits: learned " in spec.stdout  # /stats: the learner's counts
    errors = user_errors(spec.stderr)
    assert len(errors) == 1 and "not found" in errors[0]


@pytest.mark.slow
@pytest.mark.llamacpp
def test_smollm2_ctrl_c_mid_reply_in_a_terminal(smollm2, terminal) -> None:
    t = terminal(
        *CLI,
        "chat",
        "--model",
        "smollm2",
        "--backend",
        "llamacpp",
        "--spec",
        "-n",
        "400",
    )
    t.expect(r"> ", timeout=60)
    t.type("Write a long story about a dragon who learns to cook.\n")
    t.expect(r"cook\.\n+\S+\s+\S+")  # past the echoed line: the reply streams
    t.type("\x03")
    t.expect(r"\[interrupted\]")
    t.expect(r"> ")
    t.type("What is the capital of France? One word.\n")
    t.expect(r"spec: steps=", timeout=60)
    t.expect(r"> ")
    t.type("/stats\n")
    t.expect(r"turns 2, \d+ tokens in the conversation \(context \d+\)")
    t.expect(r"> ")  # readline reads Ctrl-D only once it is waiting for a line
    t.type("\x04")
    assert t.wait() == 0
    assert "Traceback" not in t.output and "error" not in t.output
