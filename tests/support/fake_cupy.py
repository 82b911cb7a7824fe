"""A stand-in for CuPy on machines without a GPU: host arrays, and a ``RawModule`` whose
kernels run through the CPU harness (the generated CUDA source compiled as C++).

It implements only what specbind's CuPy backend and launch wrappers use, so the whole device
code path — argument checks, grids, kernel calls, cuBLAS-shaped matmuls — runs in CI.
"""

from __future__ import annotations

import ctypes
import sys
import time
import types
from typing import Any

import numpy as np
from kernels_cpu import library


class ndarray(np.ndarray):  # type: ignore[type-arg]
    @property
    def device(self) -> Any:
        return types.SimpleNamespace(id=0)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """Where the bytes start, as CuPy says it (here, host memory)."""
        return {"shape": self.shape, "typestr": self.dtype.str, "version": 3,
                "data": (int(self.ctypes.data), False), "strides": None}  # fmt: skip

    def set(self, arr: Any, stream: Any = None) -> None:
        np.copyto(self, np.asarray(arr).reshape(self.shape))

    def get(self) -> np.ndarray:  # type: ignore[type-arg]
        return np.array(self, copy=True).view(np.ndarray)


_RNG = np.random.default_rng(0)


class _Event:
    """A CUDA event's record and synchronize, on the host clock."""

    t = 0.0

    def record(self) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        pass


def _quiet(fn: Any) -> Any:
    """``fn`` on device arrays, without NumPy's floating-point warnings (a GPU raises none)."""

    def call(*args: Any) -> ndarray:
        with np.errstate(all="ignore"):
            return np.asarray(fn(*args)).view(ndarray)

    return call


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
    cp = make(build_dir)
    sys.modules["cupy"] = cp
    return cp


def make(build_dir: str) -> types.ModuleType:
    """A fake ``cupy`` module, not registered anywhere (the GPU check's CPU harness: the
    generated wrappers run against it on the host, beside the real CuPy)."""
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
    cp.ones = lambda shape, dtype=np.float64: np.ones(shape, dtype=dtype).view(ndarray)  # type: ignore[attr-defined]
    cp.ldexp = _quiet(np.ldexp)  # type: ignore[attr-defined]
    cp.take = lambda a, i, axis=None: np.take(a, i, axis=axis).view(ndarray)  # type: ignore[attr-defined]
    cp.stack = lambda parts, axis=0: np.stack(parts, axis=axis).view(ndarray)  # type: ignore[attr-defined]
    cp.RawModule = lambda code, options=(): types.SimpleNamespace(  # type: ignore[attr-defined]
        get_function=lambda name: _Function(lib, name)
    )
    cp.uint8, cp.float16 = np.uint8, np.float16  # type: ignore[attr-defined]
    cp.full = lambda shape, v, dtype: np.full(shape, v, dtype=dtype).view(ndarray)  # type: ignore[attr-defined]
    cp.empty_like = lambda a: np.empty_like(a).view(ndarray)  # type: ignore[attr-defined]
    cp.copyto = np.copyto  # type: ignore[attr-defined]
    cp.random = types.SimpleNamespace(  # type: ignore[attr-defined]
        randint=lambda lo, hi, size, dtype: _RNG.integers(lo, hi, size=size, dtype=dtype).view(
            ndarray
        )
    )
    cp.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        runtime=types.SimpleNamespace(getDeviceCount=lambda: 1),
        Device=lambda: types.SimpleNamespace(id=0, synchronize=lambda: None),
        Event=_Event,
        get_elapsed_time=lambda a, b: (b.t - a.t) * 1e3,  # milliseconds, as CuPy's
        alloc_pinned_memory=bytearray,  # host memory that is just memory
        Stream=lambda non_blocking=False: types.SimpleNamespace(synchronize=lambda: None),
    )
    return cp
