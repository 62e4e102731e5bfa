"""The chat layer on exact numpy models: the committed stream across turns, stops, references,
interruption, and plain == speculative, turn after turn.

`ChatTokenizer` is a tiny ChatML tokenizer (greedy longest-match over a few multi-character
pieces, so a reply the model spells `l|l` re-encodes as `ll`: retokenization differs from
the committed tokens, as it does with real BPE). Its template renders text and tokenizes the
whole, as real templates do. `ScriptModel` replies with a scripted token list after each
`<|im_start|>assistant\\n`; `InductionModel` (fakes.py) improvises.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftless.chat import (
    ChatError,
    ContextFullError,
    Conversation,
    EmptyMessageError,
    SpeculationRequiredError,
    TurnGate,
)
from draftless.decoder import SpecOptions
from draftless.sampling import SamplingOptions
from draftless.sources.base import Draft
from fakes import InductionModel, ScriptedSource, garbage_source

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
EOT, IM_START, IM_END = 0, 1, 2
PIECES = (
    *SPECIALS,
    *" \nabcdefghijklmnopqrstuvwxyz.,!?:'ABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "ll", "he", "o w", "or", "the", "\n\n",
)  # fmt: skip
VOCAB = len(PIECES)
ID = {p: i for i, p in enumerate(PIECES)}
ALWAYS = SpecOptions(gate=False, max_draft=16)  # verify every draft: the chat layer under test


class ChatTokenizer:
    bos_token_id = None
    eos_token_ids = frozenset({IM_END, EOT})

    def __init__(self, rewrite_history: bool = False) -> None:
        self.rewrite_history = rewrite_history  # a template that changes earlier turns

    def encode(self, text: str, *, add_special: bool = False) -> list[int]:
        out, i = [], 0
        while i < len(text):
            best = max((p for p in PIECES if text.startswith(p, i)), key=len, default=None)
            if best is None:
                out.append(ID["?"])
                i += 1
            else:
                out.append(ID[best])
                i += len(best)
        return out

    def decode(self, token_ids: Sequence[int], *, skip_special: bool = False) -> str:
        return "".join(PIECES[t] for t in token_ids if not (skip_special and PIECES[t] in SPECIALS))

    def render(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool) -> str:
        text = ""
        if self.rewrite_history:
            text += f"<|im_start|>system\nturn {'i' * len(messages)}<|im_end|>\n"
        for m in messages:
            text += f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n"
        return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")

    def apply_chat_template(self, messages, *, add_generation_prompt=True, tools=None) -> list[int]:
        return self.encode(self.render(messages, add_generation_prompt))

    def is_special(self, token_id: int) -> bool:
        return PIECES[token_id] in SPECIALS


GEN_PROMPT = ChatTokenizer().encode("<|im_start|>assistant\n")


class ScriptModel(InductionModel):
    """Replies `replies[k]` (token ids) to the k-th user message, then <|im_end|>."""

    def __init__(self, replies: Sequence[Sequence[int]], *, end: int = IM_END) -> None:
        super().__init__(vocab=VOCAB)
        self.tokenizer = ChatTokenizer()  # type: ignore[assignment]
        self._eos = ChatTokenizer.eos_token_ids
        self.replies = [list(r) for r in replies]
        self.end = end

    def row(self, prefix: Sequence[int]) -> np.ndarray:
        g = len(GEN_PROMPT)
        starts = [
            i + g for i in range(len(prefix) - g + 1) if list(prefix[i : i + g]) == GEN_PROMPT
        ]
        logits = np.zeros(VOCAB, dtype=np.float32)
        if not starts:
            logits[ID["?"]] = 5.0
            return logits
        turn, k = len(starts) - 1, len(prefix) - starts[-1]
        reply = self.replies[turn % len(self.replies)]
        logits[reply[k] if k < len(reply) else self.end] = 5.0
        return logits


def chat_model(seed: int = 0) -> InductionModel:
    """An improvising model over the ChatML vocabulary (it ends turns only by length)."""
    model = InductionModel(vocab=VOCAB, seed=seed, copy_strength=4.0)
    model.tokenizer = ChatTokenizer()  # type: ignore[assignment]
    model._eos = ChatTokenizer.eos_token_ids
    return model


def ids(text: str) -> list[int]:
    return ChatTokenizer().encode(text)


def expected_stream(
    messages: Sequence[dict[str, str]], replies: Sequence[Sequence[int]]
) -> list[int]:
    """The oracle: the ChatML rendering with every assistant message replaced by the tokens
    the model committed for it (closed by <|im_end|> if the reply lacks it)."""
    out: list[int] = []
    assistant = iter(replies)
    for m in messages:
        if m["role"] == "assistant":
            reply = list(next(assistant))
            out += GEN_PROMPT + reply + ([] if reply[-1:] == [IM_END] else [IM_END]) + ids("\n")
        else:
            out += ids(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n")
    return out + GEN_PROMPT


def assert_consistent(conv: Conversation, replies: Sequence[Sequence[int]]) -> None:
    conv.check_integrity()
    history = list(conv.history)
    # the stream after the last reply = the rendering up to its generation prompt + the reply
    closed = expected_stream(conv.messages[:-1], replies[:-1]) + list(replies[-1])
    assert history == closed


# -- the stream across turns ---------------------------------------------------------------
def test_two_turns_commit_the_template_delta_and_keep_the_model_tokens() -> None:
    hello = [ID["he"], ID["l"], ID["l"], ID["o"], ID["!"]]  # re-encodes as he|ll|o|!
    model = ScriptModel([hello, ids("bye.")])
    conv = Conversation(model, system="Be brief.")
    first = conv.send("hi")
    assert first.text == "hello!" and first.stop_reason == "stop"
    assert first.token_ids == (*hello, IM_END)
    assert first.prompt_tokens == len(
        ids("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n")
    ) + len(GEN_PROMPT)
    second = conv.send("more")
    assert second.text == "bye."
    # the delta starts after the committed <|im_end|>: "\n", then the new user message
    assert second.prompt_tokens == len(ids("\n<|im_start|>user\nmore<|im_end|>\n")) + len(
        GEN_PROMPT
    )
    assert_consistent(conv, [first.token_ids, second.token_ids])
    # where retokenization differs: the template would re-encode the reply, the stream does not
    assert ids("hello!") != hello
    start = first.prompt_tokens
    assert list(conv.history)[start : start + len(hello)] == hello
    rendered = model.tokenizer.apply_chat_template(conv.messages, add_generation_prompt=False)
    assert rendered[start : start + 3] == ids("hello")  # the template spells it he|ll|o
    assert list(conv.history) != rendered[:-1]


def test_a_fresh_conversation_replaying_the_messages_commits_the_same_stream() -> None:
    texts = ["tell me a story", "and another one", "thanks"]
    sampled = SamplingOptions(temperature=0.9, top_k=12, seed=7)
    a = Conversation(chat_model(), sampling=sampled, max_new_tokens=30)
    b = Conversation(chat_model(), sampling=sampled, max_new_tokens=30)
    for t in texts:
        a.send(t)
    for t in texts:
        b.send(t)
    assert a.history == b.history and a.messages == b.messages
    a.reset()  # reset == a new conversation with the same arguments
    for t in texts:
        a.send(t)
    assert a.history == b.history


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingOptions(),
        SamplingOptions(temperature=0.8, top_k=20, seed=1234),
        SamplingOptions(temperature=0.8, repeat_penalty=1.3, frequency_penalty=0.4, seed=99),
    ],
    ids=["greedy", "sampled", "penalised"],
)
def test_speculative_chat_commits_the_plain_stream_turn_after_turn(
    sampling: SamplingOptions,
) -> None:
    texts = ["hello there", "say it again", "hello there", "once more"]
    plain = Conversation(chat_model(), sampling=sampling, max_new_tokens=40)
    spec = Conversation(
        chat_model(), sampling=sampling, speculation=True, spec_options=ALWAYS, max_new_tokens=40
    )
    spec.add_reference_text("hello there, general kenobi. say it again, say it again.")
    for t in texts:
        assert plain.send(t).token_ids == spec.send(t).token_ids
        assert plain.history == spec.history
        spec.check_integrity()  # cache, gate and the cascade's conversation SAM hold the stream
    assert spec.stats.verify_steps > 0 and spec.stats.accepted > 0


def test_speculation_with_an_adversarial_source_changes_nothing() -> None:
    texts = ["abc", "abc abc", "xyz"]
    plain = Conversation(chat_model(1), max_new_tokens=25)
    spec = Conversation(
        chat_model(1),
        speculation=True,
        spec_options=ALWAYS,
        max_new_tokens=25,
        index_factory=lambda: garbage_source(VOCAB),
    )
    for t in texts:
        assert plain.send(t).token_ids == spec.send(t).token_ids
    assert plain.history == spec.history
    source = spec.index
    assert isinstance(source, ScriptedSource) and source.stream == list(spec.history)


def test_a_template_that_rewrites_earlier_turns_rebuilds_the_stream_and_the_index() -> None:
    model = ScriptModel([ids("one."), ids("two.")])
    model.tokenizer = ChatTokenizer(rewrite_history=True)  # type: ignore[assignment]
    conv = Conversation(model, speculation=True, spec_options=ALWAYS)
    conv.send("a")
    assert conv.rebuilds == 0
    second = conv.send("b")
    assert conv.rebuilds == 1 and second.text == "two."
    conv.check_integrity()  # the index was rebuilt from the new stream
    # the stream is the new rendering (reply 1 re-encoded) plus the committed reply 2
    rendered = model.tokenizer.apply_chat_template(conv.messages[:-1], add_generation_prompt=True)
    assert list(conv.history) == rendered + list(second.token_ids)


# -- stops ---------------------------------------------------------------------------------
def test_extra_stop_ids_end_the_reply_inside_the_acceptance_loop() -> None:
    reply = ids("first line\nsecond line.")
    stop = ID["\n"]
    for speculation in (False, True):
        model = ScriptModel([reply])
        conv = Conversation(
            model, extra_stop_ids=[stop], speculation=speculation, spec_options=ALWAYS
        )
        if speculation:
            conv.add_reference(reply)  # drafts run straight through the stop
        r = conv.send("go")
        assert r.stop_reason == "stop" and r.token_ids == (*ids("first line"), stop)
        assert r.text == "first line"
        conv.check_integrity()
        # the next turn closes the reply with <|im_end|> and goes on
        r2 = conv.send("again")
        assert_consistent(conv, [r.token_ids, r2.token_ids])
        if speculation:
            assert conv.stats.accepted > 0


def test_a_stop_sequence_trims_the_reply_and_the_stream_in_plain_mode() -> None:
    reply = [ID["he"], ID["ll"], ID["o w"], ID["or"], ID["l"], ID["d"], ID["."]]  # "hello world."
    model = ScriptModel([reply, ids("ok.")])
    conv = Conversation(model, stop_sequences=[" wor"])
    pieces = list(conv.stream("go"))
    r = conv.last_reply
    assert r is not None and r.stop_reason == "stop_sequence"
    assert r.text == "hello" and "".join(pieces) == "hello"
    assert all(" " not in p for p in pieces)  # the held-back start of " wor" was never shown
    # "o w" straddles the cut: its "o" is re-encoded, the rest of the reply is gone
    assert r.token_ids == (ID["he"], ID["ll"], ID["o"])
    conv.check_integrity()
    r2 = conv.send("next")
    assert r2.text == "ok."
    assert_consistent(conv, [r.token_ids, r2.token_ids])


def test_a_stop_sequence_is_found_across_tokens_and_at_the_earliest_position() -> None:
    model = ScriptModel([ids("abc. xyz. tail")])
    conv = Conversation(model, stop_sequences=["xyz", ". "])
    r = conv.send("go")
    assert r.text == "abc" and r.token_ids == tuple(ids("abc"))


@pytest.mark.parametrize(
    "sampling",
    [SamplingOptions(), SamplingOptions(temperature=0.9, top_k=12, seed=5)],
    ids=["greedy", "sampled"],
)
def test_a_stop_sequence_with_speculation_commits_the_plain_stream(
    sampling: SamplingOptions, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A verify accepts tokens past the one that completes the stop sequence (the reference
    is the reply itself, so drafts run through it); the trim cuts them and, sampled, undoes
    their draws: the next turns go on as plain decoding's do."""
    alone = Conversation(chat_model(2), sampling=sampling, max_new_tokens=30)
    free = alone.send("tell me")
    text = free.text
    stop = text[len(text) // 2 : len(text) // 2 + 2]  # a stop in the middle of the reply
    assert stop.strip() and stop in text[: len(text) // 2 + 2]
    import draftless.chat as chat_module

    rewound: list[int] = []

    def spy(rng, draws: int) -> None:
        rewound.append(draws)
        chat_module.rewind.__wrapped__(rng, draws)  # type: ignore[attr-defined]

    spy.__wrapped__ = chat_module.rewind  # type: ignore[attr-defined]
    monkeypatch.setattr(chat_module, "rewind", spy)
    convs = []
    for speculation in (False, True):
        conv = Conversation(
            chat_model(2),
            sampling=sampling,
            speculation=speculation,
            spec_options=ALWAYS if speculation else None,
            stop_sequences=[stop],
            max_new_tokens=30,
        )
        if speculation:
            conv.add_reference(list(alone.history))  # the prompt too: drafts from token 1
        convs.append(conv)
    plain, spec = convs
    for message in ("tell me", "and again", "tell me"):
        a, b = plain.send(message), spec.send(message)
        assert (a.text, a.token_ids, a.stop_reason) == (b.text, b.token_ids, b.stop_reason)
        assert plain.history == spec.history
        spec.check_integrity()
    assert spec.last_reply is not None and spec.stats.accepted > 0
    if not sampling.greedy:  # the first reply's verify ran past the stop: draws were undone
        assert any(n > 0 for n in rewound), rewound


def test_rewind_undoes_exactly_the_last_draws() -> None:
    from draftless.sampling import make_rng, rewind

    rng, _ = make_rng(123)
    first = rng.random(7)
    rewind(rng, 3)
    assert np.array_equal(rng.random(3), first[4:])
    rewind(rng, 0)
    assert rng.random() != first[-1]
    with pytest.raises(TypeError, match="PCG64"):
        rewind(np.random.Generator(np.random.MT19937(1)), 1)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"stop_sequences": [""]}, "stop_sequences"),
        ({"extra_stop_ids": [VOCAB]}, "extra_stop_ids"),
        ({"extra_stop_ids": [-1]}, "extra_stop_ids"),
        ({"index_factory": lambda: garbage_source(VOCAB)}, "speculation"),
    ],
)
def test_bad_options_are_named(kwargs: dict, fragment: str) -> None:
    with pytest.raises(ChatError, match=fragment):
        Conversation(chat_model(), **kwargs)


def test_length_limit_and_the_context_size() -> None:
    model = ScriptModel([ids("a long reply that goes on.")])
    conv = Conversation(model, max_new_tokens=5)
    r = conv.send("go")
    assert r.stop_reason == "length" and len(r.token_ids) == 5
    r2 = conv.send("go on")  # the unfinished reply is closed with <|im_end|>
    assert_consistent(conv, [r.token_ids, r2.token_ids])

    small = ScriptModel([ids("a long reply that goes on.")])
    small.n_ctx = 40  # type: ignore[attr-defined]
    conv = Conversation(small)
    r = conv.send("go")
    assert r.stop_reason == "context" and len(conv.history) == 40 + 1  # + the carried token
    with pytest.raises(ContextFullError, match="full"):
        conv.send("and now a message that does not fit at all")
    conv.check_integrity()
    conv.reset()
    assert conv.send("go").text == r.text


# -- interruption --------------------------------------------------------------------------
@pytest.mark.parametrize("speculation", [False, True])
def test_the_interrupt_flag_ends_the_turn_between_steps_and_keeps_what_was_committed(
    speculation: bool,
) -> None:
    model = chat_model(3)
    conv = Conversation(model, speculation=speculation, spec_options=ALWAYS, max_new_tokens=50)
    polls = [0]

    def interrupt() -> bool:
        polls[0] += 1
        return polls[0] >= 3

    r = conv.send("start", interrupt=interrupt)
    assert r.stop_reason == "interrupted" and conv.stats.steps == 3
    assert 3 <= len(r.token_ids) < 50
    conv.check_integrity()
    r2 = conv.send("continue")
    assert r2.stop_reason == "length"
    assert_consistent(conv, [r.token_ids, r2.token_ids])


@pytest.mark.parametrize("speculation", [False, True])
def test_ctrl_c_inside_a_step_leaves_the_conversation_consistent(speculation: bool) -> None:
    def build() -> Conversation:
        return Conversation(
            chat_model(4), speculation=speculation, spec_options=ALWAYS, max_new_tokens=40
        )

    conv = build()
    conv.send("warm up")
    before = conv.stats.committed
    calls = [0]

    def forward_hook(_ids: list[int]) -> None:
        calls[0] += 1
        if calls[0] == 5:
            raise KeyboardInterrupt

    conv.model.on_forward = forward_hook  # type: ignore[attr-defined]
    with pytest.raises(KeyboardInterrupt):
        conv.send("this one gets interrupted")
    conv.model.on_forward = None  # type: ignore[attr-defined]
    partial = conv.last_reply
    assert partial is not None and partial.stop_reason == "interrupted"
    assert partial.stats.steps == 4  # the 5th forward never happened
    assert len(partial.token_ids) == conv.stats.committed - before
    conv.check_integrity()
    assert conv.messages[-1] == {"role": "assistant", "content": partial.text}
    conv.send("next")
    conv.check_integrity()
    # the same stream as a conversation cut at the same token by the flag
    twin = build()
    twin.send("warm up")
    start = twin.stats.committed
    twin.send(
        "this one gets interrupted",
        interrupt=lambda: twin.stats.committed - start >= len(partial.token_ids),
    )
    twin.send("next")
    assert twin.history == conv.history


def test_closing_the_stream_early_ends_the_turn() -> None:
    conv = Conversation(chat_model(5), max_new_tokens=30)
    stream = conv.stream("go")
    first = next(stream)
    assert first
    with pytest.raises(ChatError, match="streaming"):
        conv.send("not now")
    stream.close()
    r = conv.last_reply
    assert r is not None and r.stop_reason == "interrupted"
    conv.check_integrity()
    r2 = conv.send("go on")
    assert_consistent(conv, [r.token_ids, r2.token_ids])


def test_a_stream_never_started_changes_nothing() -> None:
    conv = Conversation(chat_model(), max_new_tokens=5)
    conv.stream("never consumed")
    assert conv.history == () and conv.turns == 0
    assert conv.send("go").stop_reason == "length"


# -- bad input -----------------------------------------------------------------------------
@pytest.mark.parametrize("text", ["", "   ", "\n\t"])
def test_an_empty_message_is_refused_and_changes_nothing(text: str) -> None:
    conv = Conversation(chat_model(), max_new_tokens=5)
    with pytest.raises(EmptyMessageError):
        conv.send(text)
    assert conv.history == () and conv.turns == 0 and conv.model.n_past == 0


def test_references_need_speculation_and_valid_ids() -> None:
    with pytest.raises(SpeculationRequiredError):
        Conversation(chat_model()).add_reference_text("some document")
    conv = Conversation(chat_model(), speculation=True)
    with pytest.raises(ChatError, match="outside the vocabulary"):
        conv.add_reference([1, VOCAB])
    with pytest.raises(ChatError, match="empty"):
        conv.add_reference_text("  \n")
    with pytest.raises(ChatError, match="empty"):
        conv.add_reference([])
    assert conv.references == ()


def test_the_cascade_refuses_a_ninth_reference() -> None:
    conv = Conversation(chat_model(), speculation=True)
    for i in range(8):
        assert conv.add_reference_text(f"document {i}") == i
    with pytest.raises(ValueError, match="at most 8"):
        conv.add_reference_text("one too many")
    assert len(conv.references) == 8


def test_a_reference_injected_mid_conversation_is_drafted_from_at_once() -> None:
    doc = "the quick brown fox jumps over the lazy dog."
    model = ScriptModel([ids("ok."), ids(doc)])
    conv = Conversation(model, speculation=True, spec_options=ALWAYS)
    conv.send("first")
    conv.add_reference_text("preamble. " + doc)  # tokenized with the model's tokenizer
    r = conv.send("now quote it")
    assert r.text == doc
    assert r.stats.members["reference[0]"].accepted > 10
    assert r.stats.committed / r.stats.steps > 3  # several tokens per forward
    conv.check_integrity()
    conv.reset()  # references survive a reset
    conv.send("first")
    assert conv.send("now quote it").text == doc
    assert len(conv.references) == 1


def test_the_model_cache_must_belong_to_the_conversation() -> None:
    model = chat_model()
    conv = Conversation(model, max_new_tokens=5)
    conv.send("go")
    model.truncate(0)
    with pytest.raises(RuntimeError, match="another user"):
        conv.send("again")


# -- the turn gate -------------------------------------------------------------------------
class RecordingIndex:
    wants_topk = True
    topk_member = None

    def __init__(self) -> None:
        self.stream: list[int] = []
        self.calls: list[tuple] = []

    def propose(self, budget: int) -> Draft:
        return Draft([9] * budget, "draft")

    def observe(self, committed) -> None:
        self.stream.extend(committed)

    def observe_topk(self, token_ids, topk_ids) -> None:
        self.calls.append(("topk", list(token_ids)))


def test_the_turn_gate_never_lets_the_index_learn_past_a_stop() -> None:
    index = RecordingIndex()
    gate = TurnGate(index, stop_ids=[2])
    gate.observe([7, 2, 8])  # between replies (a template delta): everything passes
    gate.start_reply()
    gate.observe_topk([8, 5, 2, 6], np.zeros((4, 8), dtype=np.int32))
    gate.observe([5, 2, 6, 6])
    assert index.stream == [7, 2, 8, 5, 2]
    assert ("topk", [8, 5]) in index.calls  # the row after the stop is not learned either
    assert gate.learned == 5 and gate.dropped == 2
    assert gate.propose(4) is None and not gate.wants_topk
    gate.observe([1])
    assert index.stream[-1] == 2
    gate.end_reply()
    assert gate.wants_topk
    assert gate.propose(2) == Draft([9, 9], "draft")


# -- property: any mix of turns, interrupts, resets and references keeps plain == spec ------
@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["send", "interrupt", "reset", "ref"]),
            st.text(alphabet="abc lo.", min_size=1, max_size=12).filter(str.strip),
            st.integers(1, 6),
        ),
        min_size=1,
        max_size=6,
    ),
    st.integers(0, 3),
)
def test_plain_and_speculative_conversations_agree_under_any_script(script, seed) -> None:
    sampling = SamplingOptions(temperature=0.7, top_k=10, seed=seed)
    plain = Conversation(chat_model(seed), sampling=sampling, max_new_tokens=12)
    spec = Conversation(
        chat_model(seed),
        sampling=sampling,
        speculation=True,
        spec_options=ALWAYS,
        max_new_tokens=12,
    )
    for op, text, n in script:
        if op == "reset":
            plain.reset()
            spec.reset()
        elif op == "ref":
            spec.add_reference_text(text * 3)
        else:
            polls = [0]

            def after_n_steps(polls=polls, n=n, op=op) -> bool:
                polls[0] += 1
                return op == "interrupt" and polls[0] >= n

            b = spec.send(text, interrupt=after_n_steps)
            goal = plain.stats.committed + len(b.token_ids)
            a = plain.send(text, interrupt=lambda goal=goal: plain.stats.committed >= goal)
            assert a.token_ids == b.token_ids
        assert plain.history == spec.history
        spec.check_integrity()
        plain.check_integrity()


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.booleans(),
            st.text(alphabet="abc lo.", min_size=1, max_size=12).filter(str.strip),
        ),
        min_size=1,
        max_size=5,
    ),
    st.lists(st.text(alphabet="abc lo.\n", min_size=1, max_size=3), min_size=1, max_size=2),
    st.integers(0, 3),
    st.booleans(),
)
def test_text_stops_keep_plain_and_speculative_conversations_equal(
    script, stops, seed, greedy
) -> None:
    sampling = SamplingOptions(temperature=0.0 if greedy else 0.8, top_k=10, seed=seed)
    plain = Conversation(
        chat_model(seed), sampling=sampling, stop_sequences=stops, max_new_tokens=16
    )
    spec = Conversation(
        chat_model(seed),
        sampling=sampling,
        speculation=True,
        spec_options=ALWAYS,
        stop_sequences=stops,
        max_new_tokens=16,
    )
    for foresight, text in script:
        a = plain.send(text)
        if foresight:  # the plain stream through this reply: drafts run past its stop
            spec.add_reference(list(plain.history))
        b = spec.send(text)
        assert (a.text, a.token_ids, a.stop_reason) == (b.text, b.token_ids, b.stop_reason)
        assert plain.history == spec.history
        spec.check_integrity()


# -- slow: SmolLM2, both backends --------------------------------------------------------------
def smollm2_model(backend: str):
    if backend == "llamacpp":
        from test_repl import smollm2_problem

        problem = smollm2_problem()  # a llama.cpp built for another CPU would kill pytest
        if problem:
            pytest.skip(problem)
    else:
        pytest.importorskip("transformers")
    from draftless.models.registry import load_model

    if backend == "llamacpp":  # one thread: two spinning threads crawl on a busy 2-core box
        return load_model("smollm2", backend=backend, n_threads=1)
    return load_model("smollm2", backend=backend)


@pytest.mark.slow
@pytest.mark.parametrize(
    "backend",
    [
        pytest.param("llamacpp", marks=pytest.mark.llamacpp),
        pytest.param("hf", marks=pytest.mark.hf),
    ],
)
def test_smollm2_two_turns_plain_equals_speculative_and_the_stream_is_the_template(
    backend: str,
) -> None:
    model = smollm2_model(backend)
    tok = model.tokenizer
    texts = ["Name three colours.", "Repeat your answer, then add one more colour."]
    n = 24 if backend == "llamacpp" else 12
    try:
        plain = Conversation(model, max_new_tokens=n)
        replies = [plain.send(t) for t in texts]
        plain.check_integrity()
        stream = plain.history

        spec = Conversation(model, speculation=True, max_new_tokens=n)
        spec.add_reference_text("Red, green and blue. Red, green, blue and yellow.")
        for t, r in zip(texts, replies, strict=True):
            assert spec.send(t).token_ids == r.token_ids  # lossless, turn after turn
            spec.check_integrity()
        assert spec.history == stream

        # The part that must hold: outside the assistant spans the stream is the template's
        # own rendering; inside them it is what the model committed (not a re-encoding).
        first = tok.apply_chat_template(spec.messages[:1], add_generation_prompt=True)
        g1 = list(replies[0].token_ids)
        assert list(stream[: len(first)]) == first
        assert list(stream[len(first) : len(first) + len(g1)]) == g1
        second = tok.apply_chat_template(spec.messages[:3], add_generation_prompt=True)
        tail = list(stream[len(first) + len(g1) : len(stream) - len(replies[1].token_ids)])
        assert tail == second[len(second) - len(tail) :]
        closes = [t for t in tail[:1] if t in model.eos_token_ids]  # <|im_end|> if g1 lacked it
        assert (g1[-1] in model.eos_token_ids) != bool(closes)
    finally:
        model.close()


def test_a_model_without_a_chat_template_is_refused_at_construction() -> None:
    class NoTemplate(ChatTokenizer):
        def apply_chat_template(self, messages, *, add_generation_prompt=True, tools=None):
            raise RuntimeError("no chat template in this model")

    model = chat_model()
    model.tokenizer = NoTemplate()  # type: ignore[assignment]
    with pytest.raises(ChatError, match="chat template failed: no chat template"):
        Conversation(model)
