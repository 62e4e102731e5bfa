"""Verify costs: measuring C(k), storing it, and the decoder picking it up by default."""

from __future__ import annotations

import pytest

from draftless.costs import DEFAULT_COST_TABLES, measure, store, stored_table, table_for
from draftless.decoder import SpeculativeDecoder, generate
from fakes import InductionModel


class TimedModel(InductionModel):
    """On a fake clock, a forward of k tokens takes 1 + 0.5 (k - 1) units, so C(k) = 1 + 0.5
    (k - 1); every seventh forward is stalled (3x slower), and from the `slow_from`-th forward
    on the machine runs at half speed (a neighbour's job started): a probe must see through
    both."""

    backend = "llamacpp"

    def __init__(self, slow_from: int | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.now = 0.0
        self.calls = 0
        self.slow_from = slow_from

    def clock(self) -> float:
        return self.now

    def forward(self, token_ids):
        self.calls += 1
        units = 1 + 0.5 * (len(token_ids) - 1)
        if self.calls % 7 == 0:
            units *= 3.0
        if self.slow_from is not None and self.calls >= self.slow_from:
            units *= 2.0
        self.now += units
        return super().forward(token_ids)


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTLESS_CACHE", str(tmp_path))
    return tmp_path


def test_measure_recovers_the_cost_curve_and_leaves_the_cache_empty() -> None:
    model = TimedModel(vocab=3000)
    result = measure(model, ks=(1, 2, 4, 8), context=16, reps=3, clock=model.clock)
    assert result.table.ks == (1, 2, 4, 8)
    assert result.table.costs == (1.0, 1.5, 2.5, 4.5)
    assert result.plain_seconds == 1.0
    assert model.n_past == 0


@pytest.mark.parametrize("slow_from", [10, 20, 30, 45])
def test_measure_sees_through_a_machine_that_slows_down_mid_probe(slow_from: int) -> None:
    """The machine halves its speed part-way through the probe. Timing every rep of k = 1
    first and the widest last read C(4) as 5.0 for 2.5 (a table's shape matters: on a shared
    Zen 4 two probes of the 2-thread 1.5B read C(64) 32 and 24, and a copy made 1.39x on the
    first, 2.07x on the second); each k beside its own plain step reads the curve whatever
    the moment."""
    model = TimedModel(vocab=3000, slow_from=slow_from)
    result = measure(model, ks=(1, 2, 4, 8, 16), context=16, reps=5, clock=model.clock)
    assert result.table.costs == (1.0, 1.5, 2.5, 4.5, 8.5)
    assert model.n_past == 0


def test_stored_table_is_used_by_default_and_defaults_apply_otherwise(cache) -> None:
    model = TimedModel(vocab=3000)
    table, origin = table_for(model)
    assert origin == "default" and table == DEFAULT_COST_TABLES["llamacpp"]
    result = measure(model, ks=(1, 2, 4), context=8, reps=2, clock=model.clock)
    path = store(model, result)
    assert path.is_file() and path.is_relative_to(cache)
    assert stored_table(model) == result.table
    table, origin = table_for(model)
    assert origin == "probe" and table == result.table
    assert not list(path.parent.glob("*.tmp-*"))  # written atomically


def test_a_corrupt_stored_table_falls_back_to_the_default(cache) -> None:
    model = TimedModel(vocab=3000)
    path = store(model, measure(model, ks=(1, 2), context=8, reps=1, clock=model.clock))
    path.write_text("{not json")
    assert table_for(model) == (DEFAULT_COST_TABLES["llamacpp"], "default")


def test_the_library_uses_a_probed_table_exactly_as_the_cli_does(cache, monkeypatch) -> None:
    """`draftless.generate()` in a user's script consults the table `draftless probe` stored
    for this model, with no cost_table argument."""
    model = TimedModel(vocab=3000)
    assert SpeculativeDecoder(model).cost_table == DEFAULT_COST_TABLES["llamacpp"]
    result = measure(model, ks=(1, 2, 4), context=8, reps=2, clock=model.clock)
    store(model, result)
    assert SpeculativeDecoder(model).cost_table == result.table
    seen = []
    original = SpeculativeDecoder.__init__

    def spy(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        original(self, *args, **kwargs)
        seen.append(self.cost_table)

    monkeypatch.setattr(SpeculativeDecoder, "__init__", spy)
    generate(model, [1, 2, 3], 2)
    assert seen == [result.table]


def test_the_probe_prices_every_draft_the_gate_can_make_without_interpolating_short_ones() -> None:
    """llama.cpp's costs climb in stairs (C(5) well above C(4)); interpolating between powers
    of two hid them. Every width up to 32 is measured, and the widest verify the decoder makes
    (max_draft + 1) is measured rather than extrapolated."""
    from draftless.costs import PROBE_KS
    from draftless.decoder import SpecOptions

    assert set(range(1, 33)) <= set(PROBE_KS)
    assert max(PROBE_KS) >= SpecOptions().max_draft + 1
    table = DEFAULT_COST_TABLES["llamacpp"]
    assert set(range(1, 33)) <= set(table.ks) and table.ks[-1] >= SpecOptions().max_draft + 1


def test_a_table_summary_shows_its_powers_of_two_and_how_many_widths() -> None:
    from draftless.costs import CostTable

    table = CostTable((1, 2, 3, 4, 5), (1.0, 1.5, 2.0, 2.2, 2.9))
    assert table.summary() == "C(1)=1.00 C(2)=1.50 C(4)=2.20 (5 widths)"
    assert CostTable((3, 5), (2.0, 3.0)).summary() == "C(3)=2.00 C(5)=3.00"
    assert DEFAULT_COST_TABLES["hf"].summary().endswith("C(32)=3.70")


def test_a_table_is_kept_per_thread_count_and_per_build(cache) -> None:
    """A table measured at two threads, or on another llama.cpp build, prices nothing else:
    those change C(k) (a patched kernel halved some verifies), so they fall back to the
    default until probed."""
    model = TimedModel(vocab=3000)
    model.threads = 2
    model.kernels = "build A"
    result = measure(model, ks=(1, 2, 4), context=8, reps=1, clock=model.clock)
    store(model, result)
    assert table_for(model) == (result.table, "probe")
    model.threads = 1
    assert table_for(model)[1] == "default"
    model.threads, model.kernels = 2, "build B"
    assert table_for(model)[1] == "default"
    model.kernels = "build A"
    assert table_for(model) == (result.table, "probe")
