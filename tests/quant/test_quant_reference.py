"""specbind's quantized dequant equals each library's own, byte for byte, on small random
tensors built here: ModelOpt's ``NVFP4QTensor.dequantize`` (multiply by ``weight_scale_2``),
compressed-tensors' ``NVFP4PackedCompressor.decompress`` (divide by ``weight_global_scale``)
and its FP8 block decompress (``FloatQuantizationCompressor``, 128x128 blocks).

The inputs cover every E2M1 code pair and E4M3 scales of both signs, zero and subnormal; the
libraries run on CPU. The GPU kernels equal the NumPy path (test_quant_kernels_cpu.py), so
they equal the libraries too."""

from __future__ import annotations

import warnings
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from specbind.runtime.binder import ops


class _Lazy:
    """A tool's module, imported at first use (a test that uses it is skipped if the tool is
    not installed, as ``importorskip`` at the top would): collecting this file on an xdist
    worker that never runs it then costs nothing (modelopt alone is ~17 s of CPU to import)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._mod: Any = None

    def __getattr__(self, attr: str) -> Any:
        if self._mod is None:
            with warnings.catch_warnings():  # modelopt warns this transformers is untested
                warnings.simplefilter("ignore")
                self._mod = pytest.importorskip(self._name, exc_type=ImportError)
        return getattr(self._mod, attr)


torch = _Lazy("torch")
nvfp4_tensor = _Lazy("modelopt.torch.quantization.qtensor.nvfp4_tensor")
ct_nvfp4 = _Lazy("compressed_tensors.compressors.nvfp4.base")
ct_naive = _Lazy("compressed_tensors.compressors.naive_quantized.base")
ct_quant = _Lazy("compressed_tensors.quantization")


U8, U16, F32 = np.uint8, np.uint16, np.float32
E4M3, BF16 = ml_dtypes.float8_e4m3fn, ml_dtypes.bfloat16
SHAPES = [(16, 32), (48, 256), (7, 160)]


def nvfp4_inputs(seed: int, rows: int, cols: int) -> tuple[Any, Any, Any]:
    """Packed bytes cycling through all 256 code pairs, finite E4M3 scales (any sign, zero and
    subnormals included) and a global scale."""
    rng = np.random.default_rng(seed)
    packed = ((np.arange(rows * cols // 2) + seed) % 256).astype(U8).reshape(rows, cols // 2)
    rng.shuffle(packed, axis=1)
    scale = rng.integers(0, 256, (rows, cols // 16), dtype=U8)
    scale[(scale & 0x7F) == 0x7F] = 0x01  # NaN encodings -> the smallest subnormal
    g = F32(rng.uniform(1e-4, 2.0))
    return packed, scale.view(E4M3), g


def t(a: Any) -> Any:
    """A torch tensor with ``a``'s bytes (F8 and BF16 through their bit patterns)."""
    if a.dtype == E4M3:
        return torch.from_numpy(a.view(U8).copy()).view(torch.float8_e4m3fn)
    if a.dtype == BF16:
        return torch.from_numpy(a.view(U16).copy()).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(a).copy())


def torch_bits(x: Any) -> Any:
    assert x.dtype == torch.bfloat16
    return x.contiguous().view(torch.uint16).numpy()


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("seed", [0, 1])
def test_nvfp4_dequant_equals_modelopts_nvfp4qtensor_dequantize(
    shape: tuple[int, int], seed: int
) -> None:
    rows, cols = shape
    packed, scale, g = nvfp4_inputs(seed, rows, cols)
    q = nvfp4_tensor.NVFP4QTensor(torch.Size(shape), torch.bfloat16, torch.from_numpy(packed))
    want = q.dequantize(
        dtype=torch.bfloat16, scale=t(scale), double_scale=torch.tensor(g), block_sizes={-1: 16}
    )
    got = ops.dequant_nvfp4(packed, scale, np.array(g), divide=False)
    assert got.view(U16).tobytes() == torch_bits(want).tobytes()


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("seed", [0, 1])
def test_nvfp4_dequant_equals_compressed_tensors_decompress(
    shape: tuple[int, int], seed: int
) -> None:
    packed, scale, g = nvfp4_inputs(seed, *shape)
    scheme = ct_quant.preset_name_to_scheme("NVFP4A16", ["Linear"])
    state = {
        "weight_packed": torch.from_numpy(packed),
        "weight_scale": t(scale),
        "weight_global_scale": torch.tensor([g]),
    }
    want = ct_nvfp4.NVFP4PackedCompressor.decompress(state, scheme)["weight"]
    got = ops.dequant_nvfp4(packed, scale, np.array([g]), divide=True)
    assert got.view(U16).tobytes() == torch_bits(want).tobytes()


def test_stacked_experts_equal_modelopt_expert_by_expert() -> None:
    """Each expert carries its own ``weight_scale_2``: [E] global scales, one call."""
    parts = [nvfp4_inputs(s, 32, 64) for s in range(3)]
    packed = np.stack([p for p, _, _ in parts])  # [E, O, I/2]
    scale = np.stack([s for _, s, _ in parts])  # [E, O, I/16]
    g = np.array([g for _, _, g in parts], F32)  # [E]
    got = ops.dequant_nvfp4(packed, scale, g, divide=False)
    for e, (p, s, ge) in enumerate(parts):
        q = nvfp4_tensor.NVFP4QTensor(torch.Size((32, 64)), torch.bfloat16, torch.from_numpy(p))
        want = q.dequantize(
            dtype=torch.bfloat16, scale=t(s), double_scale=torch.tensor(ge), block_sizes={-1: 16}
        )
        assert got[e].view(U16).tobytes() == torch_bits(want).tobytes(), e


@pytest.mark.parametrize("scale_dtype", [F32, BF16])
@pytest.mark.parametrize("shape", [(256, 384), (200, 300), (130, 129)])
def test_fp8_block_dequant_equals_compressed_tensors_decompress(
    shape: tuple[int, int], scale_dtype: Any
) -> None:
    """compressed-tensors returns the scale's dtype (F32 for DeepSeek-style ``weight_scale_inv``);
    rounded once to BF16 it is specbind's result."""
    rows, cols = shape
    rng = np.random.default_rng(rows + cols)
    w = rng.integers(0, 256, shape, dtype=U8)
    w[(w & 0x7F) == 0x7F] = 0x80  # no NaN weights: -0 instead
    s = rng.uniform(1e-6, 1e-1, (-(-rows // 128), -(-cols // 128))).astype(scale_dtype)
    scheme = ct_quant.preset_name_to_scheme("FP8_BLOCK", ["Linear"])
    state = {"weight": t(w.view(E4M3)), "weight_scale": t(s)}
    want = ct_naive.FloatQuantizationCompressor.decompress(state, scheme)["weight"]
    got = ops.dequant_fp8_block(w.view(E4M3), s)
    assert got.view(U16).tobytes() == torch_bits(want.to(torch.bfloat16)).tobytes()
