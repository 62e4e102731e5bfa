"""Scratch (session 26): an agent's write_file call after read_file, on the 1.5B (2 threads),
one fresh in-process server per request and arm (no cross-request history): speculation with
the JSON-escaped views of the messages (b9109ca's default), without them (the escaped view
switched off), and plain. Decode tok/s by the server, drafted, accepted, completion tokens,
finish; "same": the three replies (content and calls, ids aside) are equal.

    .venv/bin/python docs/bench/avx2/tool_escape_ab.py [MODEL]
"""
import sys, json, time
from pathlib import Path
ROOT = Path(__file__).resolve().parents[3]
for d in ("src", "tests", "benchmarks"):
    sys.path.insert(0, str(ROOT / d))
from draftless.models.registry import load_model
from draftless.serve import protocol
from serving import serve_model
import httpx
from agentic import FILE, EDITS
name = sys.argv[1] if len(sys.argv) > 1 else "qwen2.5-coder-1.5b"
model = load_model(name, backend="llamacpp", n_ctx=4096, n_threads=2)
TOOLS = [
 {"type": "function", "function": {"name": "read_file", "description": "Read a file", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
 {"type": "function", "function": {"name": "write_file", "description": "Write the whole content of a file", "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}}, "required": ["path", "content"]}}},
]
real = protocol.ChatRequest.escaped_contents
for edit in EDITS[:6]:
    msgs = [{"role": "system", "content": "You are a coding agent. Use the tools to edit files."},
            {"role": "user", "content": f"In shapes.py: {edit}"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": json.dumps({"path": "shapes.py"})}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": FILE}]
    out = {}
    for arm in ("escaped", "raw", "plain"):
        protocol.ChatRequest.escaped_contents = real if arm == "escaped" else (lambda self: [])
        srv = serve_model(model, spec=arm != "plain")
        r = httpx.post(srv.url + "/v1/chat/completions", json={"messages": msgs, "tools": TOOLS, "temperature": 0, "max_tokens": 300}, timeout=900).json()
        srv.stop()
        c = r["choices"][0]; d = r["draftless"]
        out[arm] = (d["decode_tokens_per_second"], d.get("drafted"), d.get("accepted"), r["usage"]["completion_tokens"], c["finish_reason"], json.dumps([c["message"]["content"], [(t["function"]["name"], t["function"]["arguments"]) for t in c["message"].get("tool_calls") or []]]), [(x["name"], x["accepted"]) for x in d["sources"] if x["accepted"]])
    same = len({v[-2] for v in out.values()}) == 1
    print(edit[:40], "same" if same else "DIFF", {k: v[:5] for k, v in out.items()}, out["escaped"][-1], flush=True)
