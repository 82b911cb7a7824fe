"""The quantized ops on the device path (runtime/binder/ops_cupy.py: uploads, the generated kernels'
launch wrappers and checks), run against the CuPy stand-in whose kernels execute on the CPU
harness: the bytes equal the NumPy backend's, F8 goes up as uint8 bits and comes back tagged."""

from __future__ import annotations

import importlib
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from specbind.core.errors import BindError
from specbind.runtime.binder import backends
from specbind.runtime.binder import quant_numerics as qn

U8, U16, F32 = np.uint8, np.uint16, np.float32
E4M3, BF16 = ml_dtypes.float8_e4m3fn, ml_dtypes.bfloat16


def device(fake_cupy: Any) -> backends.Backend:
    return backends.get("cupy", importlib.import_module("specbind.generated.kernels"))


def nvfp4(seed: int, lead: tuple[int, ...]) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    scale = rng.integers(0, 256, (*lead, 24, 4), dtype=U8)
    scale[(scale & 0x7F) == 0x7F] = 0x30  # finite scales: NaN signs are not compared here
    return {
        "packed": rng.integers(0, 256, (*lead, 24, 32), dtype=U8),
        "scale": scale.view(E4M3),
        "g": rng.uniform(1e-3, 2, lead).astype(F32),
    }


@pytest.mark.parametrize("gshape", ["lead", "lead1", "scalar", "segments"])
@pytest.mark.parametrize("divide", [False, True])
def test_nvfp4_on_the_device_path_gives_the_numpy_backends_bytes(
    fake_cupy: Any, divide: bool, gshape: str
) -> None:
    host = nvfp4(7, (3,))
    if gshape == "lead1":
        host["g"] = host["g"][:, None]
    if gshape == "scalar":
        host["g"] = host["g"][0].reshape(())
    if gshape == "segments":  # [gate; up]: one global scale per half of the rows
        host["g"] = np.stack([host["g"], host["g"][::-1] * 3], axis=-1)
    dev = device(fake_cupy)
    up = dev.upload(host)
    assert str(up["scale"].dtype) == "uint8"  # F8 travels as its bits
    got = dev.ops.dequant_nvfp4(up["packed"], up["scale"], up["g"], divide=divide)
    want = backends.NUMPY.ops.dequant_nvfp4(host["packed"], host["scale"], host["g"], divide=divide)
    assert dev.to_host(got, "BF16").tobytes() == want.tobytes()


@pytest.mark.parametrize("sdtype", [F32, BF16])
def test_fp8_block_on_the_device_path_gives_the_numpy_backends_bytes(
    fake_cupy: Any, sdtype: Any
) -> None:
    rng = np.random.default_rng(8)
    host = {
        "w": rng.integers(0, 256, (2, 130, 260), dtype=U8).view(E4M3),
        "s": rng.uniform(-1, 1, (2, 2, 3)).astype(sdtype),
    }
    dev = device(fake_cupy)
    up = dev.upload(host)
    got = dev.to_host(dev.ops.dequant_fp8_block(up["w"], up["s"]), "BF16")
    want = qn.dequant_fp8_block(host["w"], host["s"])
    g, w = got.view(U16), want.view(U16)
    both_nan = ((g & 0x7FFF) > 0x7F80) & ((w & 0x7FFF) > 0x7F80)
    assert np.array_equal(g[~both_nan], w[~both_nan])


@pytest.mark.parametrize("codes", ["e4m3", "int8"])
@pytest.mark.parametrize("scale", ["channel", "tensor", "tensor1"])
@pytest.mark.parametrize("sdtype", [F32, BF16])
def test_scaled_dequant_on_the_device_path_gives_the_numpy_backends_bytes(
    fake_cupy: Any, codes: str, scale: str, sdtype: Any
) -> None:
    rng = np.random.default_rng(10)
    w = rng.integers(-128, 128, (24, 40), dtype=np.int8)
    shape = {"channel": (24, 1), "tensor": (), "tensor1": (1,)}[scale]
    host = {
        "w": w.view(U8).view(E4M3) if codes == "e4m3" else w,
        "s": rng.uniform(0.01, 2, shape).astype(sdtype),
    }
    dev = device(fake_cupy)
    up = dev.upload(host)
    got = dev.to_host(dev.ops.dequant_scaled(up["w"], up["s"]), "BF16")
    want = qn.dequant_scaled(host["w"], host["s"])
    g, w16 = got.view(U16), want.view(U16)
    both_nan = ((g & 0x7FFF) > 0x7F80) & ((w16 & 0x7FFF) > 0x7F80)
    assert np.array_equal(g[~both_nan], w16[~both_nan])


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("zero", [False, True])
@pytest.mark.parametrize("sdtype", [F32, BF16])
def test_int_group_dequant_on_the_device_path_gives_the_numpy_backends_bytes(
    fake_cupy: Any, bits: int, zero: bool, sdtype: Any
) -> None:
    rng = np.random.default_rng(11)
    host = {
        "p": rng.integers(-(2**31), 2**31, (2, 12, 4), dtype=np.int64).astype(np.int32),
        "s": rng.uniform(0.01, 2, (2, 12, 2)).astype(sdtype),
        "z": rng.integers(-(2**31), 2**31, (2, -(-12 // (32 // bits)), 2), dtype=np.int64).astype(
            np.int32
        ),
    }
    dev = device(fake_cupy)
    up = dev.upload(host)
    z = up["z"] if zero else None
    got = dev.to_host(dev.ops.dequant_int_group(up["p"], up["s"], z, bits=bits), "BF16")
    want = qn.dequant_int_group(host["p"], host["s"], host["z"] if zero else None, bits=bits)
    assert got.tobytes() == want.tobytes()


def test_the_swizzle_on_the_device_path_gives_the_numpy_backends_bytes(fake_cupy: Any) -> None:
    scale = np.random.default_rng(9).integers(0, 256, (2, 200, 7), dtype=U8).view(E4M3)
    dev = device(fake_cupy)
    got = dev.to_host(dev.ops.swizzle_blockscale(dev.upload({"s": scale})["s"]), "F8_E4M3")
    assert got.dtype == E4M3 and got.shape == (2, 256, 8)
    assert got.tobytes() == qn.swizzle_blockscale(scale).tobytes()


def test_bad_quantized_input_on_the_device_is_refused_naming_it(fake_cupy: Any) -> None:
    dev = device(fake_cupy)
    up = dev.upload(nvfp4(1, (2,)))
    with pytest.raises(BindError, match=r"NVFP4 dequant: the group scale is float16"):
        dev.ops.dequant_nvfp4(up["packed"], up["scale"].astype(np.float16), up["g"], divide=True)
    with pytest.raises(BindError, match=r"NVFP4 dequant: the group scale is \[2, 24, 3\]"):
        dev.ops.dequant_nvfp4(up["packed"], up["scale"][..., :3], up["g"], divide=True)
    with pytest.raises(BindError, match=r"NVFP4 dequant: the global scale has shape \[3\]"):
        g3 = fake_cupy.asarray(np.ones(3, F32))
        dev.ops.dequant_nvfp4(up["packed"], up["scale"], g3, divide=True)
    with pytest.raises(BindError, match=r"FP8 block dequant: the block scale is \[2, 1\]"):
        dev.ops.dequant_fp8_block(up["packed"][0], fake_cupy.asarray(np.ones((2, 1), F32)))


def test_a_quantized_kernel_launch_with_a_wrong_argument_is_refused_before_it_runs(
    fake_cupy: Any,
) -> None:
    import specbind.generated.kernels as k

    packed = fake_cupy.asarray(np.zeros((2, 6, 8), U8))
    scale = fake_cupy.asarray(np.zeros((2, 6, 1), U8))
    with pytest.raises(k.KernelError, match=r"3 global scales for 2 matrices of 6 rows"):
        k.dequant_nvfp4_bf16(packed, scale, fake_cupy.asarray(np.ones(3, F32)), 16, True, True)
    with pytest.raises(k.KernelError, match=r"global_scale is float64, the kernel reads float32"):
        k.dequant_nvfp4_bf16(packed, scale, fake_cupy.asarray(np.ones(2)), 16, True, True)
    with pytest.raises(k.KernelError, match=r"scale is \(2, 6, 2\), expected \(2, 6, 1\)"):
        k.dequant_nvfp4_bf16(packed, fake_cupy.asarray(np.zeros((2, 6, 2), U8)),
                             fake_cupy.asarray(np.ones(2, F32)), 16, True, True)  # fmt: skip
    with pytest.raises(k.KernelError, match=r"scale is \(1, 1\), expected \(2, 2\)"):
        k.dequant_fp8_block_bf16(packed[0], fake_cupy.asarray(np.ones((1, 1), F32)), 4, 4)
    with pytest.raises(k.KernelError, match=r"1-byte elements"):
        k.swizzle_blockscale_b1(fake_cupy.asarray(np.zeros((4, 4), U16)))
