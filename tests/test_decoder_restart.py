"""SpeculativeDecoder.restart: a generation that reuses the cache of a shared prefix (and the
gates of earlier requests) equals a fresh decoder's generation on the same prompt (the server's
KV reuse), on the exact numpy fake model: greedy and seeded sampling, plain and speculative,
prompts that extend the stream, share part of it, or nothing."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftless.decoder import SpecOptions, SpeculativeDecoder
from draftless.models.base import ContextFull
from draftless.sampling import SamplingOptions
from draftless.sources import SpeculationIndex
from fakes import InductionModel

VOCAB = 40
SAMPLINGS = [
    SamplingOptions(),  # greedy
    SamplingOptions(temperature=0.9, top_p=0.95, seed=7),
    SamplingOptions(temperature=1.2, top_k=10, frequency_penalty=0.3, seed=123),
]


def fresh_run(prompt: list[int], n: int, sampling: SamplingOptions, spec: bool):
    model = InductionModel(VOCAB, seed=3)
    source = SpeculationIndex(VOCAB) if spec else None
    dec = SpeculativeDecoder(
        model, sampling=sampling, source=source, options=SpecOptions(gate=False), clock=None
    )
    dec.append(prompt)
    return dec.generate(n), len(prompt) - 1  # every prompt row but the carried one prefilled


@given(
    first=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=30),
    second=st.lists(st.integers(0, VOCAB - 1), min_size=0, max_size=30),
    shared=st.integers(0, 80),
    how=st.sampled_from(range(len(SAMPLINGS))),
    spec=st.booleans(),
)
@settings(max_examples=120, deadline=None)
def test_a_restart_equals_a_fresh_decoder(first, second, shared, how, spec) -> None:
    sampling = SAMPLINGS[how]
    model = InductionModel(VOCAB, seed=3)
    dec = SpeculativeDecoder(
        model,
        sampling=SamplingOptions(temperature=0.7, seed=1),  # an earlier request, other options
        source=SpeculationIndex(VOCAB),
        options=SpecOptions(),  # gated: its gates outlive the restart
        clock=None,
    )
    dec.append(first)
    dec.generate(12)
    # The next prompt: a prefix of the stream (any length, possibly all of it) + new tokens.
    prompt = dec.history[: min(shared, len(dec.history))] + second
    if not prompt:
        prompt = [1]
    old = list(dec.history)
    kept = dec.restart(prompt, sampling=sampling, source=SpeculationIndex(VOCAB) if spec else None)
    common = 0
    while common < min(len(prompt) - 1, len(old) - 1) and prompt[common] == old[common]:
        common += 1
    assert kept == common  # every cached row of the shared prefix is kept, no more
    assert model.n_past == len(prompt) - 1
    reused = dec.generate(15)
    want, _ = fresh_run(prompt, 15, sampling, spec)
    assert reused.token_ids == want.token_ids
    assert reused.stop_reason == want.stop_reason
    if sampling.seed is not None:
        assert reused.seed == want.seed == sampling.seed
    assert reused.stats.committed == len(want.token_ids)  # fresh stats
    assert dec.history == prompt + want.token_ids
    assert model._tokens == dec.history[:-1]  # the cache holds the stream but the carried


def test_restart_keeps_exactly_the_common_prefix() -> None:
    model = InductionModel(VOCAB, seed=3)
    prefills: list[int] = []
    real_prefill = model.prefill

    def counting_prefill(ids):
        prefills.append(len(ids))
        real_prefill(ids)

    model.prefill = counting_prefill  # type: ignore[method-assign]
    dec = SpeculativeDecoder(model, clock=None)
    dec.append([5, 9, 2, 7, 4])  # the docstring's example: cache 5 9 2 7, carried 4
    prefills.clear()
    assert dec.restart([5, 9, 2, 7, 1, 3]) == 4
    assert prefills == [1]  # only [1] prefilled again
    assert model._tokens == [5, 9, 2, 7, 1] and dec.carried == 3
    # The next turn extends the whole stream (prompt + what was generated).
    out = dec.generate(6).token_ids
    stream = [5, 9, 2, 7, 1, 3, *out]
    prefills.clear()
    assert dec.restart([*stream, 8, 8]) == len(stream) - 1  # its last token was carried
    assert prefills == [2]  # that one and the first 8
    # Nothing shared: everything is prefilled again.
    prefills.clear()
    assert dec.restart([6, 6, 6]) == 0
    assert prefills == [2]


def test_restart_on_a_prompt_that_does_not_fit_leaves_an_empty_stream() -> None:
    class Small(InductionModel):
        def prefill(self, token_ids):
            if self.n_past + len(token_ids) > 10:
                raise ContextFull(self.n_past, len(token_ids), 10)
            super().prefill(token_ids)

    model = Small(VOCAB, seed=3)
    dec = SpeculativeDecoder(model, clock=None)
    dec.append([1, 2, 3])
    dec.generate(3)
    with pytest.raises(ContextFull):
        dec.restart(list(range(1, 20)))
    assert dec.history == [] and model.n_past == 0 and dec.carried is None
    dec.restart([1, 2, 3])  # and it serves the next request
    assert (
        dec.generate(3).token_ids == fresh_run([1, 2, 3], 3, SamplingOptions(), False)[0].token_ids
    )


def test_restart_rejects_empty_and_out_of_vocabulary_prompts() -> None:
    dec = SpeculativeDecoder(InductionModel(VOCAB), clock=None)
    with pytest.raises(ValueError, match="non-empty"):
        dec.restart([])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        dec.restart([1, VOCAB])
    assert np.array_equal(dec.history, [])


class Cancel(Exception):
    pass


@given(
    first=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=20),
    second=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=60),
    n_batch=st.integers(1, 9),
    cancel_at=st.integers(0, 12),
    how=st.sampled_from(range(len(SAMPLINGS))),
    spec=st.booleans(),
)
@settings(max_examples=120, deadline=None)
def test_a_prefill_cancelled_between_pieces_keeps_what_it_did(
    first, second, n_batch, cancel_at, how, spec
) -> None:
    """restart(between=...) prefills in the model's own n_batch pieces; a raise between two
    leaves the pieces done as the stream, and the next restart on the prompt reuses them and
    generates what a fresh decoder does."""
    model = InductionModel(VOCAB, seed=3)
    model.n_batch = n_batch  # type: ignore[attr-defined]
    pieces: list[tuple[int, int]] = []
    real_prefill = model.prefill

    def recording_prefill(ids):
        pieces.append((model.n_past, len(ids)))
        real_prefill(ids)

    model.prefill = recording_prefill  # type: ignore[method-assign]
    dec = SpeculativeDecoder(model, source=SpeculationIndex(VOCAB), clock=None)
    dec.append(first)
    prompt = list(dec.history) + second  # keeps len(first) - 1 rows
    calls = [0]

    def between() -> None:
        calls[0] += 1
        if calls[0] > cancel_at:
            raise Cancel

    source = SpeculationIndex(VOCAB) if spec else None
    pieces.clear()
    try:
        dec.restart(prompt, sampling=SAMPLINGS[how], source=source, between=between)
        cancelled = False
    except Cancel:
        cancelled = True
    keep = len(first) - 1
    # the pieces are where one prefill call would split: n_batch rows from the first one
    assert [start for start, _ in pieces] == list(
        range(keep, keep + n_batch * len(pieces), n_batch)
    )
    assert all(n == n_batch for _, n in pieces[:-1])
    done = keep + sum(n for _, n in pieces)
    assert cancelled == (done < len(prompt) - 1)
    assert model.n_past == done and model._tokens == prompt[:done]
    assert dec.history == prompt[: done + 1] and dec.carried == prompt[done]
    again = dec.restart(prompt, sampling=SAMPLINGS[how], source=source and SpeculationIndex(VOCAB))
    assert again == done  # nothing prefilled twice
    want, _ = fresh_run(prompt, 10, SAMPLINGS[how], spec)
    assert dec.generate(10).token_ids == want.token_ids
