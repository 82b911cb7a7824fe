"""The generated quantized-checkpoint kernels (NVFP4 and FP8-block dequant, the block-scale
swizzle), run on the CPU through the emulation harness, bit for bit against the NumPy path in
runtime/binder/quant_numerics.py: every packed byte under every scale byte, stacked matrices with
their own global scales, odd shapes and blocks, tiny grids.

A NaN's sign is not part of the contract (CUDA hardware returns its canonical NaN), so where
both sides are NaN only that is checked."""

from __future__ import annotations

import ctypes
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kernels_cpu import launch, library, ptr

from specbind.runtime.binder import quant_numerics as qn

U8, U16, F32 = np.uint8, np.uint16, np.float32
E4M3, BF16 = ml_dtypes.float8_e4m3fn, ml_dtypes.bfloat16
BLOCKS = st.sampled_from([1, 7, 32, 256])


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return library(str(tmp_path_factory.mktemp("kernels")))


def i64(n: int) -> Any:
    return ctypes.c_longlong(n)


def i32(n: int) -> Any:
    return ctypes.c_int(n)


def run(lib: Any, kernel: str, n: int, *args: Any, block: int = 256, grid: int = 0) -> None:
    """A launch as the CuPy wrapper makes it, or with a tiny ``grid`` the loop must cover."""
    if not grid:
        launch(lib, kernel, n, *args, block=block)
        return
    fn = getattr(lib, f"launch_{kernel}")
    fn.restype = None
    fn(ctypes.c_uint(grid), ctypes.c_uint(block), *args)


def assert_same_bf16(got: Any, want: Any) -> None:
    g, w = np.asarray(got).view(U16), np.asarray(want).view(U16)
    both_nan = ((g & 0x7FFF) > 0x7F80) & ((w & 0x7FFF) > 0x7F80)
    bad = np.flatnonzero((g != w) & ~both_nan)
    assert bad.size == 0, [(int(i), hex(g.flat[i]), hex(w.flat[i])) for i in bad[:5]]


def nvfp4_kernel(
    lib: Any,
    packed: Any,
    scale: Any,
    gs: Any,
    *,
    group: int,
    divide: bool,
    negative_zero: bool,
    block: int = 256,
    grid: int = 0,
) -> Any:
    """``gs`` is ``lead + (S,)``: one global scale per row segment of ``rows / S`` rows."""
    *lead, rows, half = packed.shape
    mats = int(np.prod(lead))
    per = np.ascontiguousarray(gs, dtype=F32).reshape(-1)  # [.., S] -> [prod(lead) * S]
    out = np.full((*lead, rows, 2 * half), 0xDEAD, dtype=U16)
    run(lib, "dequant_nvfp4_bf16", packed.size, ptr(packed), ptr(scale.view(U8)), ptr(per),
        ptr(out), i64(mats * rows), i64(rows // gs.shape[-1]), i64(2 * half), i64(group), i32(divide),
        i32(negative_zero), block=block, grid=grid)  # fmt: skip
    return out


@pytest.mark.parametrize(("divide", "negative_zero"), [(False, False), (True, True), (True, False)])
def test_nvfp4_kernel_equals_numpy_for_every_byte_under_every_scale_byte(
    lib: Any, divide: bool, negative_zero: bool
) -> None:
    packed = np.tile(np.arange(256, dtype=U8), (256, 1))  # row r: every byte, i.e. code pair
    scale = np.repeat(np.arange(256, dtype=U8)[:, None], 32, axis=1).view(E4M3)  # row r: byte r
    gs = np.array([0.37], F32)
    got = nvfp4_kernel(lib, packed, scale, gs, group=16, divide=divide, negative_zero=negative_zero)
    want = qn.dequant_nvfp4(packed, scale, gs, divide=divide, negative_zero=negative_zero)
    assert_same_bf16(got, want)


SPECIAL = st.sampled_from([0.0, -0.0, 1e-30, 3e38, float("inf"), float("nan"), 448.0, 2.0**-9])
GLOBAL = st.one_of(
    st.floats(2.0**-20, 1e3, width=32), st.floats(-1.0, -(2.0**-20), width=32), SPECIAL
)


@settings(deadline=None)
@given(
    st.lists(st.integers(1, 3), max_size=2),
    st.integers(1, 6),
    st.integers(1, 4),
    st.sampled_from([1, 2, 3, 8, 16, 32]),
    st.integers(1, 3),
    st.booleans(),
    st.booleans(),
    st.data(),
    BLOCKS,
    st.integers(1, 3),
)
def test_nvfp4_kernel_equals_numpy_for_stacked_segmented_matrices_and_any_group(
    lib: Any,
    lead: list[int],
    rows: int,
    groups: int,
    group: int,
    segments: int,
    divide: bool,
    negative_zero: bool,
    data: st.DataObject,
    block: int,
    grid: int,
) -> None:
    rows *= segments  # whole row segments, each with its own global scale
    cols = groups * (group if group % 2 == 0 else 2 * group)  # whole groups, even columns
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    packed = rng.integers(0, 256, (*lead, rows, cols // 2), dtype=U8)
    scale = rng.integers(0, 256, (*lead, rows, cols // group), dtype=U8).view(E4M3)
    n = int(np.prod(lead)) * segments
    gs = np.array([data.draw(GLOBAL) for _ in range(n)], F32).reshape(*lead, segments)
    got = nvfp4_kernel(lib, packed, scale, gs, group=group, divide=divide,
                       negative_zero=negative_zero, block=block, grid=grid)  # fmt: skip
    want = qn.dequant_nvfp4(packed, scale, gs, divide=divide, group=group,
                            negative_zero=negative_zero)  # fmt: skip
    assert_same_bf16(got, want)


def fp8_kernel(lib: Any, w: Any, s: Any, bo: int, bi: int, block: int = 256, grid: int = 0) -> Any:
    """The block dequant kernel of ``w``'s codes: E4M3 (as its bytes) or int8."""
    *lead, rows, cols = w.shape
    out = np.full(w.shape, 0xDEAD, dtype=U16)
    int8 = w.dtype == np.int8
    name = "dequant_int8_block_bf16" if int8 else "dequant_fp8_block_bf16"
    run(lib, name, w.size, ptr(w if int8 else w.view(U8)), ptr(s), ptr(out),
        i64(int(np.prod(lead))), i64(rows), i64(cols), i64(bo), i64(bi), block=block, grid=grid)  # fmt: skip
    return out


def test_fp8_block_kernel_equals_numpy_for_every_weight_byte(lib: Any) -> None:
    w = np.tile(np.arange(256, dtype=U8), (300, 1)).view(E4M3)  # [300, 256]: 3 x 2 blocks
    s = np.array([[1.0, 2.0**-20], [0.3, -7.5], [3e38, float("nan")]], F32)
    assert_same_bf16(fp8_kernel(lib, w, s, 128, 128), qn.dequant_fp8_block(w, s))


@settings(deadline=None)
@given(
    st.lists(st.integers(1, 3), max_size=2),
    st.integers(1, 20),
    st.integers(1, 20),
    st.integers(1, 8),
    st.integers(1, 8),
    st.integers(0, 2**32 - 1),
    BLOCKS,
    st.integers(1, 3),
)
def test_fp8_block_kernel_equals_numpy_for_any_shape_and_block(
    lib: Any,
    lead: list[int],
    rows: int,
    cols: int,
    bo: int,
    bi: int,
    seed: int,
    block: int,
    grid: int,
) -> None:
    rng = np.random.default_rng(seed)
    w = rng.integers(0, 256, (*lead, rows, cols), dtype=U8).view(E4M3)
    s = rng.uniform(-4, 4, (*lead, -(-rows // bo), -(-cols // bi))).astype(F32)
    got = fp8_kernel(lib, w, s, bo, bi, block=block, grid=grid)
    assert_same_bf16(got, qn.dequant_fp8_block(w, s, block=(bo, bi)))


@settings(deadline=None)
@given(
    st.lists(st.integers(1, 3), max_size=2),
    st.integers(1, 20),
    st.integers(1, 20),
    st.booleans(),
    st.booleans(),
    st.integers(0, 2**32 - 1),
    BLOCKS,
    st.integers(1, 3),
)
def test_scaled_dequant_by_the_block_kernels_equals_numpy_per_channel_and_per_tensor(
    lib: Any,
    lead: list[int],
    rows: int,
    cols: int,
    int8: bool,
    per_row: bool,
    seed: int,
    block: int,
    grid: int,
) -> None:
    """The CuPy backend's ``dequant_scaled``: a channel scale ``[.., O, 1]`` is the block
    kernel with ``(1, I)`` blocks, a tensor scale ``(O, I)`` blocks, on every int8 or E4M3
    code."""
    rng = np.random.default_rng(seed)
    w = rng.integers(-128, 128, (*lead, rows, cols), dtype=np.int8)
    s = rng.uniform(-4, 4, (*lead, rows if per_row else 1, 1)).astype(F32)
    bo = 1 if per_row else rows
    if not int8:
        w = w.view(U8).view(E4M3)
    got = fp8_kernel(lib, w, s, bo, cols, block=block, grid=grid)
    want_s = s if per_row or rows == 1 else s.reshape(tuple(lead))  # one value per matrix
    assert_same_bf16(got, qn.dequant_scaled(w, want_s))


@settings(deadline=None)
@given(
    st.lists(st.integers(1, 2), max_size=2),
    st.integers(1, 19),
    st.integers(1, 4),
    st.sampled_from([4, 8]),
    st.integers(0, 40),
    st.booleans(),
    st.integers(0, 2**32 - 1),
    BLOCKS,
    st.integers(1, 3),
)
def test_int_group_kernel_equals_numpy_for_any_shape_group_and_zero(
    lib: Any,
    lead: list[int],
    rows: int,
    words: int,
    bits: int,
    pick: int,
    has_zero: bool,
    seed: int,
    block: int,
    grid: int,
) -> None:
    """Every int32 word's codes, a zero point of ceil(O / pf) word rows (its spare codes
    ignored), groups that split words or span them."""
    rng = np.random.default_rng(seed)
    pf = 32 // bits
    cols = words * pf
    divisors = [g for g in range(1, cols + 1) if cols % g == 0]  # any whole group width
    groups = divisors[pick % len(divisors)]
    packed = rng.integers(-(2**31), 2**31, (*lead, rows, words), dtype=np.int64).astype(np.int32)
    scale = rng.uniform(-4, 4, (*lead, rows, groups)).astype(F32)
    zero = None
    if has_zero:
        zr = -(-rows // pf)
        zero = rng.integers(-(2**31), 2**31, (*lead, zr, groups), dtype=np.int64).astype(np.int32)
    out = np.full((*lead, rows, cols), 0xDEAD, dtype=U16)
    zarg = zero if zero is not None else np.zeros(1, np.int32)
    run(lib, "dequant_int_group_bf16", out.size, ptr(packed), ptr(scale), ptr(zarg), ptr(out),
        i64(int(np.prod(lead))), i64(rows), i64(cols), i64(groups), i32(bits),
        i32(int(zero is not None)), block=block, grid=grid)  # fmt: skip
    assert_same_bf16(out, qn.dequant_int_group(packed, scale, zero, bits=bits))


@settings(deadline=None)
@given(
    st.lists(st.integers(1, 3), max_size=2),
    st.integers(1, 300),
    st.integers(1, 13),
    st.integers(0, 2**32 - 1),
    BLOCKS,
    st.integers(1, 3),
)
def test_swizzle_kernel_equals_numpy_for_any_shape(
    lib: Any, lead: list[int], rows: int, cols: int, seed: int, block: int, grid: int
) -> None:
    scale = np.random.default_rng(seed).integers(1, 256, (*lead, rows, cols), dtype=U8)
    rp, cp = qn.padded_shape(rows, cols)
    out = np.full((*lead, rp, cp), 0xAB, dtype=U8)  # the padding must be written as zeros
    run(lib, "swizzle_blockscale_b1", out.size, ptr(scale), ptr(out), i64(int(np.prod(lead))),
        i64(rows), i64(cols), i64(rp), i64(cp), block=block, grid=grid)  # fmt: skip
    assert out.tobytes() == qn.swizzle_blockscale(scale).tobytes()
