"""Structured-output benchmark: extraction into a JSON schema, per server, in lockstep.

Each request gives the model one real document and asks for a JSON object under a schema
(`response_format: json_schema`) whose strings copy from it: the signatures and docstrings of
a Python module's functions, or the name, summary, install command and first paragraph of a
package's description. The documents are files on this machine that nobody here wrote, drawn
by `--seed`: the standard library's modules (code) and the long descriptions in the installed
packages' METADATA (prose). Greedy, so a speculating server must answer exactly what its
plain partner does.

    PYTHONPATH=src python benchmarks/structured.py --model qwen2.5-coder-1.5b --threads 2 \\
        --server 'lsrv-plain=llama-server -m M.gguf --port {port} -t 2 -tb 2 -c 8192' \\
        --server 'lsrv-ngram-mod=llama-server ... --spec-type ngram-mod' \\
        --plain-of lsrv-ngram-mod=lsrv-plain --json rows.json

Servers and --plain-of as in agentic.py (draftless --spec and --no-spec are always started).
All servers are up together and take turns request by request. Reported per request and
server: decode tokens/s by the server's own timing (draftless's
`draftless.decode_tokens_per_second`, llama-server's `timings.predicted_per_second`), whether
the answer parses and follows the schema, and whether it equals its plain partner's; then
draftless --spec over each server, median and worst request.
"""

from __future__ import annotations

import argparse
import email
import json
import random
import statistics
import sys
import sysconfig
import tempfile
import time
from contextlib import ExitStack
from importlib import metadata
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agentic import pairs
from serve_common import draftless_command, response_row, running

CODE_SCHEMA = {
    "type": "object",
    "properties": {
        "module": {"type": "string"},
        "functions": {
            "type": "array",
            "maxItems": 6,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "signature": {"type": "string"},
                    "docstring_first_line": {"type": "string"},
                },
                "required": ["name", "signature", "docstring_first_line"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["module", "functions"],
    "additionalProperties": False,
}
CODE_ASK = (
    "Here is a Python module:\n\n```python\n{doc}\n```\n\nList the functions it defines "
    "(at most six, in order): for each, its name, its `def` line exactly as written, and the "
    "first line of its docstring exactly as written. Answer in JSON."
)
PROSE_SCHEMA = {
    "type": "object",
    "properties": {
        "package": {"type": "string"},
        "summary": {"type": "string"},
        "install_command": {"type": "string"},
        "first_paragraph": {"type": "string"},
    },
    "required": ["package", "summary", "install_command", "first_paragraph"],
    "additionalProperties": False,
}
PROSE_ASK = (
    "Here is a package's description:\n\n{doc}\n\nGive the package's name, a one-sentence "
    "summary, the command that installs it, and its first paragraph copied exactly. Answer "
    "in JSON."
)
MIN_CHARS, MAX_CHARS = 1500, 6000


def code_documents() -> list[tuple[str, str]]:
    """(module name, source) of the standard library's modules of a workable size."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for path in sorted(lib.glob("*.py")):
        text = path.read_text(errors="replace")
        if MIN_CHARS <= len(text) <= MAX_CHARS and text.count("\ndef ") >= 2:
            out.append((path.stem, text))
    return out


def prose_documents() -> list[tuple[str, str]]:
    """(package, long description) of the installed packages' METADATA of a workable size."""
    out = {}
    for dist in metadata.distributions():
        raw = dist.read_text("METADATA")
        if not raw:
            continue
        message = email.message_from_string(raw)
        body = message.get_payload()
        name = message.get("Name") or ""
        if isinstance(body, str) and MIN_CHARS <= len(body) <= MAX_CHARS and name:
            out[name.lower()] = body.strip()
    return sorted(out.items())


def tasks(seed: int, n: int) -> list[dict[str, Any]]:
    """n requests, half code and half prose, drawn by `seed`."""
    rng = random.Random(seed)
    code, prose = code_documents(), prose_documents()
    picked = rng.sample(code, min(len(code), n - n // 2)) + rng.sample(
        prose, min(len(prose), n // 2)
    )
    out = []
    for i, (name, doc) in enumerate(picked):
        is_code = i < n - n // 2
        ask, schema = (CODE_ASK, CODE_SCHEMA) if is_code else (PROSE_ASK, PROSE_SCHEMA)
        out.append(
            {
                "name": f"{'code' if is_code else 'prose'}:{name}",
                "schema": schema,
                "body": {
                    "messages": [{"role": "user", "content": ask.format(doc=doc)}],
                    "response_format": {
                        "type": "json_schema",
                        "json_schema": {"name": "extract", "schema": schema, "strict": True},
                    },
                    "temperature": 0,
                },
            }
        )
    return out


def follows(text: str, schema: dict[str, Any]) -> bool:
    """Whether `text` is a JSON object with exactly the schema's required keys, each of the
    schema's type (the two schemas here; their nested items checked the same way)."""
    try:
        value = json.loads(text)
    except ValueError:
        return False

    def fits(v: Any, s: dict[str, Any]) -> bool:
        kind = s.get("type")
        if kind == "string":
            return isinstance(v, str)
        if kind == "array":
            return isinstance(v, list) and all(fits(x, s["items"]) for x in v)
        if kind == "object":
            props = s["properties"]
            return (
                isinstance(v, dict)
                and set(v) == set(s["required"])
                and all(fits(v[k], props[k]) for k in v)
            )
        return True

    return fits(value, schema)


def one(http: httpx.Client, url: str, task: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    body = {**task["body"], "max_tokens": max_tokens}
    t0 = time.perf_counter()
    r = http.post(url + "/v1/chat/completions", json=body)
    wall = time.perf_counter() - t0
    r.raise_for_status()
    data = r.json()
    text = data["choices"][0]["message"]["content"] or ""
    return {
        "task": task["name"],
        **response_row(data, wall),
        "follows_schema": follows(text, task["schema"]),
        "text": text,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", action="append", default=[], metavar="NAME=COMMAND")
    ap.add_argument("--url", action="append", default=[], metavar="NAME=URL")
    ap.add_argument("--plain-of", action="append", default=[], metavar="NAME=PLAIN")
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0, help="which documents")
    ap.add_argument("--max-tokens", type=int, default=400)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--n-ctx", type=int, default=8192)
    ap.add_argument("--json", type=Path, help="write every row here")
    args = ap.parse_args()
    common = ("--model", args.model, "--threads", str(args.threads), "--n-ctx", str(args.n_ctx))
    servers = {
        "draftless-spec": draftless_command(*common),
        "draftless-plain": draftless_command(*common, "--no-spec"),
        **pairs(args.server, "--server"),
    }
    urls = pairs(args.url, "--url")
    plain_of = {"draftless-spec": "draftless-plain", **pairs(args.plain_of, "--plain-of")}
    work = tasks(args.seed, args.tasks)
    rows: dict[str, list[dict[str, Any]]] = {}
    logs = Path(tempfile.mkdtemp(prefix="structured-"))
    with ExitStack() as stack, httpx.Client(timeout=1800) as http:
        for name, command in servers.items():
            urls[name] = stack.enter_context(running(command, log=logs / f"{name}.log"))
        rows = {name: [] for name in urls}
        for task in work:  # lockstep: each server in turn, request by request
            for name, url in urls.items():
                rows[name].append(one(http, url, task, args.max_tokens))

    print(
        f"structured: {len(work)} extractions into a JSON schema (seed {args.seed}), greedy, "
        f"max_tokens {args.max_tokens}; decode tok/s by each server's own timing"
    )
    names = list(rows)
    print(f"{'task':<28}" + "".join(f"{n[:16]:>17}" for n in names))
    for i, task in enumerate(work):
        cells = []
        for name in names:
            r = rows[name][i]
            mark = "" if r["follows_schema"] else "!"
            cells.append(f"{(r['decode_tokens_per_second'] or 0):>16.1f}{mark or ' '}")
        print(f"{task['name'][:27]:<28}" + "".join(cells))
    comp = " ".join(str(r["completion_tokens"]) for r in rows["draftless-plain"])
    print(f"completion tokens (draftless plain): {comp}   (! = does not follow the schema)")
    for name in names:
        base = plain_of.get(name)
        drafted = sum(r["drafted"] or 0 for r in rows[name])
        accepted = sum(r["accepted"] or 0 for r in rows[name])
        same = (
            f"{sum(a['text'] == b['text'] for a, b in zip(rows[name], rows[base], strict=True))}"
            f"/{len(work)} equal to {base}"
            if base in rows
            else ""
        )
        valid = sum(r["follows_schema"] for r in rows[name])
        print(
            f"  {name}: {valid}/{len(work)} follow the schema; drafted {drafted}, accepted "
            f"{accepted}; {same}"
        )
    spec = rows["draftless-spec"]
    for name in names:
        if name == "draftless-spec":
            continue
        ratios = [
            a["decode_tokens_per_second"] / b["decode_tokens_per_second"]
            for a, b in zip(spec, rows[name], strict=True)
            if a["decode_tokens_per_second"] and b["decode_tokens_per_second"]
        ]
        if ratios:
            print(
                f"  draftless-spec over {name}: median {statistics.median(ratios):.2f}x, "
                f"worst {min(ratios):.2f}x ({len(ratios)} requests)"
            )
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)},
                                         "rows": rows}, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
