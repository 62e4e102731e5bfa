"""Measure the verify-cost table C(k) of a model on this machine, and store it.

C(k) is the wall time of one forward of k new tokens divided by that of one token, both at
the same context length, best of several repetitions (the least disturbed run). The decoder
then uses the stored table by default; the shipped per-backend table applies otherwise.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from draftless.gate import DEFAULT_COST_TABLES, CostTable
from draftless.models.base import Model
from draftless.models.base import cache_dir

PROBE_KS = (1, 2, 4, 8, 16, 32)


@dataclass(frozen=True, slots=True)
class ProbeResult:
    table: CostTable
    plain_seconds: float  # best time of one plain step
    context: int  # tokens in the cache while measuring
    reps: int


def model_key(model: Model) -> str:
    """Identifies (backend, model file) for the cost-table cache."""
    path = getattr(model, "path", None)
    ident = model.name
    if path is not None and os.path.exists(path):
        st = os.stat(path)
        ident = f"{os.path.abspath(path)}:{st.st_size}:{int(st.st_mtime)}"
    digest = hashlib.sha256(ident.encode()).hexdigest()[:16]
    base = Path(str(path or model.name)).name.replace(os.sep, "_")
    return f"{model.backend}-{base}-{digest}"


def table_path(model: Model) -> Path:
    return cache_dir() / "costs" / f"{model_key(model)}.json"


def stored_cost_table(model: Model) -> CostTable | None:
    path = table_path(model)
    try:
        return CostTable.load(path)
    except (OSError, ValueError, KeyError):
        return None


def cost_table_for(model: Model) -> tuple[CostTable, str]:
    """The table the decoder should use, and where it came from ("probe" or "default")."""
    stored = stored_cost_table(model)
    if stored is not None:
        return stored, "probe"
    return DEFAULT_COST_TABLES.get(model.backend, DEFAULT_COST_TABLES["hf"]), "default"


def measure(
    model: Model,
    *,
    ks: Sequence[int] = PROBE_KS,
    context: int = 256,
    reps: int = 5,
    on_progress: Callable[[int, float], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> ProbeResult:
    """Time forwards of k tokens at `context` tokens of cache, truncating back after each."""
    rng = np.random.default_rng(0)
    vocab = model.vocab_size
    low = min(1000, vocab // 2)
    filler = rng.integers(low, min(vocab, low + 20000), size=context + max(ks)).tolist()
    model.truncate(0)
    model.prefill(filler[:context])
    best: dict[int, float] = {}
    for _ in range(2):  # warm-up
        model.forward(filler[context : context + 8])
        model.truncate(context)
    for k in ks:
        times = []
        for _ in range(reps):
            t0 = clock()
            model.forward(filler[context : context + k])
            times.append(clock() - t0)
            model.truncate(context)
        best[k] = min(times)
        if on_progress is not None:
            on_progress(k, best[k])
    model.truncate(0)
    plain = best[ks[0]] if ks[0] == 1 else best[min(ks)]
    table = CostTable(tuple(ks), tuple(max(1.0, best[k] / plain) if k > 1 else 1.0 for k in ks))
    return ProbeResult(table, plain, context, reps)


def store(model: Model, result: ProbeResult) -> Path:
    path = table_path(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    data = json.loads(result.table.to_json())
    data.update(
        plain_seconds=result.plain_seconds,
        context=result.context,
        reps=result.reps,
        model=model.name,
        backend=model.backend,
    )
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)
    return path
