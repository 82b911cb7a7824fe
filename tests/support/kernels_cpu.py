"""Build the generated CUDA kernels as a host shared library and call them through ctypes."""

from __future__ import annotations

import ctypes
import hashlib
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
KERNELS = REPO / "generated" / "kernels"
EMU = REPO / "tests" / "kernel_harness" / "cuda_emu.h"


@cache
def library(build_dir: str) -> ctypes.CDLL:
    src = (
        (KERNELS / "host_launch.cpp").read_bytes()
        + (KERNELS / "specbind.cu").read_bytes()
        + EMU.read_bytes()
    )
    out = Path(build_dir) / f"specbind_kernels_{hashlib.sha256(src).hexdigest()[:12]}.so"
    if not out.exists():
        cxx = shutil.which("g++") or shutil.which("c++") or "g++"
        cmd = [cxx, "-std=c++17", "-O2", "-fPIC", "-shared", "-fno-fast-math", "-ffp-contract=off",
               "-include", str(EMU), "-I", str(KERNELS), "-x", "c++", str(KERNELS / "host_launch.cpp"), "-o", str(out)]  # fmt: skip
        subprocess.run(cmd, check=True, capture_output=True, text=True)
    return ctypes.CDLL(str(out))


def ptr(a: np.ndarray[Any, Any]) -> ctypes.c_void_p:
    assert a.flags.c_contiguous
    return ctypes.c_void_p(a.ctypes.data)


def launch(lib: ctypes.CDLL, kernel: str, n: int, *args: Any, block: int = 256) -> None:
    """Launch as the CuPy wrapper would: the same grid for the same n."""
    grid = max(1, min(65535 * 16, (n + block - 1) // block))
    fn = getattr(lib, f"launch_{kernel}")
    fn.restype = None
    fn(ctypes.c_uint(grid), ctypes.c_uint(block), *args)
