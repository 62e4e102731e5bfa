#!/usr/bin/env python3
"""A stand-in for the llama-server binary: the command line and HTTP API the bench peer uses.

Run as `fake_llama_server.py --port P ... ` (any llama-server arguments). It appends its argv to
$FAKE_LLAMA_SERVER_LOG (one JSON line per start), answers /health with 503 twice then 200, and
/completion with tokens derived from the prompt: [p + shift for p in prompt[:n_predict]], where
shift is 1, or 2 when started with --spec-type ngram-mod (so that configuration differs from
plain). Every request body is appended to the log too. $FAKE_LLAMA_SERVER_MODE:
  ok (default), die (exit 3 at once, after a log line), garbage (non-JSON completion),
  eos (the answer ends with token 2, which the test treats as a stop token, then more tokens)
"""

import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

argv = sys.argv[1:]
mode = os.environ.get("FAKE_LLAMA_SERVER_MODE", "ok")
log_path = os.environ["FAKE_LLAMA_SERVER_LOG"]


def log(record):
    with open(log_path, "a") as fh:
        fh.write(json.dumps(record) + "\n")


log({"argv": argv, "pid": os.getpid()})
if mode == "die":
    print("main: error: failed to load model 'nonsense.gguf'", file=sys.stderr, flush=True)
    sys.exit(3)
port = int(argv[argv.index("--port") + 1])
shift = 2 if "ngram-mod" in argv else 1
health_calls = 0


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _send(self, status, payload):
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        global health_calls
        if self.path != "/health":
            return self._send(404, {"error": "not found"})
        health_calls += 1
        if health_calls <= 2:
            return self._send(503, {"error": {"message": "Loading model"}})
        return self._send(200, {"status": "ok"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        log({"body": body, "pid": os.getpid()})
        if self.path != "/completion":
            return self._send(404, {"error": "not found"})
        if mode == "garbage":
            return self._send(200, b"<html>not json</html>")
        prompt = body["prompt"]
        tokens = [p + shift for p in prompt][: body["n_predict"]]
        if mode == "eos":
            tokens = [7, 2, 9, 9][: body["n_predict"]]
        n = len(tokens)
        timings = {
            "cache_n": 0,
            "prompt_n": len(prompt),
            "prompt_ms": 250.0,
            "prompt_per_token_ms": 250.0 / len(prompt),
            "prompt_per_second": len(prompt) / 0.25,
            "predicted_n": n,
            "predicted_ms": 100.0 * (n - 1),
            "predicted_per_token_ms": 100.0,
            "predicted_per_second": 10.0,
        }
        if "--spec-type" in argv:
            timings["draft_n"] = 6
            timings["draft_n_accepted"] = 2
        self._send(
            200,
            {
                "content": "irrelevant",
                "tokens": tokens,
                "stop": True,
                "stop_type": "limit",
                "timings": timings,
            },
        )


ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
