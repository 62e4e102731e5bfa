"""Test-wide settings.

torch runs single-threaded in tests: the models under test are tiny or small, and on a shared
2-core machine OpenMP's spinning worker threads made a tiny float64 model 10x slower under
load. Correctness never depends on the thread count; speed is measured by the benchmark.
"""

from __future__ import annotations

import importlib.util
import os

# llama.cpp and torch share one OpenMP runtime: make its idle threads sleep instead of spin
# (must be set before torch loads it). Spinning threads on a busy 2-core machine made a
# SmolLM2 token take 846 ms instead of 42 ms.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

if importlib.util.find_spec("torch") is not None:
    import torch

    torch.set_num_threads(int(os.environ.get("DRAFTLESS_TEST_THREADS", "1")))
