"""safetensors dtype names, their widths and the NumPy dtype each is read as.

Invariant: BF16 is ``ml_dtypes.bfloat16`` and F8 types are ml_dtypes' — bytes are never
reinterpreted as another width. A dtype with no NumPy form (packed F4) can be audited but not
bound as an array.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from specbind.core.record import record


@record
class DType:
    name: str
    bits: int
    numpy: np.dtype[np.generic] | None

    def nbytes(self, shape: tuple[int, ...]) -> int:
        n = 1
        for d in shape:
            n *= d
        return (n * self.bits + 7) // 8


def _d(name: str, bits: int, np_type: object | None) -> DType:
    return DType(name, bits, None if np_type is None else np.dtype(np_type))  # type: ignore[call-overload]


DTYPES: dict[str, DType] = {
    d.name: d
    for d in (
        _d("BOOL", 8, np.bool_),
        _d("U8", 8, np.uint8),
        _d("I8", 8, np.int8),
        _d("U16", 16, np.uint16),
        _d("I16", 16, np.int16),
        _d("U32", 32, np.uint32),
        _d("I32", 32, np.int32),
        _d("U64", 64, np.uint64),
        _d("I64", 64, np.int64),
        _d("F16", 16, np.float16),
        _d("BF16", 16, ml_dtypes.bfloat16),
        _d("F32", 32, np.float32),
        _d("F64", 64, np.float64),
        _d("F8_E4M3", 8, ml_dtypes.float8_e4m3fn),
        _d("F8_E5M2", 8, ml_dtypes.float8_e5m2),
        _d("F8_E8M0", 8, ml_dtypes.float8_e8m0fnu),
        _d("F4", 4, None),
    )
}

QUANT_DTYPES = frozenset({"U8", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F4"})


def dtype_name(arr: np.ndarray[Any, Any]) -> str:
    """The safetensors name of an array's dtype (for writing bound weights back out)."""
    for d in DTYPES.values():
        if d.numpy is not None and d.numpy == arr.dtype:
            return d.name
    raise ValueError(f"no safetensors dtype for {arr.dtype}")


def bf16_ulp(x: Any) -> np.ndarray[Any, Any]:
    """The BF16 spacing at each |x|: 2**(e - 8) for x = m·2**e with 0.5 <= |m| < 1 (BF16 keeps
    8 significant bits). Below the smallest normal BF16, 2**-126, the spacing stays 2**-133."""
    _, e = np.frexp(np.maximum(np.abs(np.asarray(x, dtype=np.float64)), 2.0**-126))
    spacing: np.ndarray[Any, Any] = np.ldexp(1.0, e - 8)
    return spacing


def within_one_bf16_ulp(got: Any, want: Any) -> bool:
    """Every element of ``got`` within one BF16 ulp of ``want`` (the ulp at ``want``)."""
    g, w = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    return bool(np.all(np.abs(g - w) <= bf16_ulp(w)))
