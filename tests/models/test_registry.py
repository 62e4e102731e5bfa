"""The registry: names and paths -> model files, and the choice of backend."""

from __future__ import annotations

from pathlib import Path

import pytest

from draftless.models import registry
from draftless.models.base import ModelError, ModelSpec, cache_dir
from draftless.models.registry import pick_backend, resolve


def test_cache_dir_follows_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRAFTLESS_CACHE", str(tmp_path / "a"))
    assert cache_dir() == tmp_path / "a"
    monkeypatch.delenv("DRAFTLESS_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "draftless"


def test_a_gguf_path_and_a_model_directory(tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 60)
    assert resolve(str(gguf)) == ModelSpec(str(gguf), gguf, True)
    directory = tmp_path / "hf"
    directory.mkdir()
    with pytest.raises(ModelError, match=r"no config\.json"):
        resolve(str(directory))
    (directory / "config.json").write_text("{}")
    assert resolve(str(directory)) == ModelSpec(str(directory), directory, False)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("no-such-model", r"unknown model 'no-such-model': use one of .*smollm2"),
        ("./missing.gguf", "model file not found"),
        ("dir/missing", "model file not found"),
    ],
)
def test_unknown_names_and_missing_files_are_one_line_errors(name: str, message: str) -> None:
    with pytest.raises(ModelError, match=message) as info:
        resolve(name)
    assert "\n" not in str(info.value)


def test_a_file_that_is_not_gguf(tmp_path: Path) -> None:
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"PK\x03\x04 not a model")
    with pytest.raises(ModelError, match="not a GGUF file"):
        resolve(str(junk))


def test_backend_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    gguf, directory = ModelSpec("g", Path("g.gguf"), True), ModelSpec("d", Path("d"), False)
    monkeypatch.setattr(registry, "llamacpp_available", lambda: True)
    monkeypatch.setattr(registry, "hf_available", lambda: True)
    assert pick_backend(gguf, "auto") == "llamacpp"
    assert pick_backend(directory, "auto") == "hf"
    with pytest.raises(ModelError, match="needs a GGUF file"):
        pick_backend(directory, "llamacpp")
    with pytest.raises(ModelError, match="unknown backend"):
        pick_backend(gguf, "onnx")
    monkeypatch.setattr(registry, "llamacpp_available", lambda: False)
    assert pick_backend(gguf, "auto") == "hf"
    with pytest.raises(ModelError, match="needs llama-cpp-python"):
        pick_backend(gguf, "llamacpp")
    monkeypatch.setattr(registry, "hf_available", lambda: False)
    with pytest.raises(ModelError, match="no backend installed"):
        pick_backend(gguf, "auto")


def test_smollm2_comes_from_its_wheel() -> None:
    spec = resolve("smollm2")
    assert spec.is_gguf and spec.path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert spec.path.read_bytes()[:4] == b"GGUF"
