"""The serve engine on the exact numpy fake model (no HTTP): the context's end is a "length"
finish equal to plain decoding's, cancellation stops a run between decoder steps and frees the
model, close() cancels what waits, and many jobs from many tasks are served one at a time,
each equal to its run alone."""

from __future__ import annotations

import asyncio
import string
import threading
import time
from typing import Any

import numpy as np
import pytest

pytest.importorskip("fastapi")

from draftless.decoder import SpecOptions
from draftless.models.base import ContextFull
from draftless.serve.engine import Cancelled, Engine, Finished, Job, ServerClosing, Started
from draftless.serve.protocol import ChatRequest, CompletionRequest
from fakes import InductionModel

VOCAB = 60


class Bounded(InductionModel):
    """The fake with a context size, refusing what would pass it (as llama.cpp does)."""

    def __init__(self, n_ctx: int, delay: float = 0.0, **kw: Any) -> None:
        super().__init__(VOCAB, seed=5, **kw)
        self.n_ctx = n_ctx
        self.delay = delay  # seconds per forward: a model slow enough to be interrupted
        self.gate = threading.Event()
        self.gate.set()  # cleared: every forward waits (a long-running request)

    def forward(self, token_ids):
        self.gate.wait(10)
        time.sleep(self.delay)
        if self.n_past + len(token_ids) > self.n_ctx:
            raise ContextFull(self.n_past, len(token_ids), self.n_ctx)
        return super().forward(token_ids)

    def prefill(self, token_ids):
        if self.n_past + len(token_ids) > self.n_ctx:
            raise ContextFull(self.n_past, len(token_ids), self.n_ctx)
        super().prefill(token_ids)


async def run(engine: Engine, params: Any, *, cancel_after: int | None = None) -> list[Any]:
    job = Job(params, asyncio.get_running_loop())
    engine.submit(job)
    items: list[Any] = []
    while True:
        item = await job.channel.get()
        items.append(item)
        if cancel_after is not None and sum(isinstance(i, str) for i in items) >= cancel_after:
            job.cancelled.set()
        if isinstance(item, Finished | BaseException):
            return items


def finished(items: list[Any]) -> Finished:
    assert isinstance(items[0], Started), items
    assert isinstance(items[-1], Finished), items[-1]
    return items[-1]


@pytest.mark.parametrize("temperature", [0.0, 0.9])
@pytest.mark.parametrize("n_ctx", [45, 63])  # where a draft would run past the end
def test_the_context_end_is_a_length_finish_equal_to_plain(temperature, n_ctx) -> None:
    params = CompletionRequest(
        prompt="abcabcabcabc abcabc", temperature=temperature, seed=3, stream=True
    )
    got = []
    for spec in (True, False):
        engine = Engine(Bounded(n_ctx=n_ctx), spec=spec)
        try:
            items = asyncio.run(run(engine, params))
        finally:
            engine.close()
        f = finished(items)
        assert f.finish_reason == "length"
        assert f.prompt_tokens - 1 + f.completion_tokens == n_ctx  # every row of the context
        assert "".join(i for i in items if isinstance(i, str)) == f.text  # streamed = whole
        got.append((f.text, f.completion_tokens))
    assert got[0] == got[1]


def test_a_prompt_past_the_context_is_refused_and_the_next_one_served() -> None:
    engine = Engine(Bounded(n_ctx=16), spec=True)
    try:
        items = asyncio.run(run(engine, CompletionRequest(prompt="x" * 40, max_tokens=2)))
        assert len(items) == 1 and items[0].code == "context_length_exceeded"
        ok = asyncio.run(run(engine, CompletionRequest(prompt="xy", max_tokens=2)))
        assert finished(ok).completion_tokens == 2
    finally:
        engine.close()


def test_cancelling_stops_between_steps_and_frees_the_model() -> None:
    engine = Engine(Bounded(n_ctx=4096, delay=0.005), spec=True)
    try:
        long = CompletionRequest(prompt="hello", max_tokens=3000, temperature=0, stream=True)
        items = asyncio.run(run(engine, long, cancel_after=3))
        assert isinstance(items[-1], Cancelled)
        assert engine.cancelled_runs == 1 and engine.cancelled_tokens < 200  # of 3000
        after = asyncio.run(run(engine, CompletionRequest(prompt="hello", max_tokens=5)))
        assert finished(after).completion_tokens == 5
    finally:
        engine.close()


def test_close_cancels_waiting_jobs_and_refuses_new_ones() -> None:
    model = Bounded(n_ctx=4096)
    engine = Engine(model, spec=False)

    async def scenario() -> list[Any]:
        model.gate.clear()  # the first job blocks inside a forward
        tasks = [
            asyncio.create_task(run(engine, CompletionRequest(prompt="ab", max_tokens=50)))
            for _ in range(3)
        ]
        await asyncio.sleep(0.2)
        closing = asyncio.create_task(asyncio.to_thread(engine.close))
        await asyncio.sleep(0.2)
        model.gate.set()
        await closing
        return [await t for t in tasks]

    results = asyncio.run(scenario())
    assert all(isinstance(r[-1], Cancelled) for r in results)  # the running one too
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(ServerClosing):
            engine.submit(Job(CompletionRequest(prompt="ab"), loop))
    finally:
        loop.close()


def test_many_tasks_are_served_one_at_a_time_each_as_if_alone() -> None:
    prompts = ["abcabd", "hello hello", "xyzxyz xy", "the cat the"]
    bodies: list[Any] = []
    for i, p in enumerate(prompts * 3):
        if i % 2:
            bodies.append(CompletionRequest(prompt=p, max_tokens=20, temperature=0.8, seed=i))
        else:
            msgs = [{"role": "user", "content": p}]
            bodies.append(ChatRequest(messages=msgs, max_tokens=20, temperature=0, stream=True))

    def alone(body: Any) -> str:
        engine = Engine(InductionModel(VOCAB, seed=5), spec=False)
        try:
            return finished(asyncio.run(run(engine, body))).text
        finally:
            engine.close()

    want = [alone(b) for b in bodies]
    engine = Engine(InductionModel(VOCAB, seed=5), spec=True)

    async def together() -> list[str]:
        results = await asyncio.gather(*(run(engine, b) for b in bodies))
        return [finished(r).text for r in results]

    try:
        assert asyncio.run(together()) == want
    finally:
        engine.close()


def test_server_and_request_references_are_members_of_every_request() -> None:
    doc = "the quick brown fox jumps over the lazy dog " * 3
    engine = Engine(InductionModel(VOCAB, seed=5), spec=True, references=[doc])
    try:
        first = CompletionRequest(prompt="the quick brown", max_tokens=8, temperature=0)
        asyncio.run(run(engine, first))
        body = CompletionRequest(
            prompt="say: the quick brown fox", max_tokens=8, temperature=0, references=["zz"]
        )
        f = finished(asyncio.run(run(engine, body)))
        names = [s["name"] for s in f.stats["sources"]]
        assert names == ["conversation", "server[0]", "history", "request[0]", "recycling"]
        server = next(s for s in f.stats["sources"] if s["name"] == "server[0]")
        assert server["drafted"] > 0  # the prompt ends inside the server's document
    finally:
        engine.close()


def test_edits_can_be_turned_off_and_their_counts_come_with_each_answer() -> None:
    """`serve --no-edits`: the same text, and no learner counts; with the learner the counts
    are in the answer's stats."""
    body = CompletionRequest(prompt="abcabd abcabd abc", max_tokens=24, temperature=0)
    answers = {}
    for edits in (True, False):
        engine = Engine(InductionModel(VOCAB, seed=5), spec=True, edits=edits)
        try:
            answers[edits] = finished(asyncio.run(run(engine, body)))
        finally:
            engine.close()
    assert answers[True].text == answers[False].text
    assert answers[False].stats["edits"] is None
    counts = answers[True].stats["edits"]
    assert set(counts) == {"learned", "in_use", "held", "broken"}
    assert all(isinstance(v, int) and v >= 0 for v in counts.values())


class Renamer(InductionModel):
    """Greedy decoding writes `text` (token ids) after a prompt of `prompt_len` tokens."""

    def __init__(self, prompt_len: int, text: list[int]) -> None:
        super().__init__(vocab=128, seed=0)
        self.prompt_len, self.text = prompt_len, text

    def row(self, prefix):
        k = min(len(prefix) - self.prompt_len, len(self.text) - 1)
        logits = np.zeros(self.vocab_size, dtype=np.float32)
        logits[self.text[k]] = 5.0
        return logits


def test_a_rename_in_an_answer_is_learned_and_counted_in_the_metrics() -> None:
    """The prompt is a text with `%%` at four places; the model writes it back with `&` there.
    The answer equals plain's, and the learner's substitution is in its stats and /metrics."""
    rng = np.random.default_rng(7)
    letters = string.ascii_letters + string.digits
    words = ["".join(rng.choice(list(letters), 30)) for _ in range(5)]
    prompt, edited = "%%".join(words), "&".join(words)
    ids = [b for b in prompt.encode()]
    text = [b for b in edited.encode()]
    body = CompletionRequest(prompt=prompt, max_tokens=len(text), temperature=0)
    answers = {}
    for spec in (False, True):
        engine = Engine(Renamer(len(ids), text), spec=spec, options=SpecOptions(gate=False))
        try:
            answers[spec] = finished(asyncio.run(run(engine, body)))
            metrics = engine.metrics
        finally:
            engine.close()
    assert answers[True].text == answers[False].text
    learned = answers[True].stats["edits"]["learned"]
    assert learned >= 1 and answers[True].stats["edits"]["held"] >= 1
    assert metrics.registry.get_sample_value("draftless_edits_learned_total") == learned


class SlowPrefill(Bounded):
    """Prefills in 4-token pieces (its n_batch), each taking a while: a long prompt on a CPU."""

    n_batch = 4

    def __init__(self) -> None:
        super().__init__(n_ctx=4096)
        self.pieces = 0
        self.started = threading.Event()

    def prefill(self, token_ids):
        assert len(token_ids) <= self.n_batch  # restart(between=...) hands over its pieces
        time.sleep(0.01)
        super().prefill(token_ids)
        self.pieces += 1
        self.started.set()


def test_a_request_cancelled_during_its_prefill_stops_there_and_its_rows_are_reused() -> None:
    model = SlowPrefill()
    engine = Engine(model, spec=True)
    prompt = string.ascii_lowercase * 20  # 520 tokens: 130 pieces, ~1.3 s
    try:

        async def cancelled_midway() -> list[Any]:
            job = Job(
                CompletionRequest(prompt=prompt, max_tokens=5, temperature=0),
                asyncio.get_running_loop(),
            )
            engine.submit(job)
            await asyncio.to_thread(model.started.wait, 10)
            job.cancelled.set()
            return [await job.channel.get()]

        items = asyncio.run(cancelled_midway())
        assert isinstance(items[0], Cancelled), items
        done = model.pieces
        assert 0 < done < 100 and engine.cancelled_prefills == 1  # stopped within a piece
        again = asyncio.run(
            run(engine, CompletionRequest(prompt=prompt, max_tokens=5, temperature=0))
        )
        assert isinstance(again[0], Started) and again[0].reused_tokens >= done * 4  # not redone
        alone = Engine(Bounded(n_ctx=4096), spec=True)
        try:
            want = finished(
                asyncio.run(
                    run(alone, CompletionRequest(prompt=prompt, max_tokens=5, temperature=0))
                )
            )
        finally:
            alone.close()
        assert finished(again).text == want.text
    finally:
        engine.close()
