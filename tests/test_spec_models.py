"""SmolLM2 on both backends: greedy speculative output equals plain output, token for token.

The backends run with their defaults (llama.cpp: every core, in the configuration under which
its batch and single-step logits are bitwise equal; transformers: fp32). A divergence is
reported with its position and the plain run's top-2 logit margin there.
"""

from __future__ import annotations

import numpy as np
import pytest

from draftless.cli.demo import DEMO_PASSAGE
from draftless.decoder import SpecOptions, generate
from draftless.models.registry import hf_available, llamacpp_available, load_model
from draftless.sources import SpeculationIndex

pytestmark = pytest.mark.slow

CODE = '''def moving_average(values, window):
    """Return the moving average of values over a window."""
    if window <= 0:
        raise ValueError("window must be positive")
    result = []
    total = 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        if i >= window - 1:
            result.append(total / window)
    return result
'''
PROMPTS = {
    "raw-copy": ("raw", f"Original text:\n{DEMO_PASSAGE}\n\nThe same text, copied exactly:\n"),
    "chat-copy": (
        "chat",
        f"Repeat the following passage exactly, word for word:\n\n{DEMO_PASSAGE}",
    ),
    "code-edit": (
        "chat",
        f"Rename moving_average to rolling_mean and output the whole code:\n\n{CODE}",
    ),
    "free-form": ("chat", "Write a short story about a lighthouse keeper."),
}
BACKENDS = [
    pytest.param(
        "llamacpp", marks=pytest.mark.skipif(not llamacpp_available(), reason="no llama_cpp")
    ),
    pytest.param("hf", marks=pytest.mark.skipif(not hf_available(), reason="no torch")),
]


@pytest.fixture(scope="module", params=BACKENDS)
def model(request):
    m = load_model("smollm2", backend=request.param)
    yield m
    m.close()


def encode(model, kind: str, text: str) -> list[int]:
    if kind == "chat":
        return model.tokenizer.apply_chat_template([{"role": "user", "content": text}])
    return model.tokenizer.encode(text, add_special=True)


@pytest.mark.parametrize("name", list(PROMPTS))
def test_greedy_speculative_equals_plain(model, name: str) -> None:
    ids = encode(model, *PROMPTS[name])
    rows: dict[int, np.ndarray] = {}
    plain = generate(
        model, ids, 120, verify_row_hook=lambda pos, row: rows.__setitem__(pos, row.copy())
    )
    for options in (SpecOptions(), SpecOptions(gate=False)):
        spec = generate(model, ids, 120, source=SpeculationIndex(model.vocab_size), options=options)
        if spec.token_ids != plain.token_ids:
            # the first differing position; one output may be a prefix of the other
            pairs = enumerate(zip(spec.token_ids, plain.token_ids, strict=False))
            i = next((i for i, (a, b) in pairs if a != b), None)
            if i is None:
                pytest.fail(
                    f"{model.backend}/{name}: one output is a prefix of the other "
                    f"(plain {len(plain.token_ids)} tokens, spec {len(spec.token_ids)})"
                )
            row = rows[len(ids) + i]
            top2 = np.sort(row)[-2:]
            pytest.fail(
                f"{model.backend}/{name}: diverges at generated token {i} "
                f"(plain {plain.token_ids[i]}, spec {spec.token_ids[i]}); plain top-2 "
                f"logit margin there {top2[1] - top2[0]:.4f}"
            )
    if name != "free-form":
        assert spec.stats.accepted > 0  # the index really drafted and the model agreed


def test_threads_sharing_one_model_each_get_what_they_would_alone(model) -> None:
    """4 threads x 5 generations on one loaded model, greedy and seeded sampling, plain and
    speculative: each result equals the same generation run alone (it used to corrupt the
    cache and abort in ggml)."""
    import threading

    from draftless.sampling import SamplingOptions

    if model.backend != "llamacpp":
        pytest.skip("one backend is enough for the lock; transformers is slow here")
    prompts = [encode(model, *PROMPTS[name]) for name in PROMPTS]

    def job(i: int, j: int):
        sampling = SamplingOptions(temperature=0.8, top_p=0.95, seed=10 * i + j) if j % 2 else None
        source = SpeculationIndex(model.vocab_size) if (i + j) % 2 else None
        return prompts[i], sampling, source

    def run(i: int, j: int) -> list[int]:
        ids, sampling, source = job(i, j)
        options = SpecOptions(gate=False)
        return generate(model, ids, 12, sampling=sampling, source=source, options=options).token_ids

    alone = {(i, j): run(i, j) for i in range(4) for j in range(5)}
    results: dict[tuple[int, int], list[int]] = {}
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            for j in range(5):
                results[i, j] = run(i, j)
        except BaseException as err:  # reported below
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors
    assert results == alone
