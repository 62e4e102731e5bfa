"""SmolLM2 on both backends: greedy speculative output equals plain output, token for token.

The backends run with their defaults (llama.cpp: one thread, the setting under which its
batch and single-step logits are bitwise equal; transformers: fp32). A divergence is
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
