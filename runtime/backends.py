"""Where bound weights live: host memory (NumPy) or a CUDA device (CuPy).

A backend uploads the checked, sharded host arrays once and supplies the ops that build the
derived fields. Invariants: only this rank's bytes are uploaded, each tensor once; the host
checks (names, dtypes, shapes, bytes) all run before any upload; on the device BF16 travels
as ``uint16`` bits and F8 as ``uint8`` bits, each tagged back (ml_dtypes) when copied to the
host.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import ml_dtypes
import numpy as np

from specbind.core.dtypes import DTYPES
from specbind.core.errors import SpecbindError
from specbind.core.record import record
from specbind.runtime import ops as numpy_ops
from specbind.runtime.checks import Array
from specbind.runtime.ops import Ops

F8 = tuple(
    np.dtype(t) for t in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, ml_dtypes.float8_e8m0fnu)
)


@record
class Backend:
    name: str
    ops: Ops
    device: bool

    def upload(self, host: Mapping[str, Array]) -> dict[str, Any]:
        if not self.device:
            return dict(host)
        cp = importlib.import_module("cupy")
        out: dict[str, Any] = {}
        for name, a in host.items():
            bits = a.view(np.uint16) if a.dtype == ml_dtypes.bfloat16 else a
            if a.dtype in F8:  # CuPy has no F8 dtypes: the device holds their bits
                bits = a.view(np.uint8)
            out[name] = cp.asarray(bits)  # one host-to-device copy of this rank's bytes
        return out

    def to_host(self, a: Any, dtype: str) -> Array:
        if not self.device:
            out: Array = a
            return out
        host: Array = a.get()
        tagged = DTYPES[dtype].numpy
        if dtype == "BF16" or tagged in F8:
            assert tagged is not None
            return host.view(tagged)
        return host


NUMPY = Backend("numpy", numpy_ops, device=False)


def cupy_backend(kernels: Any) -> Backend:
    """The CuPy backend running the generated ``kernels`` module, or a clear error naming what
    is missing (CuPy, or a CUDA device)."""
    try:
        cp = importlib.import_module("cupy")
    except ImportError as e:
        raise SpecbindError(
            f"--backend cupy needs CuPy (pip install 'specbind[gpu]'): {e}"
        ) from None
    try:
        count = int(cp.cuda.runtime.getDeviceCount())
    except Exception as e:  # CUDARuntimeError, or a driver that is not there
        raise SpecbindError(
            f"--backend cupy needs a CUDA device: {type(e).__name__}: {e}"
        ) from None
    if count < 1:
        raise SpecbindError("--backend cupy needs a CUDA device: none is visible")
    from specbind.runtime import ops_cupy

    ops_cupy.use(kernels)
    return Backend("cupy", ops_cupy, device=True)


def get(name: str, kernels: Any = None) -> Backend:
    """A backend by name; ``cupy`` runs the generated ``kernels`` module it is handed."""
    if name == "numpy":
        return NUMPY
    if name == "cupy":
        return cupy_backend(kernels)
    raise SpecbindError(f"unknown backend {name!r} (numpy or cupy)")
