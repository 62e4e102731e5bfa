"""Shared by the server benchmarks: start a server command on a free loopback port, wait for
it, stop it; send one OpenAI request (plain or streamed) and time it."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
PYTHON = shlex.quote(sys.executable)


def draftless_command(*options: str) -> str:
    """`draftless serve` on {port}, from this checkout's sources."""
    return " ".join([PYTHON, "-m", "draftless", "serve", "--port", "{port}", *options])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running(command: str, *, log: Path, timeout: float = 300.0) -> Iterator[str]:
    """Runs `command` (a shell-free template with {port}) and yields its base URL once its
    /health answers 200; SIGTERM (then SIGKILL after 30 s) when done."""
    port = free_port()
    argv = shlex.split(command.format(port=port))
    # OMP_WAIT_POLICY as the caller has it: servers that wait for a request sleep anyway once
    # OpenMP's spin count runs out, and PASSIVE would slow every step at 2+ threads.
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{argv[0]} exited with {proc.returncode}; see {log}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{argv[0]} did not come up in {timeout:.0f} s; see {log}")
            time.sleep(0.25)
        yield url
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@dataclass
class Answer:
    text: str
    finish_reason: str | None
    completion_tokens: int | None
    seconds: float  # wall time, sent -> last byte
    stats: dict[str, Any]  # draftless's `draftless` object, or llama-server's `timings`


def ask(client: httpx.Client, url: str, body: dict[str, Any]) -> Answer:
    """One request; streamed when body["stream"]. Raises on any HTTP or protocol error."""
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    t0 = time.perf_counter()
    if not body.get("stream"):
        r = client.post(url + path, json=body)
        r.raise_for_status()
        data = r.json()
        choice = data["choices"][0]
        text = choice["message"]["content"] if "message" in choice else choice["text"]
        stats = data.get("draftless") or data.get("timings") or {}
        use = data.get("usage") or {}
        return Answer(
            text,
            choice["finish_reason"],
            use.get("completion_tokens"),
            time.perf_counter() - t0,
            stats,
        )
    text, finish, tokens, stats, done = "", None, None, {}, False
    with client.stream("POST", url + path, json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            payload = line[len("data: ") :]
            if payload == "[DONE]":
                done = True
                break
            chunk = json.loads(payload)
            if "error" in chunk:
                raise RuntimeError(f"error event: {chunk['error']}")
            for choice in chunk.get("choices", []):
                delta = choice.get("delta")
                text += (delta.get("content") or "") if delta is not None else choice["text"]
                finish = choice.get("finish_reason") or finish
            stats = chunk.get("draftless") or chunk.get("timings") or stats
            if chunk.get("usage"):
                tokens = chunk["usage"].get("completion_tokens")
    if not done:
        raise RuntimeError("the stream ended without [DONE]")
    return Answer(text, finish, tokens, time.perf_counter() - t0, stats)


def decode_stats(data: dict[str, Any], wall: float) -> tuple[float | None, int, int]:
    """(decode tokens/s, drafted, accepted) of one response, by the server's own timing:
    draftless's `draftless` object or llama-server's `timings`; else completion tokens over
    the wall time and no drafts."""
    d, t = data.get("draftless"), data.get("timings")
    if d is not None:
        return d["decode_tokens_per_second"], d["drafted"], d["accepted"]
    if t is not None:  # llama-server
        return t.get("predicted_per_second"), t.get("draft_n", 0), t.get("draft_n_accepted", 0)
    tokens = (data.get("usage") or {}).get("completion_tokens") or 0
    return (tokens / wall if wall else None), 0, 0


def response_row(data: dict[str, Any], wall: float) -> dict[str, Any]:
    """The fields a benchmark keeps of one chat response that took `wall` seconds."""
    use = data.get("usage") or {}
    tps, drafted, accepted = decode_stats(data, wall)
    return {
        "prompt_tokens": use.get("prompt_tokens"),
        "completion_tokens": use.get("completion_tokens"),
        "finish_reason": data["choices"][0]["finish_reason"],
        "wall_seconds": round(wall, 3),
        "decode_tokens_per_second": tps,
        "drafted": drafted,
        "accepted": accepted,
    }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    i = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[i]
