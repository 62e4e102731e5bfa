"""Verify costs: the table C(k), its shipped defaults, measuring it, and where it is kept.

C(k) is what a forward of k new tokens costs in plain-step equivalents (C(1) = 1): the wall
time of one forward of k divided by that of one token, at the same context length, best of
several repetitions. `draftless probe` measures it (`measure`) and stores it per model file,
backend, thread count and backend build (`store`, `model_key`); `table_for(model)` returns the
stored table if there is one, else the backend's shipped default, and is what the decoder uses
unless it is given a table.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from draftless.errors import UserError
from draftless.models.base import Model, cache_dir

# Every width up to 32, then sparser to max_draft + 1: on llama.cpp a forward's cost climbs in
# stairs (row tiles: C(5) is ~0.7 steps above C(4), C(6) ~C(5)), which the powers of two hid,
# and interpolating between them priced a 4-token draft at 2.5 steps that costs 2.9.
PROBE_KS = (*range(1, 33), 40, 48, 56, 64, 65)


class CostTableError(UserError, ValueError):
    pass


@dataclass(frozen=True, slots=True)
class CostTable:
    """Verify cost of a forward of k new tokens, in plain-step equivalents (C(1) is 1)."""

    ks: tuple[int, ...]  # strictly increasing forward widths
    costs: tuple[float, ...]  # plain-step equivalents, one per k

    def __post_init__(self) -> None:
        if not self.ks:
            raise CostTableError("the cost table is empty: it needs at least one (k, cost) entry")
        if len(self.ks) != len(self.costs):
            raise CostTableError("cost table: ks and costs differ in length")
        if any(k < 1 for k in self.ks) or any(
            b <= a for a, b in zip(self.ks, self.ks[1:], strict=False)
        ):
            raise CostTableError(f"cost table: ks must be increasing integers >= 1, got {self.ks}")
        if any(not math.isfinite(c) or c <= 0 for c in self.costs):
            raise CostTableError(f"cost table: costs must be positive numbers, got {self.costs}")

    @classmethod
    def from_mapping(cls, table: Mapping[int, float]) -> CostTable:
        items = sorted((int(k), float(c)) for k, c in table.items())
        return cls(tuple(k for k, _ in items), tuple(c for _, c in items))

    def cost(self, k: int) -> float:
        """C(k), linearly interpolated; past the last entry, extended at the last slope
        (or proportionally when the table has one entry); never below 1."""
        ks, cs = self.ks, self.costs
        if k <= ks[0]:
            value = cs[0] if len(ks) > 1 or k == ks[0] else cs[0] * k / ks[0]
        elif k >= ks[-1]:
            if len(ks) == 1:
                value = cs[0] * k / ks[0]
            else:
                slope = max(0.0, (cs[-1] - cs[-2]) / (ks[-1] - ks[-2]))
                value = cs[-1] + slope * (k - ks[-1])
        else:
            i = next(i for i, kk in enumerate(ks) if kk >= k)
            k0, k1, c0, c1 = ks[i - 1], ks[i], cs[i - 1], cs[i]
            value = c0 + (c1 - c0) * (k - k0) / (k1 - k0)
        return max(1.0, value)

    def summary(self) -> str:
        """C(k) at the powers of two it holds, and how many widths it was measured at:
        "C(2)=1.52 C(4)=2.17 ... (37 widths)"."""
        pairs = list(zip(self.ks, self.costs, strict=True))
        shown = [(k, c) for k, c in pairs if k & (k - 1) == 0] or pairs
        text = " ".join(f"C({k})={c:.2f}" for k, c in shown)
        return text + (f" ({len(self.ks)} widths)" if len(shown) < len(self.ks) else "")

    def to_json(self) -> str:
        return json.dumps({"ks": list(self.ks), "costs": list(self.costs)})

    @classmethod
    def load(cls, path: Path) -> CostTable:
        data = json.loads(path.read_text())
        return cls(tuple(int(k) for k in data["ks"]), tuple(float(c) for c in data["costs"]))


# Shipped defaults, used until `draftless probe` stores a table for the model and machine.
# Measured with SmolLM2-135M on a 2-core x86 machine: transformers fp32, one thread; llama.cpp
# Q4_1 built for AVX2 with patches/llama.cpp (column kernels, tiled attention), both cores,
# `draftless probe --no-store` (llama.cpp: the median of three runs at every width; without
# patches 0003 and 0004 a forward of k cost ~0.55 k plain steps: C(8) 4.6, C(32) 16.4-17.4).
_LLAMACPP_KS = (*range(1, 34), 40, 48, 64, 65)
# fmt: off
_LLAMACPP_COSTS = (
    1, 1.52, 1.98, 2.17, 2.89, 2.98, 3.55, 3.68, 4.42, 4.55, 4.99, 5.37, 5.98, 6.02, 6.52,
    6.68, 7.92, 7.89, 8.46, 8.6, 9.12, 9.42, 9.77, 9.94, 10.56, 10.87, 11.58, 11.61, 11.99,
    12.35, 12.8, 13.15, 13.38, 15.78, 18.78, 24.69, 25.44,
)
# fmt: on
DEFAULT_COST_TABLES: dict[str, CostTable] = {
    "hf": CostTable((1, 2, 4, 8, 16, 32), (1.0, 1.47, 1.7, 2.0, 2.5, 3.7)),
    "llamacpp": CostTable(_LLAMACPP_KS, _LLAMACPP_COSTS),
}


def default_table(backend: str) -> CostTable:
    """The shipped table of a backend (transformers' for a backend it does not know)."""
    return DEFAULT_COST_TABLES.get(backend, DEFAULT_COST_TABLES["hf"])


# -- stored tables -------------------------------------------------------------------------


def model_key(model: Model) -> str:
    """Identifies what a table was measured on, for the cost-table cache: the backend, the
    model file, the threads, and the backend's kernels (`Model.kernels`: a new llama.cpp
    build changes what a verify costs, so its old table is not used)."""
    path = model.path
    ident = model.name
    if path is not None and os.path.exists(path):
        st = os.stat(path)
        ident = f"{os.path.abspath(path)}:{st.st_size}:{int(st.st_mtime)}"
    ident += f":threads={model.threads}:{model.kernels}"
    digest = hashlib.sha256(ident.encode()).hexdigest()[:16]
    base = Path(str(path or model.name)).name.replace(os.sep, "_")
    return f"{model.backend}-{base}-{digest}"


def table_path(model: Model) -> Path:
    return cache_dir() / "costs" / f"{model_key(model)}.json"


def stored_table(model: Model) -> CostTable | None:
    try:
        return CostTable.load(table_path(model))
    except (OSError, ValueError, KeyError):
        return None


def table_for(model: Model) -> tuple[CostTable, str]:
    """The table the decoder uses for `model`, and where it came from ("probe" or "default")."""
    stored = stored_table(model)
    if stored is not None:
        return stored, "probe"
    return default_table(model.backend), "default"


# -- measuring -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProbeResult:
    table: CostTable
    plain_seconds: float  # best time of one plain step
    context: int  # tokens in the cache while measuring
    reps: int


def measure(
    model: Model,
    *,
    ks: Sequence[int] = PROBE_KS,
    context: int = 256,
    reps: int = 5,
    clock: Callable[[], float] = time.perf_counter,
) -> ProbeResult:
    """Time forwards of k tokens at `context` tokens of cache, truncating back after each,
    each beside a plain step: C(k) is the median over `reps` rounds of a k-token forward's
    time over that of the plain step timed just before it, and each round runs every k
    (ascending, then descending in the next).

    The probe timed every rep of k = 1 first and every rep of k = 65 last, a minute or two
    later, so a machine whose speed moved in between (a boost clock decaying, a neighbour's
    job starting) went into the table's shape: every C(k) measured against a plain step of
    another moment. Here a pair shares its moment and the median drops a round a stall hit.
    What the shape is depends on the machine's state all the same: on a shared Zen 4 the
    2-thread 1.5B read C(16) 8.05 and C(64) 32.3 in one probe and 6.02 and 24.5 in another,
    and the first table cost a copy a third of its speedup (docs/bench/avx512/s35): probe
    when the machine is as it will be when it decodes. Each forward is timed after an
    untimed one of its own shape, as before: llama.cpp rebuilds its graph when the batch
    shape changes, and a table that counted those rebuilds was 12-15% dearer and cost
    SmolLM2's copies (README, "What the table does not count"); `LiveCosts` prices them
    apart. Twice the forwards of the old order, so a probe takes about twice as long."""
    rng = np.random.default_rng(0)
    vocab = model.vocab_size
    low = min(1000, vocab // 2)
    filler = rng.integers(low, min(vocab, low + 20000), size=context + max(ks)).tolist()
    model.truncate(0)
    model.prefill(filler[:context])

    def timed(k: int) -> float:
        t0 = clock()
        model.forward(filler[context : context + k])
        seconds = clock() - t0
        model.truncate(context)
        return seconds

    for _ in range(2):  # warm-up
        timed(8)
    wide = sorted(k for k in ks if k > 1)
    ratios: dict[int, list[float]] = {k: [] for k in wide}
    plains: list[float] = []
    for rep in range(reps):
        for k in wide if rep % 2 == 0 else wide[::-1]:
            timed(1)  # each forward after an untimed one of its own shape
            plain = timed(1)
            timed(k)
            plains.append(plain)
            ratios[k].append(timed(k) / plain if plain > 0 else 1.0)
    if not wide:  # only k = 1 asked for: the plain step alone
        timed(1)
        plains = [timed(1) for _ in range(reps)]
    model.truncate(0)
    table = CostTable(
        tuple(sorted(set(ks))),
        tuple(1.0 if k <= 1 else max(1.0, statistics.median(ratios[k])) for k in sorted(set(ks))),
    )
    return ProbeResult(table, statistics.median(plains), context, reps)


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
