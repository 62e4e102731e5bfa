"""The sampler pipeline on hand-made logits rows: each stage acts as defined."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftless.sampling import (
    OptionsError,
    SamplingOptions,
    apply_penalties,
    candidates,
    draw,
    make_rng,
    sample,
)


class CountingRng:
    """Stands in for np.random.Generator; returns scripted uniforms and counts draws."""

    def __init__(self, values: list[float]) -> None:
        self.values = list(values)
        self.draws = 0

    def random(self) -> float:
        self.draws += 1
        return self.values.pop(0)


ROW = np.array([1.0, 3.0, 2.0, -1.0, 0.5], dtype=np.float32)


def test_greedy_is_argmax_and_draws_nothing() -> None:
    rng = CountingRng([])
    assert sample(ROW, [], SamplingOptions(temperature=0.0), rng) == 1  # type: ignore[arg-type]
    assert sample(ROW, [], SamplingOptions(temperature=-1.0), rng) == 1  # type: ignore[arg-type]
    assert rng.draws == 0


def test_sampling_draws_exactly_once() -> None:
    rng = CountingRng([0.3, 0.9, 0.0])
    opts = SamplingOptions(temperature=0.8, top_k=3, repeat_penalty=1.3, presence_penalty=0.2)
    for _ in range(3):
        sample(ROW, [1, 2], opts, rng)  # type: ignore[arg-type]
    assert rng.draws == 3


def test_repeat_penalty_divides_positive_and_multiplies_negative() -> None:
    row = apply_penalties(ROW, [1, 3, 3], SamplingOptions(repeat_penalty=2.0))
    np.testing.assert_array_equal(row, [1.0, 1.5, 2.0, -2.0, 0.5])  # once per token, not per count


def test_frequency_and_presence_penalties() -> None:
    opts = SamplingOptions(frequency_penalty=0.5, presence_penalty=1.0)
    row = apply_penalties(ROW, [1, 1, 1, 4], opts)
    np.testing.assert_allclose(row, [1.0, 3.0 - 1.5 - 1.0, 2.0, -1.0, 0.5 - 0.5 - 1.0])


def test_penalty_window_only_sees_the_last_n_tokens() -> None:
    opts = SamplingOptions(presence_penalty=10.0, penalty_last_n=2)
    row = apply_penalties(ROW, [1, 0, 4], opts)
    assert row[1] == 3.0 and row[0] == -9.0 and row[4] == -9.5
    whole = apply_penalties(
        ROW, [1, 0, 4], SamplingOptions(presence_penalty=10.0, penalty_last_n=-1)
    )
    assert whole[1] == -7.0
    off = apply_penalties(ROW, [1, 0, 4], SamplingOptions(presence_penalty=10.0, penalty_last_n=0))
    np.testing.assert_array_equal(off, ROW)


def test_penalties_change_the_greedy_pick() -> None:
    opts = SamplingOptions(repeat_penalty=4.0)
    assert sample(ROW, [1], opts, make_rng(0)[0]) == 2


def test_logit_bias_moves_the_pick_and_comes_before_the_penalties() -> None:
    rng = CountingRng([])
    assert sample(ROW, [], SamplingOptions(), rng) == 1  # type: ignore[arg-type]
    banned = SamplingOptions(logit_bias=((1, -100.0),))
    assert sample(ROW, [], banned, rng) == 2  # type: ignore[arg-type]
    forced = SamplingOptions(logit_bias=((3, 100.0),))
    assert sample(ROW, [], forced, rng) == 3  # type: ignore[arg-type]
    assert rng.draws == 0  # still greedy
    # llama.cpp's order: the bias, then the penalties (repeat divides the biased logit)
    both = SamplingOptions(logit_bias=((1, 1.0),), repeat_penalty=2.0)
    row = apply_penalties(ROW, [1], both)
    assert row[1] == (3.0 + 1.0) / 2.0 and row[2] == 2.0
    assert ROW[1] == 3.0  # the model's row is untouched
    with pytest.raises(OptionsError, match="not a token id of this model"):
        apply_penalties(ROW, [], SamplingOptions(logit_bias=((5, 1.0),)))


@pytest.mark.parametrize(
    "bias", [((1, 100.5),), ((1, float("nan")),), ((-1, 1.0),), ((True, 1.0),), ((1,),)]
)
def test_bad_logit_bias_is_named(bias) -> None:
    with pytest.raises(OptionsError, match="logit_bias"):
        SamplingOptions(logit_bias=bias)


def test_top_k_keeps_the_k_best() -> None:
    ids, probs, _ = candidates(ROW.astype(np.float64), SamplingOptions(temperature=1.0, top_k=2))
    assert ids.tolist() == [1, 2]
    np.testing.assert_allclose(probs, [1.0, np.exp(-1.0)])


def test_top_p_keeps_the_smallest_nucleus() -> None:
    row = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    ids, _, _ = candidates(row, SamplingOptions(temperature=1.0, top_p=0.79))
    assert ids.tolist() == [0, 1]  # 0.5 + 0.3 reaches 0.79
    ids, _, _ = candidates(row, SamplingOptions(temperature=1.0, top_p=0.81))
    assert ids.tolist() == [0, 1, 2]
    ids, _, _ = candidates(row, SamplingOptions(temperature=1.0, top_p=0.4))
    assert ids.tolist() == [0]


def test_min_p_drops_tokens_below_a_fraction_of_the_best() -> None:
    row = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    ids, _, _ = candidates(row, SamplingOptions(temperature=1.0, min_p=0.3))
    assert ids.tolist() == [0, 1, 2]  # 0.15 / 0.5 = 0.3 is kept, 0.1 is not
    ids, _, _ = candidates(row, SamplingOptions(temperature=1.0, min_p=0.61))
    assert ids.tolist() == [0]


def test_temperature_sharpens_before_the_filters() -> None:
    row = np.log(np.array([0.5, 0.3, 0.2]))
    # at T = 0.25 the ratios to the best are (0.6)^4 = 0.13 and (0.4)^4 = 0.026
    ids, _, _ = candidates(row, SamplingOptions(temperature=0.25, min_p=0.2))
    assert ids.tolist() == [0]
    ids, _, _ = candidates(row, SamplingOptions(temperature=0.25, min_p=0.1))
    assert ids.tolist() == [0, 1]
    ids, _, _ = candidates(row, SamplingOptions(temperature=1.0, min_p=0.2))
    assert ids.tolist() == [0, 1, 2]


def test_inverse_cdf_picks_by_cumulative_mass() -> None:
    row = np.log(np.array([0.1, 0.6, 0.3], dtype=np.float64))
    opts = SamplingOptions(temperature=1.0)
    # candidates ordered best first: 1 (0.6), 2 (0.3), 0 (0.1)
    assert sample(row, [], opts, CountingRng([0.0])) == 1  # type: ignore[arg-type]
    assert sample(row, [], opts, CountingRng([0.59])) == 1  # type: ignore[arg-type]
    assert sample(row, [], opts, CountingRng([0.61])) == 2  # type: ignore[arg-type]
    assert sample(row, [], opts, CountingRng([0.95])) == 0  # type: ignore[arg-type]


def test_ties_break_by_token_id() -> None:
    row = np.zeros(6)
    ids, _, _ = candidates(row, SamplingOptions(temperature=1.0, top_k=3))
    assert ids.tolist() == [0, 1, 2]


def reference_draw(row: np.ndarray, options: SamplingOptions, u: float) -> int:
    """Inverse CDF over `candidates`, which sorts the whole row: the oracle of `draw`."""
    ids, probs, mass = candidates(row, options)
    pick = int(np.searchsorted(np.cumsum(probs), u * mass, side="right"))
    return int(ids[min(pick, len(ids) - 1)])


@settings(max_examples=300, deadline=None)
@given(
    vocab=st.integers(1, 6000),
    spread=st.sampled_from([0.01, 0.5, 3.0, 12.0]),  # flat ... peaked
    ties=st.booleans(),
    temperature=st.sampled_from([0.05, 0.7, 1.0, 2.5]),
    top_k=st.sampled_from([0, 1, 2, 50, 700, 10_000]),
    top_p=st.sampled_from([1.0, 0.999, 0.95, 0.5, 0.01]),
    min_p=st.sampled_from([0.0, 1e-6, 0.05, 0.5]),
    u=st.one_of(st.floats(0.0, 1.0, exclude_max=True), st.sampled_from([0.0, 0.999999])),
    seed=st.integers(0, 2**16),
)
def test_the_partial_sort_draws_what_the_full_sort_draws(
    vocab, spread, ties, temperature, top_k, top_p, min_p, u, seed
) -> None:
    """`sample` sorts only the head of a row; the draw is the same token as sorting all of
    it, bitwise, for flat rows (the draw reaches deep) and tied rows (the order by id)."""
    row = np.random.default_rng(seed).standard_normal(vocab) * spread
    if ties:
        row = np.round(row)  # many equal logits
    opts = SamplingOptions(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    assert draw(row, opts, u) == reference_draw(row, opts, u)


@pytest.mark.parametrize(
    "opts",
    [
        SamplingOptions(temperature=0.7),
        SamplingOptions(temperature=1.0, top_k=40),
        SamplingOptions(temperature=0.7, top_p=0.9),
        SamplingOptions(temperature=1.0, min_p=0.02),
        SamplingOptions(temperature=1.3, top_k=200, top_p=0.95, min_p=0.01),
    ],
    ids=["temperature", "top-k", "top-p", "min-p", "all"],
)
def test_draws_follow_the_kept_distribution(opts: SamplingOptions) -> None:
    """Uniforms on a fine grid land on each kept token in proportion to its probability
    among the kept ones, and never outside them (a wrong mass would pile on the last)."""
    row = np.random.default_rng(3).standard_normal(5000) * 4.0
    ids, probs, _ = candidates(row, opts)
    n = 4000
    picks = [draw(row, opts, (i + 0.5) / n) for i in range(n)]
    assert set(picks) <= set(ids.tolist())
    counts = np.bincount(picks, minlength=row.shape[0])[ids] / n
    np.testing.assert_allclose(counts, probs / probs.sum(), atol=1.5 / n)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), vocab=st.integers(2, 300))
def test_same_seed_same_stream(seed: int, vocab: int) -> None:
    logits = np.random.default_rng(vocab).normal(size=(20, vocab)).astype(np.float32)
    opts = SamplingOptions(
        temperature=0.9, top_k=10, top_p=0.95, min_p=0.01, repeat_penalty=1.1, seed=seed
    )

    def run() -> list[int]:
        rng, _ = make_rng(opts.seed)
        history: list[int] = []
        for row in logits:
            history.append(sample(row, history, opts, rng))
        return history

    first = run()
    assert first == run()
    assert all(0 <= t < vocab for t in first)


def test_sampled_frequencies_follow_the_distribution() -> None:
    p = np.array([0.5, 0.3, 0.2])
    rng, _ = make_rng(7)
    counts = np.bincount(
        [sample(np.log(p), [], SamplingOptions(temperature=1.0), rng) for _ in range(6000)],
        minlength=3,
    )
    np.testing.assert_allclose(counts / counts.sum(), p, atol=0.03)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"top_k": -1}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"min_p": -0.1}, "min_p"),
        ({"min_p": 2.0}, "min_p"),
        ({"repeat_penalty": 0.0}, "repeat_penalty"),
        ({"temperature": float("nan")}, "temperature"),
        ({"frequency_penalty": float("inf")}, "frequency_penalty"),
        ({"penalty_last_n": -2}, "penalty_last_n"),
        ({"seed": -5}, "seed"),
    ],
)
def test_invalid_options_name_the_option(kwargs: dict, name: str) -> None:
    with pytest.raises(OptionsError, match=name):
        SamplingOptions(**kwargs)
