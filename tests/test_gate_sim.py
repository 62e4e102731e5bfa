"""benchmarks/gate_sim.py replays the gate offline; its numbers are worth something only if a
replay decides exactly as the decoder does on the model itself, and its oracle is a ceiling."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from draftless import SpecOptions, SpeculativeDecoder
from draftless.costs import default_table
from draftless.sources.cascade import SpeculationIndex
from fakes import InductionModel

VOCAB = 24
_spec = importlib.util.spec_from_file_location(
    "gate_sim", Path(__file__).resolve().parents[1] / "benchmarks" / "gate_sim.py"
)
gate_sim = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gate_sim)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 50),
    prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=60),
    reference=st.lists(st.integers(0, VOCAB - 1), max_size=40),
    table=st.sampled_from(["llamacpp", "hf"]),
    n=st.integers(1, 120),
)
def test_replay_decides_as_the_decoder_and_the_oracle_bounds_it(seed, prompt, reference, table, n):
    costs = default_table(table)
    model = InductionModel(VOCAB, seed=seed, copy_strength=4.0)
    # Exact with the edit learner off: it counts a substitution per proposal, and a recording
    # proposes at every position (gate_sim's docstring).
    source = SpeculationIndex(VOCAB, edits=False)
    refs = [reference] if reference else []
    for ref in refs:
        source.add_reference(ref)
    dec = SpeculativeDecoder(
        model, source=source, options=SpecOptions(), cost_table=costs, clock=None
    )
    dec.append(prompt)
    real = dec.generate(n)

    entry = gate_sim.record_stream(
        InductionModel(VOCAB, seed=seed, copy_strength=4.0), prompt, refs, n, edits=False
    )
    assert entry["generated"] == real.token_ids  # greedy: the same stream, plain or not
    got = gate_sim.replay_one(entry, VOCAB, costs)
    s = real.stats
    assert (got["verifies"], got["drafted"], got["accepted"]) == (
        s.verify_steps,
        s.drafted,
        s.accepted,
    )
    assert (got["plain_steps"], got["shadow_checks"]) == (s.plain_steps, s.shadow_checks)
    assert got["draft_lengths"] == dict(s.draft_lengths)
    assert gate_sim.oracle_speedup(entry, costs) >= got["modeled_speedup"] - 1e-9
