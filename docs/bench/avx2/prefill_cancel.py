"""Scratch (session 25): a client that gives up during a long prefill frees the server.

Start `draftless serve -m qwen2.5-coder-1.5b --port 8124 --n-ctx 8192`, then
    .venv/bin/python docs/bench/avx2/prefill_cancel.py
A 4,580-token prompt; the client times out after 4 s; the next (short) request's wait is timed;
then the long prompt is run whole, for how long its prefill takes.
"""
import time

import httpx

url = "http://127.0.0.1:8124"
long = "def f%d(x):\n    return x * %d\n\n"
prompt = "".join(long % (i, i) for i in range(300))
try:
    httpx.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": 5, "temperature": 0}, timeout=4)
except httpx.TimeoutException:
    print("client gave up after 4 s")
t0 = time.time()
r = httpx.post(url + "/v1/completions", json={"prompt": "def add(a, b):", "max_tokens": 8, "temperature": 0}, timeout=300)
print("next request answered in %.1f s:" % (time.time() - t0), r.status_code, r.json()["usage"])
m = httpx.get(url + "/metrics").text
print([line for line in m.splitlines() if line.startswith("draftless_cancelled_requests_total")])
t0 = time.time()
r = httpx.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": 5, "temperature": 0}, timeout=300)
print("the long prompt again: %.1f s" % (time.time() - t0), r.json()["usage"])
