"""Our patches to llama.cpp's kernels (patches/llama.cpp/): quantised dot products over several
activation columns at once, each column bitwise the one-column kernel's result.

The decoder's losslessness on llama.cpp needs a verify row to equal the single-token row to the
last bit (test_llamacpp_exact.py checks that on whole models). The patches make a verify cheaper
by unpacking each weight row once for up to four columns: Q4_K and Q6_K against q8_K columns
(0001, the Qwen and Gemma models; 0006 accumulates them with VNNI where the CPU has it), Q4_1
against q8_1 columns (0003, SmolLM2). Repacked Q4_K
weights (0005: ggml lays them out 8 rows at a time and multiplies them by one activation row
with a gemv, by groups of 4 rows with a gemm) get gemm rows bitwise the gemv's. These tests
call both kernels in the installed wheel's libggml-cpu on random blocks and compare the bits,
and check that set-up did install the patched wheel.
"""

from __future__ import annotations

import ctypes
import platform
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

llama_cpp = pytest.importorskip("llama_cpp")

pytestmark = pytest.mark.llamacpp

QK_K = 256
QK8_1 = 32
# weight kind -> (block bytes, elements per block, activation kind), from ggml-common.h:
# q4_K = d, dmin (f16), scales[12], qs[128]; q6_K = ql[128], qh[64], scales[16], d (f16);
# q4_1 = d, m (f16), qs[16]
KINDS = {"q4_K": (144, QK_K, "q8_K"), "q6_K": (210, QK_K, "q8_K"), "q4_1": (20, QK8_1, "q8_1")}
# q8_K = d (f32), qs[256] (i8), bsums[16] (i16); q8_1 = d, s = d * sum(qs) (f16), qs[32] (i8)
Q8K_BLOCK = 4 + QK_K + 2 * (QK_K // 16)
Q81_BLOCK = 4 + QK8_1
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


def _functions(kind: str) -> tuple[Callable[..., None], Callable[..., None]]:
    """The one-column kernel and the column kernel, called as one(n, s, x, y) and
    cols(n, s, x, [y, ...]) on numpy blocks."""
    lib = _ggml_cpu()
    name = f"ggml_vec_dot_{kind}_{KINDS[kind][2]}"
    one = getattr(lib, name)
    one.restype = None
    one.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                    ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]  # fmt: skip
    cols = getattr(lib, f"{name}_cols")
    cols.restype = None
    pointers = ctypes.POINTER(ctypes.c_void_p)
    if kind == "q4_1":
        # its columns come with their block scales widened to f32 first, as the matmul does
        widen = lib.ggml_q8_1_widen_scales
        widen.restype = None
        widen.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        cols.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, pointers, pointers,
                         ctypes.c_int]  # fmt: skip
    else:
        cols.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, pointers, ctypes.c_int]

    def call_one(n: int, s: np.ndarray, x: np.ndarray, y: np.ndarray) -> None:
        one(n, s.ctypes.data, 0, x.ctypes.data, 0, y.ctypes.data, 0, 1)

    def call_cols(n: int, s: np.ndarray, x: np.ndarray, ys: list[np.ndarray]) -> None:
        columns = (ctypes.c_void_p * len(ys))(*(y.ctypes.data for y in ys))
        if kind != "q4_1":
            cols(n, s.ctypes.data, x.ctypes.data, columns, len(ys))
            return
        widened = [np.full(2 * (n // QK8_1), np.nan, dtype=np.float32) for _ in ys]
        for w, y in zip(widened, ys, strict=True):
            widen(n, w.ctypes.data, y.ctypes.data)
        scales = (ctypes.c_void_p * len(ys))(*(w.ctypes.data for w in widened))
        cols(n, s.ctypes.data, x.ctypes.data, columns, scales, len(ys))

    return call_one, call_cols


def _weights(kind: str, blocks: int, rng: np.random.Generator) -> np.ndarray:
    """Random blocks with finite f16 scales (random bytes could make NaN and inf)."""
    raw = rng.integers(0, 256, size=(blocks, KINDS[kind][0]), dtype=np.uint8)
    scales = rng.uniform(-0.05, 0.05, size=(blocks, 2)).astype(np.float16).view(np.uint8)
    if kind in ("q4_K", "q4_1"):
        raw[:, 0:4] = scales.reshape(blocks, 4)  # d, dmin / d, m
    else:
        raw[:, 208:210] = scales[:, 0:2]  # d
    return np.ascontiguousarray(raw)


def _activations(kind: str, blocks: int, rng: np.random.Generator) -> np.ndarray:
    """Random activation blocks of the kind the weight kind's dot product takes."""
    if KINDS[kind][2] == "q8_1":
        out = np.zeros((blocks, Q81_BLOCK), dtype=np.uint8)
        qs = rng.integers(-127, 128, size=(blocks, QK8_1), dtype=np.int8)
        d = rng.uniform(0.001, 0.1, size=blocks).astype(np.float16)
        s = (d.astype(np.float32) * qs.sum(axis=1)).astype(np.float16)
        out[:, 0:4] = np.stack([d, s], axis=1).view(np.uint8)
        out[:, 4:] = qs.view(np.uint8)
        return out
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
    names = [f"ggml_vec_dot_{kind}_{acts}_cols" for kind, (_, _, acts) in KINDS.items()]
    for name in [*names, "ggml_cpu_draftless_repack_exact"]:
        assert hasattr(lib, name), (
            f"libggml-cpu has no {name}: the wheel was built without patches/llama.cpp "
            "(re-run make setup)"
        )
    from draftless.models import llamacpp

    assert llamacpp._repack_is_exact()  # so the backend loads repacked weights (patch 0005)


@needs_kernels
@settings(max_examples=90, deadline=None)
@given(
    kind=st.sampled_from(sorted(KINDS)),
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
    ys = [_activations(kind, blocks, rng) for _ in range(ncols)]
    n = blocks * KINDS[kind][1]
    expected = np.zeros(ncols, dtype=np.float32)
    for c, y in enumerate(ys):
        one(n, expected[c:], x, y)
    got = np.full(ncols, np.nan, dtype=np.float32)
    cols(n, got, x, ys)
    assert np.isfinite(expected).all() and (expected != 0).all()
    assert got.view(np.uint32).tolist() == expected.view(np.uint32).tolist(), (got, expected)


@needs_kernels
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_oracle_sees_a_wrong_column(kind: str) -> None:
    """The comparison above can fail: a column fed another column's activations differs."""
    rng = np.random.default_rng(7)
    one, cols = _functions(kind)
    x = _weights(kind, 4, rng)
    ys = [_activations(kind, 4, rng) for _ in range(3)]
    n = 4 * KINDS[kind][1]
    expected = np.zeros(3, dtype=np.float32)
    for c, y in enumerate(ys):
        one(n, expected[c:], x, y)
    got = np.zeros(3, dtype=np.float32)
    cols(n, got, x, [ys[0], ys[2], ys[1]])
    assert got[0] == expected[0] and got[1] != expected[1] and got[2] != expected[2]


# block_q4_Kx8: d[8], dmin[8] (f16), scales[96], qs[1024]: 8 weight rows' q4_K blocks interleaved.
# block_q8_Kx4: d[4] (f32), qs[1024], bsums[64] (i16): 4 activation rows' q8_K blocks.
Q4KX8_BLOCK = 16 + 16 + 96 + 1024
Q8KX4_BLOCK = 16 + 1024 + 128


def _repacked_q4_K(
    nc: int, nr: int, blocks: int, seed: int, gemm_name: str = "ggml_gemm_q4_K_8x8_q8_K"
) -> tuple[np.ndarray, np.ndarray]:
    """(gemv rows, gemm rows), each [nr, nc]: nc weight rows (random block_q4_Kx8) times nr
    random activation rows, one row at a time through the gemv (its activations quantised by
    quantize_row_q8_K, as ggml does for one row) and all at once through the gemm (groups of
    4 rows quantised by ggml_quantize_mat_q8_K_4x8)."""
    lib = _ggml_cpu()
    kernel = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p,
              ctypes.c_int, ctypes.c_int]  # fmt: skip
    quantize = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    gemv, gemm = lib.ggml_gemv_q4_K_8x8_q8_K, getattr(lib, gemm_name)
    row_q8, rows_q8 = lib.quantize_row_q8_K, lib.ggml_quantize_mat_q8_K_4x8
    for f, argtypes in ((gemv, kernel), (gemm, kernel), (row_q8, quantize), (rows_q8, quantize)):
        f.restype, f.argtypes = None, argtypes
    rng = np.random.default_rng(seed)
    n = blocks * QK_K
    w = rng.integers(0, 256, size=(nc // 8 * blocks, Q4KX8_BLOCK), dtype=np.uint8)
    w[:, :32] = rng.uniform(-0.05, 0.05, size=(len(w), 16)).astype(np.float16).view(np.uint8)
    x = np.ascontiguousarray(rng.standard_normal((nr, n)).astype(np.float32))
    one = np.full((nr, nc), np.nan, dtype=np.float32)
    for r in range(nr):
        y = np.zeros(blocks * Q8K_BLOCK, dtype=np.uint8)
        row_q8(x[r].ctypes.data, y.ctypes.data, n)
        gemv(n, one[r].ctypes.data, nc, w.ctypes.data, y.ctypes.data, 1, nc)
    ys = np.zeros((nr // 4, blocks * Q8KX4_BLOCK), dtype=np.uint8)
    for g in range(nr // 4):
        rows_q8(x[4 * g :].ctypes.data, ys[g].ctypes.data, n)
    many = np.full((nr, nc), np.nan, dtype=np.float32)
    gemm(n, many.ctypes.data, nc, w.ctypes.data, ys.ctypes.data, nr, nc)
    return one, many


@needs_kernels
@settings(max_examples=40, deadline=None)
@given(
    nc=st.sampled_from([8, 16, 24, 40]),  # AVX-512 takes 16 weight rows a pass, AVX2 8
    nr=st.sampled_from([4, 8, 16, 20, 36]),  # 16 activation rows a pass, then 4
    blocks=st.integers(1, 4),
    seed=st.integers(0, 2**32 - 1),
)
def test_repacked_q4_K_gemm_rows_are_bitwise_gemv_rows(
    nc: int, nr: int, blocks: int, seed: int
) -> None:
    one, many = _repacked_q4_K(nc, nr, blocks, seed)
    assert np.isfinite(one).all() and (one != 0).all()
    assert many.view(np.uint32).tolist() == one.view(np.uint32).tolist(), np.abs(many - one).max()


@needs_kernels
def test_the_repack_oracle_sees_another_summation_order() -> None:
    """The comparison above can fail: ggml's scalar gemm, which adds each 16-element piece's
    product into the float sums (where the gemv adds a super block's integer sum once), gives
    the same values to within rounding but not the same bits."""
    one, many = _repacked_q4_K(16, 8, 4, seed=3, gemm_name="ggml_gemm_q4_K_8x8_q8_K_generic")
    np.testing.assert_allclose(many, one, rtol=1e-4, atol=1e-5)
    assert (many.view(np.uint32) != one.view(np.uint32)).any()
