"""Text stop sequences: the streaming matcher against a brute-force oracle, and `generate`'s
text path (the CLI's) ending where plain decoding ends, also when a verify runs past a stop."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftless.decoder import SpecOptions, SpeculativeDecoder
from draftless.sampling import SamplingOptions
from draftless.text import TextStops, generate_text, held_back, unescape
from fakes import InductionModel, garbage_source, perfect_source

ALPHABET = "ab\n."


def oracle(pieces: list[str], sequences: list[str]) -> tuple[str, bool]:
    """The text a reader checking after every piece keeps: up to the earliest stop sequence
    in the first prefix (at a piece boundary) that contains one."""
    text = ""
    for piece in pieces:
        text += piece
        hits = [i for s in sequences if (i := text.find(s)) >= 0]
        if hits:
            return text[: min(hits)], True
    return text, False


@settings(max_examples=200, deadline=None)
@given(
    pieces=st.lists(st.text(ALPHABET, max_size=4), max_size=12),
    sequences=st.lists(st.text(ALPHABET, min_size=1, max_size=3), min_size=1, max_size=3),
)
def test_text_stops_match_the_oracle_and_never_show_a_stop(pieces, sequences) -> None:
    stops = TextStops(sequences)
    shown = ""
    for piece in pieces:
        shown += stops.push(piece)
        # what is on screen never contains a stop sequence, nor the start of one that the
        # text so far could still complete
        assert not any(s in shown for s in sequences)
        if stops.cut is not None:
            break
        assert len(shown) == len(stops.text) - held_back(stops.text, sequences)
    shown += stops.finish()
    text, found = oracle(pieces, sequences)
    assert (stops.text, stops.cut is not None) == (text, found)
    assert shown == text


def test_text_stops_hold_back_a_possible_start_and_release_it() -> None:
    stops = TextStops(["\n\n"])
    assert stops.push("one\n") == "one"  # "\n" may start "\n\n"
    assert stops.push("two") == "\ntwo"
    assert stops.push("\n") == ""
    assert stops.push("\nthree") == "" and stops.cut == 7 and stops.text == "one\ntwo"
    with pytest.raises(RuntimeError):
        stops.push("more")


def test_bad_stop_sequences_and_escapes() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        TextStops(["ok", ""])
    assert unescape(r"a\nb\tc\\n") == "a\nb\tc\\n"


# -- generate_text on an exact numpy model -----------------------------------------------
VOCAB = 50
PROMPT = [1, 2, 3, 4, 5, 1, 2, 3]


def run(source=None, *, sequences=(), stop_ids=frozenset(), n=60, sampling=None, gate=False):
    model = InductionModel(VOCAB, seed=11)
    dec = SpeculativeDecoder(
        model,
        sampling=sampling or SamplingOptions(),
        source=source,
        options=SpecOptions(gate=gate),
        clock=None,
    )
    dec.append(PROMPT)
    shown: list[str] = []
    result = generate_text(dec, n, frozenset(stop_ids), list(sequences), shown.append)
    assert "".join(shown) == result.text  # what was printed is what is reported
    return result, dec


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_a_text_stop_ends_a_speculative_run_where_plain_ends(temperature: float) -> None:
    sampling = SamplingOptions(temperature=temperature, seed=4)
    full, _ = run(sampling=sampling)  # no stop: the whole plain text
    assert full.stop_reason == "length" and len(full.text) == 60
    overshoots = 0
    for start, length in [(7, 1), (20, 2), (33, 3), (50, 2)]:
        stop = full.text[start : start + length]
        cut = full.text.find(stop)
        plain, _ = run(sequences=[stop], sampling=sampling)
        # the oracle: plain stops at the first token whose text completes the sequence
        assert plain.stop_reason == "stop_sequence"
        assert plain.text == full.text[:cut]
        assert plain.token_ids == full.token_ids[: cut + len(stop)]
        for source in (perfect_source(PROMPT + full.token_ids), garbage_source(VOCAB)):
            spec, dec = run(source, sequences=[stop], sampling=sampling)
            assert (spec.token_ids, spec.text, spec.stop_reason) == (
                plain.token_ids,
                plain.text,
                plain.stop_reason,
            )
            overshoots += dec.stats.committed > len(spec.token_ids)
    assert overshoots > 0  # some verify did accept tokens past a stop: the case under test


def test_a_stop_id_ends_the_run_and_is_left_out_of_the_text() -> None:
    full, _ = run()
    stop = full.token_ids[12]
    first = full.token_ids.index(stop)
    for source in (None, perfect_source(PROMPT + full.token_ids)):
        r, _ = run(source, stop_ids={stop})
        assert r.stop_reason == "stop" and r.token_ids == full.token_ids[: first + 1]
        assert r.text == full.text[:first]


def test_on_token_counts_the_tokens_taken_as_text_before_their_text_shows() -> None:
    """The server streams each token's log probability with the text that follows it: a
    count that ran ahead of the text, or took a stop id (no text) in, would misplace them."""
    full, _ = run()
    stop_id = full.token_ids[12]
    stop_text = full.text[30:32]
    for stop_ids, sequences in (({stop_id}, ()), ((), (stop_text,)), ((), ())):
        model = InductionModel(VOCAB, seed=11)
        dec = SpeculativeDecoder(model, source=perfect_source(PROMPT + full.token_ids))
        dec.append(PROMPT)
        events: list[tuple[str, int]] = []
        result = generate_text(
            dec,
            60,
            frozenset(stop_ids),
            list(sequences),
            lambda piece, events=events: events.append(("text", len(piece))),
            on_token=lambda n, events=events: events.append(("token", n)),
        )
        counts = [n for kind, n in events if kind == "token"]
        texts = len(result.token_ids) - (result.stop_reason == "stop")
        assert counts == list(range(1, texts + 1))
        assert events[0][0] == "token"  # a count comes before the text it covers


def test_no_stop_found_keeps_the_whole_text_and_the_held_back_tail() -> None:
    full, _ = run()
    r, _ = run(perfect_source(PROMPT + full.token_ids), sequences=[full.text[-1] + "\u2603"])
    assert r.stop_reason == "length" and r.text == full.text
