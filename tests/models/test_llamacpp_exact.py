"""A verify row is the single-token row, bitwise, at every thread count (llama.cpp backend).

The decoder's losslessness on llama.cpp rests on this: the row a verify of k tokens computes
for position p must be the row plain decoding computes there, one token at a time, down to
the last bit, or a speculative stream can leave the plain one at a near-tie.

The configuration that makes it hold is models/llamacpp.py's EXACT_CONTEXT_PARAMS and
EXACT_MODEL_PARAMS (benchmarks/llamacpp_exact_rows.py measures the alternatives). Checked:
contexts up to 2,048, verify widths 1..32, on 1 and 2 threads, on SmolLM2 and, where its
file is present, on the real-size Qwen2.5-Coder-1.5B (registry name `qwen2.5-coder-1.5b`;
skipped while the name or the file is missing). Gemma 3 270M (Q4_K_M) stands in for the
K-quant kernels until then.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from model_skips import cached_model, skip_reason

pytest.importorskip("llama_cpp")

from draftless.models.base import ModelError
from draftless.models.llamacpp import LlamaCppModel, usable_cores
from draftless.models.registry import resolve

pytestmark = [pytest.mark.llamacpp, pytest.mark.slow]

CONTEXTS = (0, 255, 300, 1024, 2047 - 32)  # 300: past 256, where single steps split the KV
WIDTHS = (1, 2, 3, 8, 16, 32)


def _corpus(model: LlamaCppModel, n: int) -> list[int]:
    """n token ids of this repository's README and sources: ordinary text and code."""
    root = Path(__file__).resolve().parents[2]
    files = [root / "README.md", *sorted((root / "src" / "draftless").rglob("*.py"))]
    ids = model.tokenizer.encode("\n".join(f.read_text() for f in files))
    assert len(ids) >= n
    return ids[:n]


def _load(name: str, threads: int) -> Iterator[LlamaCppModel]:
    try:
        spec = resolve(name)
    except ModelError as err:
        pytest.skip(f"{name} is not here: {err}")
    if threads > usable_cores():
        pytest.skip(f"{threads} threads need {threads} usable cores, this process has fewer")
    model = LlamaCppModel.load(spec, n_ctx=2048, n_threads=threads)
    assert model.threads == threads and model.n_ctx == 2048
    yield model
    model.close()


@pytest.fixture(scope="module", params=[1, 2], ids=lambda t: f"threads={t}")
def smol(request: pytest.FixtureRequest) -> Iterator[LlamaCppModel]:
    yield from _load("smollm2", request.param)


@pytest.fixture(scope="module", params=[1, 2], ids=lambda t: f"threads={t}")
def gemma(request: pytest.FixtureRequest) -> Iterator[LlamaCppModel]:
    yield from _load("gemma3-270m", request.param)


@pytest.fixture(scope="module", params=[1, 2], ids=lambda t: f"threads={t}")
def qwen(request: pytest.FixtureRequest) -> Iterator[LlamaCppModel]:
    if cached_model("qwen2.5-coder-1.5b") is None:  # never fetch 1.1 GB in a test
        pytest.skip(skip_reason("qwen2.5-coder-1.5b"))
    yield from _load("qwen2.5-coder-1.5b", request.param)


def _assert_verify_rows_are_single_rows(
    model: LlamaCppModel, contexts: tuple[int, ...] = CONTEXTS, widths: tuple[int, ...] = WIDTHS
) -> None:
    ids = _corpus(model, max(contexts) + max(widths))
    differing = []
    for context in contexts:
        model.truncate(0)
        if context:
            model.prefill(ids[:context])
        for k in widths:
            stream = ids[context : context + k]
            verify = model.forward(stream)  # [k, vocab]: one forward of k
            model.truncate(context)
            single = np.concatenate([model.forward([t]) for t in stream])  # [k, vocab]
            model.truncate(context)
            if not np.array_equal(verify, single):
                diff = float(np.abs(verify - single).max())
                differing.append(f"context {context} width {k}: max |diff| {diff:.3g}")
    assert not differing, f"{model.name} threads={model.threads}: " + "; ".join(differing)


def test_smollm2_verify_rows_are_single_rows(smol: LlamaCppModel) -> None:
    _assert_verify_rows_are_single_rows(smol)


def test_k_quant_verify_rows_are_single_rows(gemma: LlamaCppModel) -> None:
    """Gemma 3 270M Q4_K_M: K-quant weights, whose repacked (4+ rows) and tiled (8+ rows)
    kernels are off. Fewer cells: its 262,144-wide rows make each single step slow."""
    _assert_verify_rows_are_single_rows(gemma, contexts=(0, 300, 1024), widths=(1, 4, 8, 16))


def test_real_size_verify_rows_are_single_rows(qwen: LlamaCppModel) -> None:
    _assert_verify_rows_are_single_rows(qwen)


def test_the_check_can_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    """llama.cpp's default configuration (flash attention splitting a single step's keys
    over the threads) fails the same check at 2 threads: the tests above are not vacuous."""
    if usable_cores() < 2:
        pytest.skip("needs 2 usable cores")
    from draftless.models import llamacpp

    monkeypatch.setattr(llamacpp, "EXACT_CONTEXT_PARAMS", {})
    monkeypatch.setattr(llamacpp, "EXACT_MODEL_PARAMS", {})
    for model in _load("smollm2", 2):
        with pytest.raises(AssertionError, match=r"max \|diff\|"):
            _assert_verify_rows_are_single_rows(model)
