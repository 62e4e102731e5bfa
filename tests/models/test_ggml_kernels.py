"""Our patch to llama.cpp's kernels (patches/llama.cpp/): K-quant dot products over several
activation columns at once, each column bitwise the one-column kernel's result.

The decoder's losslessness on llama.cpp needs a verify row to equal the single-token row to the
last bit (test_llamacpp_exact.py checks that on whole models). The patch makes a verify cheaper
by unpacking each weight row once for up to four columns; these tests call both kernels in the
installed wheel's libggml-cpu on random blocks and compare the bits, and check that set-up did
install the patched wheel.
"""

from __future__ import annotations

import ctypes
import platform
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

llama_cpp = pytest.importorskip("llama_cpp")

pytestmark = pytest.mark.llamacpp

QK_K = 256
# block sizes in bytes (ggml-common.h): q4_K = d, dmin (f16), scales[12], qs[128];
# q6_K = ql[128], qh[64], scales[16], d (f16); q8_K = d (f32), qs[256] (i8), bsums[16] (i16)
BLOCK = {"q4_K": 144, "q6_K": 210}
Q8K_BLOCK = 4 + QK_K + 2 * (QK_K // 16)
MAX_COLS = 4


def _has_avx2() -> bool:
    try:
        return " avx2 " in " " + Path("/proc/cpuinfo").read_text().split("flags", 1)[1] + " "
    except (OSError, IndexError):
        return False


needs_kernels = pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64") or not _has_avx2(),
    reason="the column kernels are compiled for x86 CPUs with AVX2 only",
)


def _ggml_cpu() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-cpu.so"))
    lib.ggml_cpu_init()  # fills the f16 -> f32 table the kernels read the block scales through
    return lib


def _functions(kind: str) -> tuple[ctypes._CFuncPtr, ctypes._CFuncPtr]:
    lib = _ggml_cpu()
    one = getattr(lib, f"ggml_vec_dot_{kind}_q8_K")
    one.restype = None
    one.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                    ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]  # fmt: skip
    cols = getattr(lib, f"ggml_vec_dot_{kind}_q8_K_cols")
    cols.restype = None
    cols.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                     ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]  # fmt: skip
    return one, cols


def _weights(kind: str, blocks: int, rng: np.random.Generator) -> np.ndarray:
    """Random blocks with finite f16 scales (random bytes could make NaN and inf)."""
    raw = rng.integers(0, 256, size=(blocks, BLOCK[kind]), dtype=np.uint8)
    scales = rng.uniform(-0.05, 0.05, size=(blocks, 2)).astype(np.float16).view(np.uint8)
    if kind == "q4_K":
        raw[:, 0:4] = scales.reshape(blocks, 4)  # d, dmin
    else:
        raw[:, 208:210] = scales[:, 0:2]  # d
    return np.ascontiguousarray(raw)


def _activations(blocks: int, rng: np.random.Generator) -> np.ndarray:
    out = np.zeros((blocks, Q8K_BLOCK), dtype=np.uint8)
    qs = rng.integers(-127, 128, size=(blocks, QK_K), dtype=np.int8)
    out[:, 0:4] = rng.uniform(0.001, 0.1, size=(blocks, 1)).astype(np.float32).view(np.uint8)
    out[:, 4 : 4 + QK_K] = qs.view(np.uint8)
    bsums = qs.reshape(blocks, 16, 16).astype(np.int16).sum(axis=2, dtype=np.int16)
    out[:, 4 + QK_K :] = bsums.view(np.uint8).reshape(blocks, 32)
    return out


@needs_kernels
def test_set_up_installed_the_patched_wheel() -> None:
    lib = _ggml_cpu()
    for kind in BLOCK:
        assert hasattr(lib, f"ggml_vec_dot_{kind}_q8_K_cols"), (
            f"libggml-cpu has no ggml_vec_dot_{kind}_q8_K_cols: the wheel was built without "
            "patches/llama.cpp (re-run make setup)"
        )


@needs_kernels
@settings(max_examples=60, deadline=None)
@given(
    kind=st.sampled_from(sorted(BLOCK)),
    blocks=st.integers(1, 8),
    ncols=st.integers(1, MAX_COLS),
    seed=st.integers(0, 2**32 - 1),
)
def test_every_column_is_bitwise_the_one_column_kernel(
    kind: str, blocks: int, ncols: int, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    one, cols = _functions(kind)
    x = _weights(kind, blocks, rng)
    ys = [_activations(blocks, rng) for _ in range(ncols)]
    n = blocks * QK_K
    expected = np.zeros(ncols, dtype=np.float32)
    for c, y in enumerate(ys):
        one(n, expected[c:].ctypes.data, 0, x.ctypes.data, 0, y.ctypes.data, 0, 1)
    got = np.full(ncols, np.nan, dtype=np.float32)
    pointers = (ctypes.c_void_p * ncols)(*(y.ctypes.data for y in ys))
    cols(n, got.ctypes.data, x.ctypes.data, pointers, ncols)
    assert np.isfinite(expected).all() and (expected != 0).all()
    assert got.view(np.uint32).tolist() == expected.view(np.uint32).tolist(), (got, expected)


@needs_kernels
def test_the_oracle_sees_a_wrong_column() -> None:
    """The comparison above can fail: a column fed another column's activations differs."""
    rng = np.random.default_rng(7)
    one, cols = _functions("q4_K")
    x = _weights("q4_K", 4, rng)
    ys = [_activations(4, rng) for _ in range(3)]
    expected = np.zeros(3, dtype=np.float32)
    for c, y in enumerate(ys):
        one(4 * QK_K, expected[c:].ctypes.data, 0, x.ctypes.data, 0, y.ctypes.data, 0, 1)
    got = np.zeros(3, dtype=np.float32)
    swapped = (ctypes.c_void_p * 3)(ys[0].ctypes.data, ys[2].ctypes.data, ys[1].ctypes.data)
    cols(4 * QK_K, got.ctypes.data, x.ctypes.data, swapped, 3)
    assert got[0] == expected[0] and got[1] != expected[1] and got[2] != expected[2]
