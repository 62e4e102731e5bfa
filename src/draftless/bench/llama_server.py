"""llama.cpp's own server as a bench peer: what a llama.cpp user already has.

    lsrv-plain          llama-server, no speculation (the baseline of the four below)
    lsrv-ngram-simple   --spec-type ngram-simple
    lsrv-ngram-map-k    --spec-type ngram-map-k
    lsrv-ngram-mod      --spec-type ngram-mod
    lsrv-draft          --spec-type draft-simple -md <draft GGUF>: qwen2.5-coder-0.5b drafting
                        for qwen2.5-coder-1.5b (same tokenizer), when both are cached

The binary is built by scripts/build-llama-server.sh from the llama.cpp source vendored in the
pinned llama-cpp-python sdist, with the wheel's CPU flags, and cached under cache_dir()/llama-
server-<key>/ (or named by $DRAFTLESS_LLAMA_SERVER). Each configuration is one server process on
127.0.0.1 (a free port) with the GGUF, thread counts, context and batch size of our llama.cpp
model, started on first use, held stopped (SIGSTOP) between its requests so that idle worker
threads take no CPU from the method being timed, and terminated at exit. A run POSTs /completion
with the prompt as token ids (so the prompt is exactly ours, chat template included), greedy (top_k
1) or our temperature and seed without top-k/top-p, `cache_prompt` off (prefill is redone and
timed, as for every other method), and reads back the token ids and the server's own timings:
prompt_ms and predicted_ms, whose predicted_per_second is the decode tok/s the bench reports (the
server, like the bench, counts the first token as the prompt's: (n - 1) / predicted time).

Speculative state outlives a request in llama-server: ngram-mod keeps a server-wide n-gram table,
ngram-map-k its map, draft-simple the draft model's cache. A second rep of the same prompt would
find its own answer there, so those servers are restarted before every run (not timed: the
server's timings start at the request).

Each speculative configuration's output is also compared with llama-server plain's on the same
prompt (its own plain; the runner compares every method with draftless plain): a difference is
appended to the bench's notes.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from draftless.bench.runner import Job, Run
from draftless.metrics import DecodeStats
from draftless.models.base import Model, cache_dir

BINARY_ENV = "DRAFTLESS_LLAMA_SERVER"
BUILD_HINT = "build it with scripts/build-llama-server.sh (a C++ build: 10-40 minutes on 2 cores)"
START_TIMEOUT = 300.0  # seconds for a server to load its model(s) and answer /health
REQUEST_TIMEOUT = 1800.0
PLAIN_NAME = "lsrv-plain"


class ServerError(RuntimeError):
    """The server could not start or answered something unreadable (a peer failure, not ours)."""


@dataclass(frozen=True, slots=True)
class ServerConfig:
    key: str  # "plain", "ngram-mod", ...
    label: str
    args: tuple[str, ...]  # extra command-line arguments
    fresh: bool  # restart before every run: its speculative state outlives a request

    @property
    def name(self) -> str:
        return f"lsrv-{self.key}"


CONFIGS = (
    ServerConfig("plain", "llama-server", (), fresh=False),
    ServerConfig(
        "ngram-simple", "llama-server ngram-simple", ("--spec-type", "ngram-simple"), False
    ),
    ServerConfig("ngram-map-k", "llama-server ngram-map-k", ("--spec-type", "ngram-map-k"), True),
    ServerConfig("ngram-mod", "llama-server ngram-mod", ("--spec-type", "ngram-mod"), True),
)
# target model file -> registry name of its draft model (same tokenizer)
DRAFT_FOR = {"qwen2.5-coder-1.5b-instruct-q4_k_m.gguf": "qwen2.5-coder-0.5b"}


DRAFT_KEY = "draft"  # the key of the draft-model configuration (its peer: lsrv-draft)


def draft_config(draft: Path, draft_name: str, threads: int, threads_batch: int) -> ServerConfig:
    """draft-simple with a draft model, on the target's thread counts."""
    return ServerConfig(
        DRAFT_KEY,
        f"llama-server draft {draft_name}",
        (
            "--spec-type",
            "draft-simple",
            "--spec-draft-model",
            str(draft),
            "--spec-draft-threads",
            str(threads),
            "--spec-draft-threads-batch",
            str(threads_batch),
        ),
        fresh=True,
    )


def find_binary() -> Path | None:
    """$DRAFTLESS_LLAMA_SERVER, else the newest cached build; None if there is none."""
    named = os.environ.get(BINARY_ENV)
    if named:
        path = Path(named).expanduser()
        return path if path.is_file() and os.access(path, os.X_OK) else None
    builds = [
        p
        for p in cache_dir().glob("llama-server-*/llama-server")
        if p.is_file() and os.access(p, os.X_OK)
    ]
    return max(builds, key=lambda p: p.stat().st_mtime) if builds else None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_command(
    binary: Path,
    model_path: Path,
    *,
    port: int,
    threads: int,
    threads_batch: int,
    n_ctx: int,
    n_batch: int,
    extra: Sequence[str] = (),
) -> list[str]:
    """llama-server's command line: one slot, our context, threads and batch size."""
    return [
        str(binary),
        "--model", str(model_path),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--threads", str(threads),
        "--threads-batch", str(threads_batch),
        "--ctx-size", str(n_ctx),
        "--batch-size", str(n_batch),
        "--ubatch-size", str(n_batch),
        "--parallel", "1",  # one slot: the whole context for the one request
        "--flash-attn", "auto",  # as our context: llama.cpp's default
        "--cache-ram", "0",  # no prompt cache across requests
        "--no-webui",
        *extra,
    ]  # fmt: skip


def completion_body(job: Job) -> dict[str, Any]:
    """The /completion request for a job: its token ids, greedy or our temperature and seed."""
    sampled = job.temperature > 0
    return {
        "prompt": list(job.ids),
        "n_predict": job.max_new_tokens,
        "stream": False,
        "cache_prompt": False,
        "return_tokens": True,
        "temperature": job.temperature if sampled else 0.0,
        "top_k": 0 if sampled else 1,  # greedy: the argmax only
        "top_p": 1.0,
        "min_p": 0.0,
        "typical_p": 1.0,
        "repeat_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "seed": job.seed or 0,
    }


@dataclass(frozen=True, slots=True)
class Completion:
    tokens: tuple[int, ...]
    prompt_n: int
    prompt_ms: float
    predicted_n: int
    predicted_ms: float
    predicted_per_second: float
    prompt_per_second: float
    draft_n: int
    draft_accepted: int
    stop_type: str


def parse_completion(data: Any) -> Completion:
    """The parts of a /completion answer the bench uses; ServerError if any is missing."""
    try:
        tokens = data["tokens"]
        timings = data["timings"]
        if not isinstance(tokens, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in tokens
        ):
            raise ServerError(f"'tokens' is not a list of token ids: {str(tokens)[:80]}")
        return Completion(
            tokens=tuple(tokens),
            prompt_n=int(timings["prompt_n"]),
            prompt_ms=float(timings["prompt_ms"]),
            predicted_n=int(timings["predicted_n"]),
            predicted_ms=float(timings["predicted_ms"]),
            predicted_per_second=float(timings["predicted_per_second"]),
            prompt_per_second=float(timings.get("prompt_per_second", 0.0)),
            draft_n=int(timings.get("draft_n", 0)),
            draft_accepted=int(timings.get("draft_n_accepted", 0)),
            stop_type=str(data.get("stop_type", "")),
        )
    except (KeyError, TypeError, ValueError) as err:
        raise ServerError(f"unreadable /completion answer ({err!r}): {str(data)[:200]}") from None


def to_run(done: Completion, stops: frozenset[int], limit: int) -> Run:
    """A Run timed by the server's own clock: prefill = prompt_ms, decode = predicted_ms.

    The first token comes from the prompt's forward (first_tokens 1), so the runner's decode
    tok/s, (n - 1) / predicted time, is the server's predicted_per_second. llama-server reports
    drafted and accepted tokens but not how many forwards verified a draft, so verify_steps and
    plain_steps stay 0; steps = committed - accepted (each forward commits its accepted
    drafts plus one).
    """
    tokens: list[int] = []
    for t in done.tokens[:limit]:
        tokens.append(t)
        if t in stops:
            break
    committed = len(tokens)
    accepted = min(done.draft_accepted, max(0, committed - 1))
    stats = DecodeStats(
        steps=committed - accepted,
        committed=committed,
        drafted=done.draft_n,
        accepted=accepted,
    )
    first_seconds = done.prompt_ms / 1000.0
    seconds = first_seconds + done.predicted_ms / 1000.0
    return Run(tuple(tokens), seconds, first_seconds, min(1, committed), stats)


def _die_with_parent() -> None:  # pragma: no cover - runs in the child, Linux only
    with contextlib.suppress(Exception):
        import ctypes

        # SIGKILL, not SIGTERM: between requests the server is held stopped (SIGSTOP), and a
        # stopped process never acts on SIGTERM; a bench killed then left it behind for good.
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class LlamaServer:
    """One llama-server process: start, wait for /health, POST /completion, stop."""

    def __init__(self, command_for_port: Any, *, label: str = "llama-server") -> None:
        self._command_for_port = command_for_port  # port -> argv
        self.label = label
        self.port = 0
        self.command: list[str] = []
        self.proc: subprocess.Popen[bytes] | None = None
        self.proc_returncode: int | None = None  # of the last process stopped
        self._log: IO[bytes] | None = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = START_TIMEOUT) -> None:
        self.stop()
        self.port = free_port()
        self.command = self._command_for_port(self.port)
        # the server's log, kept for an error message; closed by stop()
        self._log = tempfile.TemporaryFile(prefix="draftless-llama-server-")  # noqa: SIM115
        self.proc = subprocess.Popen(
            self.command,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                tail = self.log_tail()
                self.stop()
                raise ServerError(f"{self.label} exited with status {self.proc_returncode}: {tail}")
            try:
                status, _ = self._request("GET", "/health", None, timeout=5.0)
                if status == 200:
                    return
            except (OSError, ServerError):
                pass
            if time.monotonic() > deadline:
                tail = self.log_tail()
                self.stop()
                raise ServerError(f"{self.label} not ready after {timeout:.0f} s: {tail}")
            time.sleep(0.1)

    def log_tail(self, lines: int = 3) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        text = self._log.read().decode("utf-8", "replace").strip().splitlines()
        return " | ".join(text[-lines:])

    def _request(
        self, method: str, path: str, body: dict[str, Any] | None, *, timeout: float
    ) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as err:
            detail = err.read()[:300].decode("utf-8", "replace")
            raise ServerError(f"{self.label}: HTTP {err.code} on {path}: {detail}") from None
        except json.JSONDecodeError as err:
            raise ServerError(f"{self.label}: {path} answered non-JSON: {err}") from None

    def complete(self, body: dict[str, Any]) -> Completion:
        """One request. Between requests the process is stopped (SIGSTOP): an idle server's
        worker threads may spin (OMP_WAIT_POLICY=ACTIVE) and would slow whatever runs next."""
        if not self.running:
            self.start()
        self._signal(signal.SIGCONT)
        try:
            _, data = self._request("POST", "/completion", body, timeout=REQUEST_TIMEOUT)
        finally:
            self._signal(signal.SIGSTOP)
        return parse_completion(data)

    def _signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGCONT)  # a stopped process cannot act on SIGTERM
                    proc.send_signal(signal.SIGTERM)  # llama-server shuts down on SIGTERM
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            self.proc_returncode = proc.returncode
        if self._log is not None:
            self._log.close()
            self._log = None


class ServerGroup:
    """The servers of one bench backend, and the comparison of each with llama-server plain."""

    def __init__(self) -> None:
        self.servers: list[LlamaServer] = []
        self.notes: list[str] = []  # shared with the bench: mismatches land in its notes
        self._outputs: dict[tuple[str, tuple[Any, ...]], tuple[int, ...]] = {}
        self._compared: set[tuple[str, tuple[Any, ...]]] = set()
        atexit.register(self.close)

    def record(self, method: str, job: Job, tokens: tuple[int, ...]) -> None:
        key = (job.task, job.prompt_id, job.max_new_tokens, job.temperature, job.seed)
        self._outputs.setdefault((method, key), tokens)
        plain = self._outputs.get((PLAIN_NAME, key))
        for (name, k), out in list(self._outputs.items()):
            if k != key or name == PLAIN_NAME or plain is None or (name, k) in self._compared:
                continue
            self._compared.add((name, k))
            if job.temperature > 0:
                continue  # sampled: the server's own sampler; not comparable token for token
            at = next(
                (i for i, (a, b) in enumerate(zip(plain, out, strict=False)) if a != b),
                None if len(plain) == len(out) else min(len(plain), len(out)),
            )
            if at is not None:
                self.notes.append(
                    f"{name}: differs from llama-server plain on {job.task}/{job.prompt_id} "
                    f"at token {at}"
                )

    def close(self) -> None:
        for server in self.servers:
            server.stop()


class LlamaServerPeer:
    """One llama-server configuration as a bench Method."""

    exact = False  # llama.cpp's sampler, not ours

    def __init__(
        self,
        config: ServerConfig,
        server: LlamaServer,
        group: ServerGroup,
        stops: frozenset[int],
    ) -> None:
        self.config = config
        self.server = server
        self.group = group
        self.stops = stops
        self.name = config.name
        self.label = config.label
        self.baseline = None if config.key == "plain" else PLAIN_NAME
        self._used = False

    def run(self, job: Job) -> Run:
        if self.config.fresh and self._used:
            self.server.stop()  # complete() starts it again, its speculative state empty
        self._used = True
        done = self.server.complete(completion_body(job))
        run = to_run(done, self.stops, job.max_new_tokens)
        self.group.record(self.name, job, run.token_ids)
        return run


def llama_server_peers(
    model: Model,
    *,
    binary: Path | None = None,
    n_ctx: int | None = None,
    configs: Sequence[ServerConfig] = CONFIGS,
    draft: Path | None = None,
) -> tuple[list[LlamaServerPeer], list[str]]:
    """The llama-server peers of a llama.cpp model, and notes (a missing binary or draft)."""
    binary = binary or find_binary()
    if binary is None:
        return [], [f"llama-server peers skipped: no llama-server binary; {BUILD_HINT}"]
    path = model.path
    if path is None:
        return [], [f"llama-server peers skipped: {model.name} has no GGUF path"]
    threads = threads_batch = model.threads or os.cpu_count() or 1
    ctx = int(n_ctx or model.n_ctx or 2048)
    n_batch = 512  # the llama.cpp backend's batch
    notes: list[str] = []
    chosen = list(configs)
    if draft is None and (draft_name := DRAFT_FOR.get(Path(path).name)) is not None:
        from draftless.models import fetch

        draft = fetch.cached(fetch.CHUNKED_MODELS[draft_name])
        if draft is None:
            notes.append(
                f"llama-server draft peer skipped: {draft_name} is not cached "
                f"(draftless pull {draft_name})"
            )
        else:
            chosen.append(draft_config(draft, draft_name, threads, threads_batch))
    elif draft is not None:
        chosen.append(draft_config(draft, draft.name, threads, threads_batch))
    group = ServerGroup()
    group.notes.extend(notes)
    stops = frozenset(model.eos_token_ids)
    peers: list[LlamaServerPeer] = []
    for config in chosen:

        def command(port: int, extra: tuple[str, ...] = config.args) -> list[str]:
            return server_command(
                binary,
                Path(path),
                port=port,
                threads=threads,
                threads_batch=threads_batch,
                n_ctx=ctx,
                n_batch=n_batch,
                extra=extra,
            )

        server = LlamaServer(command, label=config.label)
        group.servers.append(server)
        peers.append(LlamaServerPeer(config, server, group, stops))
    return peers, group.notes
