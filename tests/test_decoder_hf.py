"""The decoder on real transformers models: plain greedy equals `generate`, and the
losslessness contract holds on tiny float64 Llama / Qwen3 / Gemma 3 (8-token sliding window).

Rows of a verify batch and of single steps agree to ~1e-15 in float64 (GEMMs of different m
reassociate), which casts to identical float32 rows here; the row test asserts bitwise
equality of what the sampler saw, and would report the first differing position.
"""

from __future__ import annotations

import numpy as np
import pytest

from fakes import garbage_source, perfect_source, random_source

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from test_hf import KINDS, VOCAB, byte_tokenizer, hf_generate, tiny_model  # noqa: E402

from draftless.decoder import SpecOptions, generate  # noqa: E402
from draftless.models.hf import HFModel  # noqa: E402
from draftless.sampling import SamplingOptions  # noqa: E402
from draftless.sources import SpeculationIndex  # noqa: E402

pytestmark = pytest.mark.hf
ALWAYS = SpecOptions(gate=False)
SAMPLED = SamplingOptions(temperature=0.8, top_k=20, seed=7)
PENALISED = SamplingOptions(
    temperature=0.8,
    top_k=20,
    repeat_penalty=1.2,
    presence_penalty=0.3,
    frequency_penalty=0.2,
    seed=8,
)


@pytest.fixture(scope="module", params=KINDS)
def model(request) -> HFModel:
    return HFModel.from_model(
        tiny_model(request.param, seed=3), byte_tokenizer(), name=request.param
    )


def prompt(seed: int, n: int = 24) -> list[int]:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, 8).tolist()
    return (base * 3)[:n]  # repetitive, so the conversation index has something to match


def test_plain_greedy_equals_transformers_generate(model: HFModel) -> None:
    for seed in range(3):
        ids = prompt(seed)
        ours = generate(model, ids, 40, stop_ids=[]).token_ids
        theirs, _ = hf_generate(model.torch_model, ids, 40)
        assert ours == theirs


@pytest.mark.parametrize(
    "sampling", [SamplingOptions(), SAMPLED, PENALISED], ids=["greedy", "sampled", "penalised"]
)
def test_speculation_is_lossless_with_any_source(model: HFModel, sampling: SamplingOptions) -> None:
    ids = prompt(11)
    expected = generate(model, ids, 48, sampling=sampling, stop_ids=[]).token_ids
    reference = ids + expected
    for source in (
        perfect_source(reference),
        garbage_source(VOCAB),
        random_source(VOCAB),
        SpeculationIndex(VOCAB),
    ):
        got = generate(
            model, ids, 48, sampling=sampling, source=source, options=ALWAYS, stop_ids=[]
        )
        assert got.token_ids == expected, type(source).__name__
        assert model.n_past == len(ids) + len(expected) - 1


def test_rows_seen_by_the_sampler_equal_plain_rows(model: HFModel) -> None:
    ids = prompt(5)

    def run(source):
        rows: dict[int, np.ndarray] = {}
        result = generate(
            model,
            ids,
            40,
            sampling=PENALISED,
            source=source,
            options=ALWAYS,
            stop_ids=[],
            verify_row_hook=lambda pos, row: rows.__setitem__(pos, row.copy()),
        )
        return result.token_ids, rows

    plain_tokens, plain_rows = run(None)
    tokens, rows = run(perfect_source(ids + plain_tokens))
    assert tokens == plain_tokens and sorted(rows) == sorted(plain_rows)
    for pos in sorted(rows):
        np.testing.assert_array_equal(rows[pos], plain_rows[pos], err_msg=f"position {pos}")


def test_forced_gate_trips_do_not_change_the_stream(model: HFModel) -> None:
    from draftless.costs import CostTable
    from draftless.gate import GateOptions

    ids = prompt(2)
    expected = generate(model, ids, 120, sampling=SAMPLED, stop_ids=[]).token_ids
    gate_options = GateOptions(probe_steps=2)
    opts = SpecOptions(gate_options=gate_options)
    got = generate(
        model,
        ids,
        120,
        sampling=SAMPLED,
        source=garbage_source(VOCAB),
        options=opts,
        cost_table=CostTable((1, 2, 8), (1.0, 4.0, 8.0)),
        stop_ids=[],
        clock=None,  # the table alone, whatever this machine's load
    )
    assert got.token_ids == expected
    # so dear that the gate starts off; garbage never earns a verify
    assert got.stats.verify_steps == 0 and got.stats.shadow_checks > 50
