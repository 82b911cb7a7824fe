"""The quantized-checkpoint kernels on a real GPU, bit for bit against the NumPy path
(runtime/binder/quant_numerics.py), mirroring tests/quant/test_quant_kernels_cpu.py. A NaN's sign is not
compared: CUDA arithmetic returns its canonical NaN."""

from __future__ import annotations

import importlib
from typing import Any

import ml_dtypes
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from specbind.runtime.binder import quant_numerics as qn

U8, U16, F32 = np.uint8, np.uint16, np.float32
E4M3 = ml_dtypes.float8_e4m3fn


def cp() -> Any:
    return importlib.import_module("cupy")


def k() -> Any:
    return importlib.import_module("specbind.generated.kernels")


def assert_same_bf16(got: Any, want: Any) -> None:
    g, w = np.asarray(got).view(U16), np.asarray(want).view(U16)
    both_nan = ((g & 0x7FFF) > 0x7F80) & ((w & 0x7FFF) > 0x7F80)
    bad = np.flatnonzero((g != w) & ~both_nan)
    assert bad.size == 0, [(int(i), hex(g.flat[i]), hex(w.flat[i])) for i in bad[:5]]


def test_nvfp4_kernel_equals_numpy_for_every_byte_under_every_scale_byte() -> None:
    packed = np.tile(np.arange(256, dtype=U8), (256, 1))
    scale = np.repeat(np.arange(256, dtype=U8)[:, None], 32, axis=1)
    gs = np.array([0.37], F32)
    for divide, neg in [(False, False), (True, True), (True, False)]:
        got = k().dequant_nvfp4_bf16(cp().asarray(packed), cp().asarray(scale), cp().asarray(gs),
                                     16, divide, neg).get()  # fmt: skip
        want = qn.dequant_nvfp4(packed, scale.view(E4M3), gs, divide=divide,
                                negative_zero=neg)  # fmt: skip
        assert_same_bf16(got, want)


@settings(deadline=None)
@given(
    st.lists(st.integers(1, 4), max_size=2),
    st.integers(1, 300),
    st.integers(1, 8),
    st.sampled_from([1, 2, 3, 8, 16, 32]),
    st.integers(1, 3),
    st.booleans(),
    st.booleans(),
    st.integers(0, 2**32 - 1),
)
def test_nvfp4_kernel_equals_numpy_for_stacked_segmented_matrices_and_any_group(
    lead: list[int],
    rows: int,
    groups: int,
    group: int,
    segments: int,
    divide: bool,
    neg: bool,
    seed: int,
) -> None:
    rows *= segments  # whole row segments, each with its own global scale
    cols = groups * (group if group % 2 == 0 else 2 * group)
    rng = np.random.default_rng(seed)
    packed = rng.integers(0, 256, (*lead, rows, cols // 2), dtype=U8)
    scale = rng.integers(0, 256, (*lead, rows, cols // group), dtype=U8)
    gs = rng.uniform(-2, 2, (*lead, segments)).astype(F32)
    got = k().dequant_nvfp4_bf16(cp().asarray(packed), cp().asarray(scale),
                                 cp().asarray(gs.reshape(-1)), group, divide, neg).get()  # fmt: skip
    want = qn.dequant_nvfp4(packed, scale.view(E4M3), gs, divide=divide, group=group,
                            negative_zero=neg)  # fmt: skip
    assert_same_bf16(got, want)


@settings(deadline=None)
@given(
    st.lists(st.integers(1, 3), max_size=2),
    st.integers(1, 400),
    st.integers(1, 400),
    st.sampled_from([(128, 128), (1, 1), (3, 5), (64, 128)]),
    st.integers(0, 2**32 - 1),
)
def test_fp8_block_kernel_equals_numpy_for_any_shape_and_block(
    lead: list[int], rows: int, cols: int, block: tuple[int, int], seed: int
) -> None:
    rng = np.random.default_rng(seed)
    w = rng.integers(0, 256, (*lead, rows, cols), dtype=U8)
    s = rng.uniform(-4, 4, (*lead, -(-rows // block[0]), -(-cols // block[1]))).astype(F32)
    got = k().dequant_fp8_block_bf16(cp().asarray(w), cp().asarray(s), *block).get()
    assert_same_bf16(got, qn.dequant_fp8_block(w.view(E4M3), s, block=block))


@settings(deadline=None)
@given(
    st.lists(st.integers(1, 3), max_size=2),
    st.integers(1, 600),
    st.integers(1, 70),
    st.integers(0, 2**32 - 1),
)
def test_swizzle_kernel_equals_numpy_for_any_shape(
    lead: list[int], rows: int, cols: int, seed: int
) -> None:
    scale = np.random.default_rng(seed).integers(1, 256, (*lead, rows, cols), dtype=U8)
    got = k().swizzle_blockscale_b1(cp().asarray(scale)).get()
    assert got.tobytes() == qn.swizzle_blockscale(scale).tobytes()


def test_the_cupy_ops_give_the_numpy_ops_bytes_for_stacked_experts() -> None:
    from specbind.runtime.binder import backends, ops

    rng = np.random.default_rng(3)
    host = {
        "packed": rng.integers(0, 256, (8, 256, 512), dtype=U8),  # [E, 2·Im, H/2]
        "scale": rng.integers(0, 0x7F, (8, 256, 64), dtype=U8).view(E4M3),  # [E, 2·Im, H/16]
        "g": rng.uniform(1e-4, 1e-2, (8, 2)).astype(F32),  # [E, 2]: gate's and up's
    }
    dev = backends.get("cupy", k())
    up = dev.upload(host)
    for divide in (False, True):
        got = dev.ops.dequant_nvfp4(up["packed"], up["scale"], up["g"], divide=divide)
        want = ops.dequant_nvfp4(host["packed"], host["scale"], host["g"], divide=divide)
        assert dev.to_host(got, "BF16").tobytes() == want.tobytes()
    swz = dev.to_host(dev.ops.swizzle_blockscale(up["scale"]), "F8_E4M3")
    assert swz.tobytes() == ops.swizzle_blockscale(host["scale"]).tobytes()
