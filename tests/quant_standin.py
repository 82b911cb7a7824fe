"""A NumPy stand-in for the quantization ``Ops`` methods, for the binding tests only.

The real numerics (NumPy and CUDA, bit-exact against ModelOpt and compressed-tensors, and the
CUTLASS swizzle) are the kernels' work; these tests prove the binding: which bytes each rank
reads and how the companions join. The stand-in follows the declared formulas directly:
``W = E2M1[code] * f32(scale[r, c // 16]) (* or /) global``, low nibble first, and
``W = f32(weight) * scale_inv[r // b0, c // b1]``; the swizzle is vLLM's
``swizzle_blockscale`` transcribed (pad rows to 128 and columns to 4, then
``[B, M/128, 4, 32, K/4, 4]`` permuted (0, 1, 4, 3, 2, 5)).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import ml_dtypes
import numpy as np

from specbind.runtime import ops as numpy_ops
from specbind.runtime.backends import Backend

E2M1 = np.array(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
    dtype=np.float32,
)


def dequant_nvfp4(packed: Any, scale: Any, global_scale: Any, *, divide: bool, group: int) -> Any:
    codes = np.stack([packed & 0x0F, packed >> 4], axis=-1)  # [..., O, I/2, 2]: low first
    vals = E2M1[codes.reshape(*packed.shape[:-1], packed.shape[-1] * 2)]  # [..., O, I]
    s = np.repeat(scale.astype(np.float32), group, axis=-1)  # [..., O, I/16] -> [..., O, I]
    g = np.asarray(global_scale, dtype=np.float32)[..., None, None]
    w = vals * s / g if divide else vals * s * g
    return w.astype(ml_dtypes.bfloat16)


def dequant_fp8_block(weight: Any, scale_inv: Any, *, block: tuple[int, int]) -> Any:
    o, i = weight.shape[-2:]
    s = np.repeat(np.repeat(scale_inv, block[0], axis=-2), block[1], axis=-1)[..., :o, :i]
    return (weight.astype(np.float32) * s).astype(ml_dtypes.bfloat16)


def swizzle_blockscale(scale: Any) -> Any:
    raw = np.asarray(scale).view(np.uint8)
    batched = raw.ndim == 3
    b = raw if batched else raw[None]
    n, m, k = b.shape
    mp, kp = -(-m // 128) * 128, -(-k // 4) * 4
    pad = np.zeros((n, mp, kp), dtype=np.uint8)
    pad[:, :m, :k] = b
    sw = pad.reshape(n, mp // 128, 4, 32, kp // 4, 4).transpose(0, 1, 4, 3, 2, 5)
    out = np.ascontiguousarray(sw).reshape(n, mp, kp)  # [B, M_pad, K_pad]
    return out if batched else out[0]


OPS = SimpleNamespace(
    **{k: getattr(numpy_ops, k) for k in dir(numpy_ops) if not k.startswith("_")},
    dequant_nvfp4=dequant_nvfp4,
    dequant_fp8_block=dequant_fp8_block,
    swizzle_blockscale=swizzle_blockscale,
)
BACKEND = Backend("numpy", OPS, device=False)
