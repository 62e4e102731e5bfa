"""Load test of `draftless serve` on loopback: concurrent clients, then every request again,
alone, on a server without speculation; each pair must be equal.

    PYTHONPATH=src python benchmarks/load_serve.py [--clients 8] [--requests 25]
        [--max-tokens 16] [--deadline 900] [--model smollm2] [--threads 1]

Mixes chat and completions, streaming and not, greedy and seeded sampling, over a few prompts
that recur (so the cross-request index and KV reuse take part). Bounded: `clients x requests`
requests, and no new request once `--deadline` seconds have passed (those are counted as not
run). Prints p50/p95 latency and throughput of the loaded server, failures, mismatches.
Both servers are started and stopped by this script (only one runs at a time).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_common import Answer, ask, draftless_command, percentile, running

PROMPTS = [
    "The three primary colours are",
    "def is_prime(n):",
    "Write a short poem about autumn.",
    "Explain what a hash table is in two sentences.",
    "List the days of the week:",
    "import json\n\ndef load(path):",
    "What is the capital of Japan?",
    "Translate to French: good morning, my friend.",
]


def request_for(client: int, i: int, max_tokens: int) -> dict[str, Any]:
    k = client * 31 + i
    prompt = PROMPTS[k % len(PROMPTS)]
    chat = {"messages": [{"role": "user", "content": prompt}]}
    body: dict[str, Any] = chat if k % 2 else {"prompt": prompt}
    body["max_tokens"] = max_tokens
    body["stream"] = (k // 2) % 2 == 1
    if k % 3 == 0:
        body |= {"temperature": 0.8, "top_p": 0.95, "seed": 1000 + k % 5}
    else:
        body["temperature"] = 0
    return body


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=25, help="per client")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--deadline", type=float, default=900.0, help="seconds for the load phase")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    common = ("--model", args.model, "--threads", str(args.threads))
    logs = Path(tempfile.mkdtemp(prefix="load_serve-"))
    bodies = [
        [request_for(c, i, args.max_tokens) for i in range(args.requests)]
        for c in range(args.clients)
    ]
    results: dict[tuple[int, int], Answer] = {}
    failures: list[str] = []
    lock = threading.Lock()

    with running(draftless_command(*common), log=logs / "spec.log") as url:
        start = time.perf_counter()
        stop_at = start + args.deadline

        def client(c: int) -> None:
            with httpx.Client(timeout=300) as http:
                for i, body in enumerate(bodies[c]):
                    if time.perf_counter() > stop_at:
                        return
                    try:
                        answer = ask(http, url, body)
                    except Exception as err:  # counted, reported, never hidden
                        with lock:
                            failures.append(f"client {c} request {i}: {err!r}")
                        continue
                    with lock:
                        results[(c, i)] = answer

        with ThreadPoolExecutor(args.clients) as pool:
            list(pool.map(client, range(args.clients)))
        wall = time.perf_counter() - start
        metrics = httpx.get(url + "/metrics").text

    mismatches: list[str] = []
    plain = draftless_command(*common, "--no-spec")
    with running(plain, log=logs / "plain.log") as url, httpx.Client(timeout=300) as http:
        for (c, i), got in sorted(results.items()):
            alone = ask(http, url, {**bodies[c][i], "stream": False})
            same = (got.text, got.finish_reason, got.completion_tokens) == (
                alone.text,
                alone.finish_reason,
                alone.completion_tokens,
            )
            if not same:
                mismatches.append(f"client {c} request {i}: {got.text!r} != {alone.text!r}")

    total = args.clients * args.requests
    latencies = [a.seconds for a in results.values()]
    tokens = sum(a.completion_tokens or 0 for a in results.values())
    drafted = sum(a.stats.get("drafted", 0) for a in results.values())
    accepted = sum(a.stats.get("accepted", 0) for a in results.values())
    reused = sum(a.stats.get("reused_tokens", 0) for a in results.values())
    index_bytes = next(
        (ln.split()[1] for ln in metrics.splitlines() if ln.startswith("draftless_index_bytes ")),
        "?",
    )
    print(
        f"load_serve: {args.clients} clients x {args.requests} requests, model {args.model}, "
        f"threads {args.threads}, max_tokens {args.max_tokens}, loopback"
    )
    not_run = total - len(results) - len(failures)
    print(f"  completed        {len(results)}/{total} (not run: {not_run})")
    print(f"  failed           {len(failures)}")
    print(f"  != served alone  {len(mismatches)} (plain server, no speculation, one at a time)")
    print(f"  wall             {wall:.1f} s")
    print(f"  latency p50      {percentile(latencies, 0.5):.2f} s")
    print(f"  latency p95      {percentile(latencies, 0.95):.2f} s")
    print(f"  throughput       {len(results) / wall:.2f} req/s, {tokens / wall:.1f} tok/s")
    rate = accepted / drafted if drafted else 0.0
    print(f"  speculation      drafted {drafted}, accepted {accepted} ({rate:.0%})")
    print(f"  KV reuse         {reused} prompt tokens not prefilled again")
    print(f"  index bytes      {index_bytes}")
    for line in (failures + mismatches)[:10]:
        print("  !", line)
    print(f"  logs             {logs}")
    return 0 if not failures and not mismatches and len(results) == total else 1


if __name__ == "__main__":
    sys.exit(main())
