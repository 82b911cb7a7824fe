"""A stand-in for CuPy on machines without a GPU: host arrays, and a ``RawModule`` whose
kernels run through the CPU harness (the generated CUDA source compiled as C++).

It implements only what specbind's CuPy backend and launch wrappers use, so the whole device
code path — argument checks, grids, kernel calls, cuBLAS-shaped matmuls — runs in CI.
"""

from __future__ import annotations

import ctypes
import sys
import types
from typing import Any

import numpy as np
from kernels_cpu import library


class ndarray(np.ndarray):  # type: ignore[type-arg]
    @property
    def device(self) -> Any:
        return types.SimpleNamespace(id=0)

    def get(self) -> np.ndarray:  # type: ignore[type-arg]
        return np.array(self, copy=True).view(np.ndarray)


def _dev(a: Any) -> ndarray:
    return np.asarray(a).view(ndarray)


class _Function:
    def __init__(self, lib: ctypes.CDLL, name: str) -> None:
        self.fn = getattr(lib, f"launch_{name}")
        self.fn.restype = None

    def __call__(self, grid: tuple[int], block: tuple[int], args: tuple[Any, ...]) -> None:
        c_args: list[Any] = [ctypes.c_uint(grid[0]), ctypes.c_uint(block[0])]
        for a in args:
            if isinstance(a, np.ndarray) and a.ndim > 0:
                assert a.flags.c_contiguous
                c_args.append(ctypes.c_void_p(a.ctypes.data))
            elif isinstance(a, np.float32):
                c_args.append(ctypes.c_float(float(a)))
            elif isinstance(a, np.int64):
                c_args.append(ctypes.c_longlong(int(a)))
            elif isinstance(a, np.int32):
                c_args.append(ctypes.c_int(int(a)))
            else:
                raise TypeError(f"fake cupy: unsupported kernel argument {type(a).__name__}")
        self.fn(*c_args)


def install(build_dir: str) -> types.ModuleType:
    """Register a fake ``cupy`` module in ``sys.modules`` and return it."""
    lib = library(build_dir)
    cp = types.ModuleType("cupy")
    cp.ndarray = ndarray  # type: ignore[attr-defined]
    cp.float32, cp.int64, cp.uint16 = np.float32, np.int64, np.uint16  # type: ignore[attr-defined]
    cp.int32 = np.int32  # type: ignore[attr-defined]
    cp.broadcast_to = lambda a, shape: np.broadcast_to(a, shape).view(ndarray)  # type: ignore[attr-defined]
    cp.empty = lambda shape, dtype: np.empty(shape, dtype=dtype).view(ndarray)  # type: ignore[attr-defined]
    cp.asarray = _dev  # type: ignore[attr-defined]
    cp.ascontiguousarray = lambda a: np.ascontiguousarray(a).view(ndarray)  # type: ignore[attr-defined]
    cp.concatenate = lambda parts, axis=0: np.concatenate(parts, axis=axis).view(ndarray)  # type: ignore[attr-defined]
    cp.matmul = lambda a, b: np.matmul(a, b).view(ndarray)  # type: ignore[attr-defined]
    cp.stack = lambda parts, axis=0: np.stack(parts, axis=axis).view(ndarray)  # type: ignore[attr-defined]
    cp.RawModule = lambda code, options=(): types.SimpleNamespace(  # type: ignore[attr-defined]
        get_function=lambda name: _Function(lib, name)
    )
    cp.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        runtime=types.SimpleNamespace(getDeviceCount=lambda: 1),
        Device=lambda: types.SimpleNamespace(id=0),
    )
    sys.modules["cupy"] = cp
    return cp
