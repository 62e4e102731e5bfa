"""Log probabilities from the decoder's rows: against the model's own rows, and unchanged by
speculation (the rows a lossless decoder samples from are plain decoding's)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftless.decoder import SpecOptions, SpeculativeDecoder
from draftless.logprobs import FLOOR, LogprobRecorder, TokenLogprob, log_softmax_at, top_ids
from draftless.sampling import SamplingOptions
from fakes import InductionModel, garbage_source, perfect_source, random_source

VOCAB = 40
PROMPT = [3, 7, 9, 3, 7, 9, 1, 2, 3, 7]
SAMPLINGS = {
    "greedy": SamplingOptions(),
    "sampled": SamplingOptions(temperature=0.8, top_k=20, seed=1234),
    "penalised": SamplingOptions(
        temperature=0.8, top_k=20, repeat_penalty=1.3, presence_penalty=0.3, seed=99
    ),
}
ALWAYS = SpecOptions(gate=False)  # verify every draft


def record(model, sampling, source=None, top=3, n=60) -> tuple[list[int], list[TokenLogprob]]:
    model.truncate(0)
    dec = SpeculativeDecoder(model, sampling=sampling, source=source, options=ALWAYS)
    recorder = LogprobRecorder(dec, top)
    dec.append(PROMPT)
    tokens = dec.generate(n).token_ids
    entries = recorder.entries(len(PROMPT))
    recorder.close()
    assert dec.hook is None
    return tokens, entries


def oracle(model: InductionModel, tokens: list[int], top: int) -> list[TokenLogprob]:
    """Straight from the model: the log-softmax of the row after each prefix, in float64."""
    out = []
    for i, token in enumerate(tokens):
        row = model.row(PROMPT + tokens[:i]).astype(np.float64)  # [vocab]
        lse = math.log(np.exp(row - row.max()).sum()) + row.max()
        order = sorted(range(VOCAB), key=lambda j: (-row[j], j))[:top]
        out.append(
            TokenLogprob(
                token, float(row[token] - lse), tuple((j, float(row[j] - lse)) for j in order)
            )
        )
    return out


def close_to(a: list[TokenLogprob], b: list[TokenLogprob]) -> None:
    assert [e.token_id for e in a] == [e.token_id for e in b]
    for x, y in zip(a, b, strict=True):
        assert x.logprob == pytest.approx(y.logprob, abs=1e-9)
        assert [i for i, _ in x.top] == [i for i, _ in y.top]
        assert [v for _, v in x.top] == pytest.approx([v for _, v in y.top], abs=1e-9)


@pytest.mark.parametrize("kind", ["plain", "perfect", "garbage"])
@pytest.mark.parametrize("name", list(SAMPLINGS))
def test_logprobs_are_the_models_and_speculation_changes_none(kind: str, name: str) -> None:
    model = InductionModel(VOCAB, seed=5)
    sampling = SAMPLINGS[name]
    plain_tokens, plain_entries = record(model, sampling)
    source = {
        "plain": None,
        "perfect": perfect_source(PROMPT + plain_tokens),
        "garbage": garbage_source(VOCAB),
    }[kind]
    tokens, entries = record(model, sampling, source)
    assert tokens == plain_tokens
    assert entries == plain_entries  # bitwise: the same rows
    close_to(entries, oracle(model, tokens, 3))
    if name == "greedy":  # the chosen token is the row's best
        assert all(e.top[0][0] == e.token_id for e in entries)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10**6), st.integers(0, 5), st.integers(1, 40))
def test_random_drafts_leave_every_logprob_as_plain(source_seed: int, top: int, n: int) -> None:
    model = InductionModel(VOCAB, seed=2)
    sampling = SAMPLINGS["sampled"]
    expected = record(model, sampling, top=top, n=n)
    got = record(model, sampling, random_source(VOCAB, seed=source_seed), top=top, n=n)
    assert got == expected


def test_top_ids_are_best_first_with_ties_in_id_order() -> None:
    row = np.array([0.5, 2.0, 2.0, -1.0, 2.0], dtype=np.float32)
    assert top_ids(row, 3).tolist() == [1, 2, 4]
    assert top_ids(row, 10).tolist() == [1, 2, 4, 0, 3]
    assert top_ids(row, 0).tolist() == []


def test_a_token_with_no_mass_reports_the_floor() -> None:
    model = InductionModel(VOCAB, seed=3)
    model.truncate(0)
    dec = SpeculativeDecoder(model, options=ALWAYS)
    recorder = LogprobRecorder(dec, top=3)
    row = np.full(VOCAB, -np.inf, dtype=np.float32)
    row[4] = 1.0
    dec.history = [4, 9]
    recorder(1, row)  # position 1 holds 9, which the row gives no mass
    (entry,) = recorder.entries(1, 2)
    assert entry.logprob == FLOOR and entry.top[0] == (4, 0.0)
    assert all(v == FLOOR for _, v in entry.top[1:])
    assert log_softmax_at(row, np.array([4])).tolist() == [0.0]


def test_bad_tops_and_missing_rows_are_refused() -> None:
    model = InductionModel(VOCAB, seed=3)
    dec = SpeculativeDecoder(model, options=ALWAYS)
    with pytest.raises(ValueError, match="top must be in"):
        LogprobRecorder(dec, 21)
    recorder = LogprobRecorder(dec, 0)
    dec.append(PROMPT)
    with pytest.raises(RuntimeError, match="no row was recorded for position 0"):
        recorder.entries(0, 1)  # the prompt was prefilled, never sampled
