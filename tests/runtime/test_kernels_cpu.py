"""The generated CUDA kernels, run on the CPU through the emulation harness, bit for bit
against NumPy/ml_dtypes: NaN, +-Inf, subnormals, ties, odd lengths, tiny grids, empty input."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from kernels_cpu import launch, library, ptr

U16, U32, F32 = np.uint16, np.uint32, np.float32
BLOCKS = st.sampled_from([1, 7, 32, 256])


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return library(str(tmp_path_factory.mktemp("kernels")))


def i64(n: int) -> Any:
    import ctypes

    return ctypes.c_longlong(n)


def ref_narrow(bits: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    with np.errstate(invalid="ignore"):  # NaN inputs are part of the test
        return bits.view(F32).astype(ml_dtypes.bfloat16).view(U16)


def edge_f32() -> np.ndarray[Any, Any]:
    """Every BF16 value, each nudged to the exact tie and one bit either side, plus specials."""
    base = np.arange(1 << 16, dtype=U32) << 16
    picks = [base, base | 0x8000, base | 0x7FFF, base | 0x8001, base | 0x0001, base | 0xFFFF]
    specials = np.array([0x7F800000, 0xFF800000, 0x7F7FFFFF, 0x7F7F8000, 0x00000001, 0x80000001,
                         0x007FFFFF, 0x7FC00001, 0xFFFFFFFF, 0x7F800001], dtype=U32)  # fmt: skip
    return np.concatenate([*picks, specials])


def test_widen_matches_ml_dtypes_for_every_bf16_bit_pattern(lib: Any) -> None:
    bits = np.arange(1 << 16, dtype=U16)
    out = np.full(bits.size, 0xDEADBEEF, dtype=U32)
    launch(lib, "widen_bf16_f32", bits.size, ptr(bits), ptr(out), i64(bits.size))
    want = bits.view(ml_dtypes.bfloat16).astype(F32).view(U32)
    assert np.array_equal(out, want)


def test_narrow_matches_ml_dtypes_at_every_tie_and_special_value(lib: Any) -> None:
    bits = edge_f32()
    out = np.zeros(bits.size, dtype=U16)
    launch(lib, "narrow_f32_bf16", bits.size, ptr(bits), ptr(out), i64(bits.size))
    want = ref_narrow(bits)
    bad = np.flatnonzero(out != want)
    assert bad.size == 0, [(hex(bits[i]), hex(out[i]), hex(want[i])) for i in bad[:5]]


@settings(max_examples=examples(3))
@given(st.lists(st.integers(0, 2**32 - 1), max_size=700), BLOCKS, st.integers(1, 4))
def test_narrow_matches_ml_dtypes_on_arbitrary_bits(
    lib: Any, raw: list[int], block: int, grid_cap: int
) -> None:
    bits = np.array(raw, dtype=U32)
    out = np.zeros(bits.size, dtype=U16)
    launch_small(lib, "narrow_f32_bf16", block, grid_cap, ptr(bits), ptr(out), i64(bits.size))
    assert np.array_equal(out, ref_narrow(bits))


def launch_small(lib: Any, kernel: str, block: int, grid: int, *args: Any) -> None:
    """A launch with a tiny grid, so the grid-stride loop must cover the rest."""
    import ctypes

    fn = getattr(lib, f"launch_{kernel}")
    fn.restype = None
    fn(ctypes.c_uint(grid), ctypes.c_uint(block), *args)


@settings(max_examples=examples(3))
@given(
    st.lists(st.integers(0, 2**16 - 1), max_size=700),
    st.floats(width=32, allow_nan=True),
    BLOCKS,
    st.integers(1, 4),
)
def test_scale_equals_widen_multiply_narrow(
    lib: Any, raw: list[int], factor: float, block: int, grid: int
) -> None:
    bits = np.array(raw, dtype=U16)
    out = np.zeros(bits.size, dtype=U16)
    import ctypes

    launch_small(
        lib, "scale_bf16", block, grid, ptr(bits), ptr(out), ctypes.c_float(factor), i64(bits.size)
    )
    with np.errstate(all="ignore"):
        want = (
            (bits.view(ml_dtypes.bfloat16).astype(F32) * F32(factor))
            .astype(ml_dtypes.bfloat16)
            .view(U16)
        )
    # Bit for bit, except that IEEE 754 leaves open which NaN a NaN x NaN product carries
    # (x86 keeps the first operand's; NumPy may swap operands): both must be the quiet NaN.
    both_nan = ((out & 0x7FFF) == 0x7FC0) & ((want & 0x7FFF) == 0x7FC0) & np.isnan(F32(factor))
    assert np.array_equal(out[~both_nan], want[~both_nan])


@settings(max_examples=examples(3))
@given(st.integers(0, 9), st.integers(1, 40), st.data(), BLOCKS, st.integers(1, 3))
def test_gather_cols_equals_numpy_slicing(
    lib: Any, rows: int, cols: int, data: st.DataObject, block: int, grid: int
) -> None:
    col0 = data.draw(st.integers(0, cols))
    width = data.draw(st.integers(0, cols - col0))
    x = np.random.default_rng(rows * 97 + cols).integers(0, 2**16, size=(rows, cols), dtype=U16)
    out = np.full((rows, width), 0xABCD, dtype=U16)
    launch_small(
        lib,
        "gather_cols_b2",
        block,
        grid,
        ptr(x),
        ptr(out),
        i64(rows),
        i64(cols),
        i64(col0),
        i64(width),
    )
    assert np.array_equal(out, x[:, col0 : col0 + width])


@settings(max_examples=examples(3))
@given(
    st.lists(st.integers(0, 30), min_size=3, max_size=3),
    st.integers(1, 5),
    BLOCKS,
    st.integers(1, 3),
)
def test_concat_rows_equals_numpy_concatenate(
    lib: Any, lengths: list[int], k: int, block: int, grid: int
) -> None:
    rng = np.random.default_rng(sum(lengths) + k)
    parts = [rng.integers(0, 2**16, size=(n, k), dtype=U16) for n in lengths]
    out = np.zeros((sum(lengths), k), dtype=U16)
    args: list[Any] = []
    for p in parts:
        args += [ptr(p), i64(p.size)]
    launch_small(lib, "concat_rows_3_b2", block, grid, *args, ptr(out))
    assert np.array_equal(out, np.concatenate(parts))


def test_an_empty_tensor_writes_nothing(lib: Any) -> None:
    src = np.zeros(1, dtype=U32)
    out = np.full(1, 0x1234, dtype=U16)
    launch(lib, "narrow_f32_bf16", 0, ptr(src), ptr(out), i64(0))
    assert out[0] == 0x1234
