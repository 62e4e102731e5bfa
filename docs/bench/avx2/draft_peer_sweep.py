"""Is the draft-model peer configured fairly? llama-server's draft-simple (0.5B drafting for the
1.5B) at its default draft length and at longer ones, with and without thread polling, on the
bench's grounded copies, greedy. Scratch (session 24), not part of the bench:

    PYTHONPATH=src .venv/bin/python docs/bench/avx2/draft_peer_sweep.py [--threads 2] [--reps 2]

Each configuration is a fresh llama-server (as the bench's lsrv-draft), driven by the bench's
own LlamaServer and timed by its timings.predicted_per_second; llama-server plain runs in the
same rotation, so every ratio is over a plain measured beside it. Prints tok/s per run, the
median per configuration, and drafted / accepted tokens.
"""

from __future__ import annotations

import argparse
import statistics

from draftless import load_model
from draftless.bench.llama_server import (
    CONFIGS,
    ServerConfig,
    completion_body,
    draft_config,
    llama_server_peers,
)
from draftless.bench.runner import Job, _chat_ids
from draftless.bench.tasks import load_task
from draftless.models import fetch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("-n", type=int, default=192)
    args = ap.parse_args()
    model = load_model("qwen2.5-coder-1.5b", backend="llamacpp", n_threads=args.threads)
    draft = fetch.cached(fetch.CHUNKED_MODELS["qwen2.5-coder-0.5b"])
    assert draft is not None, "draftless pull qwen2.5-coder-0.5b"
    base = draft_config(draft, "qwen2.5-coder-0.5b", args.threads, args.threads)

    def variant(key: str, *extra: str) -> ServerConfig:
        return ServerConfig(key, f"draft {key}", base.args + extra, fresh=True)

    # llama_server_peers appends the bench's own lsrv-draft ("draft": --spec-draft-n-max 3,
    # llama-server's default, and --poll 50) after these, since the draft model is given
    configs = [
        CONFIGS[0],  # plain
        variant("n8", "--spec-draft-n-max", "8"),
        variant("n16", "--spec-draft-n-max", "16"),
        variant("n16-nopoll", "--spec-draft-n-max", "16", "--poll", "0", "--poll-draft", "0"),
    ]
    peers, notes = llama_server_peers(model, configs=configs, draft=draft)
    print(*notes, sep="\n")
    task = load_task("grounded-copy")
    jobs = [
        Job(task.name, p.id, tuple(_chat_ids(model, p.text)), (), 0.0, None, args.n)
        for p in task.prompts[: args.prompts]
    ]
    speeds: dict[str, list[float]] = {p.config.key: [] for p in peers}
    drafts: dict[str, list[tuple[int, int]]] = {p.config.key: [] for p in peers}
    for job in jobs:
        for rep in range(args.reps):
            k = rep % len(peers)
            for peer in peers[k:] + peers[:k]:
                peer.server.stop()  # fresh, as the bench's draft peer
                done = peer.server.complete(completion_body(job))
                speeds[peer.config.key].append(done.predicted_per_second)
                drafts[peer.config.key].append((done.draft_n, done.draft_accepted))
                print(
                    f"{job.prompt_id} rep {rep} {peer.config.key:11s} "
                    f"{done.predicted_per_second:6.2f} tok/s  n {done.predicted_n}  "
                    f"drafted {done.draft_n} accepted {done.draft_accepted}",
                    flush=True,
                )
    plain = statistics.median(speeds["plain"])
    for key, v in speeds.items():
        d = sum(a for a, _ in drafts[key])
        a = sum(b for _, b in drafts[key])
        print(
            f"{key:11s} median {statistics.median(v):6.2f} tok/s  over plain "
            f"{statistics.median(v) / plain:.2f}  drafted {d} accepted {a}"
        )
    for peer in peers:
        peer.server.stop()


if __name__ == "__main__":
    main()
