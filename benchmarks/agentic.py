"""Agentic benchmark: one session of successive code-edit requests on one file, per server.

Each request carries the current file and asks for one small change; the file in the reply
becomes the next request's file. Greedy, so every run is deterministic and a speculating
server's session must equal its plain partner's, request by request.

    PYTHONPATH=src python benchmarks/agentic.py                      # draftless spec vs plain
    PYTHONPATH=src python benchmarks/agentic.py \\
        --server 'plain=llama-server -m M.gguf --port {port} -t 1' \\
        --server 'ngram=llama-server -m M.gguf --port {port} -t 1 --spec-type ngram-mod' \\
        --plain-of ngram=plain
    PYTHONPATH=src python benchmarks/agentic.py --url mine=http://127.0.0.1:8000
    PYTHONPATH=src python benchmarks/agentic.py --tools     # the agent edits through tools

--tools: the request offers read_file and write_file, and its conversation already holds the
agent's read_file call and the file as that call's result (a tool message); the file in the
reply's write_file call becomes the next request's file (see `written`: a call the server
returned as text counts too, so every server goes on to the same next request). The model
writes the file inside a JSON string (newlines as \\n), which the prompt holds only as plain
text. llama-server needs `--jinja` to take tools.

--server NAME=COMMAND starts COMMAND ({port} is filled in) and stops it at the end;
--url NAME=URL drives a server that is already running; --plain-of NAME=PLAIN says which run
NAME's outputs must equal. Without --server/--url: draftless with and without --no-spec.
All servers are up together and take turns request by request (lockstep), so a shared
machine's changing load falls on every server alike; two requests never overlap.
Reported per server: total wall time, decode tokens/s per request
(the server's own timing: draftless's `draftless.decode_tokens_per_second`, llama-server's
`timings.predicted_per_second`), drafted/accepted, and whether each output equals its plain's.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_common import draftless_command, response_row, running

from draftless.serve.tools import parse as parse_calls

FILE = """import math
import os


def area(w, h):
    return w * h


def perimeter(w, h):
    return 2 * (w + h)


def diagonal(w, h):
    return math.sqrt(w * w + h * h)


def resize(w, h, scale=1.0):
    return w * scale, h * scale


def describe(w, h):
    return "Shape " + str(w) + " by " + str(h)


if __name__ == "__main__":
    print(describe(3, 4))
    print(area(3, 4), perimeter(3, 4), diagonal(3, 4))
"""

EDITS = [
    "Rename the function `area` to `rectangle_area` (and its call).",
    "Add a one-line docstring to `perimeter`.",
    "Change the default value of `scale` in `resize` from 1.0 to 2.0.",
    "Add type hints (float) to the parameters of `diagonal`.",
    "Remove the unused `import os`.",
    "Make `describe` return an f-string instead of concatenating strings.",
    'Change the word "Shape" to "Rectangle" in `describe`.',
    "Add a comment line above `resize` saying what it does.",
    "Add a function `square_area(side)` at the end of the functions that returns side * side.",
    "Print `square_area(5)` at the end of the main block.",
    "Rename the parameter `h` to `height` in `perimeter`.",
    "Add a one-line docstring to `diagonal`.",
]

SYSTEM = "You are a careful code editor. Reply with the complete updated file only."
BLOCK = re.compile(r"```(?:python)?\n(.*?)```", re.DOTALL)


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": about,
            "parameters": {
                "type": "object",
                "properties": {k: {"type": "string"} for k in keys},
                "required": list(keys),
            },
        },
    }
    for name, about, keys in (
        ("read_file", "Read a file", ("path",)),
        ("write_file", "Write the whole new content of a file", ("path", "content")),
    )
]
AGENT = "You are a coding agent. Use the tools to edit files."


def tool_request(code: str, change: str, max_tokens: int) -> dict[str, Any]:
    """An agent's request after it read the file: the call, its result, the tools."""
    read = {"name": "read_file", "arguments": json.dumps({"path": "shapes.py"})}
    return {
        "messages": [
            {"role": "system", "content": AGENT},
            {"role": "user", "content": f"In shapes.py: {change}"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "call_read", "type": "function", "function": read}],
            },
            {"role": "tool", "tool_call_id": "call_read", "content": code},
        ],
        "tools": TOOLS,
        "max_tokens": max_tokens,
        "temperature": 0,
    }


WRAPPER = re.compile(r"^(?:\s*</?tool_response>)+|(?:</?tool_response>\s*)+$")


def written(message: dict[str, Any]) -> str | None:
    """The file in the reply's write_file call, if it made one: the server's `tool_calls`,
    else the call in its text as draftless's parser reads it (so that a server that returns
    the call as text, as llama-server did on the 1.5B's calls, still goes on to the same next
    request). The 1.5B wraps the file in the template's <tool_response> tags; they are
    dropped, so the session stays one of edits to a Python file."""
    calls = [c.get("function") or {} for c in message.get("tool_calls") or ()]
    if not calls:
        found = parse_calls(message.get("content") or "", [t["function"]["name"] for t in TOOLS])
        calls = [{"name": c.name, "arguments": c.arguments} for c in found.calls]
    for function in calls:
        if function.get("name") == "write_file":
            try:
                content = json.loads(function.get("arguments") or "").get("content")
            except (ValueError, AttributeError):
                continue
            if isinstance(content, str):
                return WRAPPER.sub("", content).strip("\n") + "\n"
    return None


def reply_text(message: dict[str, Any]) -> str:
    """What a reply said, ids aside: its content and its calls (to compare with plain's)."""
    calls = [
        [c["function"]["name"], c["function"]["arguments"]] for c in message.get("tool_calls") or ()
    ]
    return json.dumps([message.get("content"), calls]) if calls else message.get("content") or ""


def edit_request(code: str, change: str, max_tokens: int) -> dict[str, Any]:
    user = (
        f"Here is a Python file:\n```python\n{code}```\n\nMake this change: {change}\n"
        "Reply with the whole updated file in one ```python code block."
    )
    return {
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }


def next_file(reply: str, previous: str) -> str:
    """The file in the reply (its code block, else the whole reply); the previous file if
    the reply holds nothing."""
    match = BLOCK.search(reply)
    code = match.group(1) if match else reply.strip() + "\n"
    return code if code.strip() else previous


def one_edit(
    http: httpx.Client, url: str, i: int, code: str, max_tokens: int, tools: bool = False
) -> dict[str, Any]:
    """Request i of a session on the current file `code`; its row (the reply in "text", and
    with tools the file it wrote in "file")."""
    ask = tool_request if tools else edit_request
    body = ask(code, EDITS[i % len(EDITS)], max_tokens)
    t0 = time.perf_counter()
    r = http.post(url + "/v1/chat/completions", json=body)
    wall = time.perf_counter() - t0
    r.raise_for_status()
    data = r.json()
    message = data["choices"][0]["message"]
    text = reply_text(message)
    return {
        "request": i,
        **response_row(data, wall),
        "text": text,
        "file": written(message) if tools else None,
        "server_calls": len(message.get("tool_calls") or ()),
    }


def sessions(
    urls: dict[str, str], n: int, max_tokens: int, tools: bool = False
) -> dict[str, list[dict[str, Any]]]:
    """Every server's session, in lockstep: request i goes to each server in turn before
    request i + 1, so a shared machine's changing load falls on all of them alike."""
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in urls}
    code = dict.fromkeys(urls, FILE)
    with httpx.Client(timeout=900) as http:
        for i in range(n):
            for name, url in urls.items():
                row = one_edit(http, url, i, code[name], max_tokens, tools)
                rows[name].append(row)
                if tools:
                    code[name] = row["file"] or code[name]
                else:
                    code[name] = next_file(row["text"], code[name])
    return rows


def pairs(values: list[str], what: str) -> dict[str, str]:
    out = {}
    for v in values:
        name, sep, rest = v.partition("=")
        if not sep or not name or not rest:
            raise SystemExit(f"agentic: {what} wants NAME=VALUE, got {v!r}")
        out[name] = rest
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", action="append", default=[], metavar="NAME=COMMAND")
    ap.add_argument("--url", action="append", default=[], metavar="NAME=URL")
    ap.add_argument("--plain-of", action="append", default=[], metavar="NAME=PLAIN")
    ap.add_argument("--requests", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=400)
    ap.add_argument("--model", default="smollm2", help="for the default draftless servers")
    ap.add_argument("--threads", type=int, default=1, help="for the default draftless servers")
    ap.add_argument("--json", type=Path, help="write every row here")
    ap.add_argument("--tools", action="store_true", help="edit through read/write_file tools")
    args = ap.parse_args()
    servers, urls, plain_of = (
        pairs(args.server, "--server"),
        pairs(args.url, "--url"),
        pairs(args.plain_of, "--plain-of"),
    )
    if not servers and not urls:
        common = ("--model", args.model, "--threads", str(args.threads), "--n-ctx", "4096")
        servers = {
            "draftless-plain": draftless_command(*common, "--no-spec"),
            "draftless-spec": draftless_command(*common),
        }
        plain_of = {"draftless-spec": "draftless-plain"}
    logs = Path(tempfile.mkdtemp(prefix="agentic-"))
    with ExitStack() as stack:  # every server up at once; they take turns, never overlap
        for name, command in servers.items():
            urls[name] = stack.enter_context(running(command, log=logs / f"{name}.log"))
        runs = sessions(urls, args.requests, args.max_tokens, args.tools)

    print(
        f"agentic: {args.requests} successive edits of one {len(FILE.splitlines())}-line file, "
        f"greedy, max_tokens {args.max_tokens}"
        + (", through read_file/write_file tool calls" if args.tools else "")
    )
    header = f"{'server':<18}{'wall s':>8}{'tok/s mean':>12}{'drafted':>9}{'accepted':>10}"
    print(header + f"{'acc %':>7}{'= plain':>10}")
    summary = {}
    for name, rows in runs.items():
        wall = sum(r["wall_seconds"] for r in rows)
        rates = [r["decode_tokens_per_second"] for r in rows if r["decode_tokens_per_second"]]
        drafted = sum(r["drafted"] or 0 for r in rows)
        accepted = sum(r["accepted"] or 0 for r in rows)
        plain = runs.get(plain_of.get(name, ""))
        if plain is not None:
            equal = sum(a["text"] == b["text"] for a, b in zip(rows, plain, strict=True))
            same = f"{equal}/{len(rows)}"
        else:
            same = "-"
        acc = f"{100 * accepted / drafted:.0f}" if drafted else "-"
        mean = sum(rates) / len(rates) if rates else float("nan")
        print(f"{name:<18}{wall:>8.1f}{mean:>12.1f}{drafted:>9}{accepted:>10}{acc:>7}{same:>10}")
        summary[name] = {"wall_seconds": wall, "equal_to_plain": same}
    names = list(runs)
    for name in names:
        base = plain_of.get(name)
        if base in runs:
            ratio = summary[base]["wall_seconds"] / summary[name]["wall_seconds"]
            print(f"  {name}: {ratio:.2f}x the wall time of {base}")
    print("per request (decode tok/s, server's own timing):")
    for name, rows in runs.items():
        cells = " ".join(f"{r['decode_tokens_per_second'] or 0:.0f}" for r in rows)
        print(f"  {name:<18}{cells}")
    comp = " ".join(str(r["completion_tokens"]) for r in next(iter(runs.values())))
    print(f"  completion tokens  {comp}")
    if args.tools:
        for name, rows in runs.items():
            wrote = sum(r["file"] is not None for r in rows)
            parsed = sum(r["server_calls"] > 0 for r in rows)
            print(
                f"  {name}: a write_file call in {wrote}/{len(rows)} replies; the server "
                f"returned tool_calls in {parsed}"
            )
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))
    print(f"logs: {logs}")
    failed = any(
        s["equal_to_plain"] not in ("-", f"{args.requests}/{args.requests}")
        for s in summary.values()
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
