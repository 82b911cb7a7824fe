"""tests/gpu: the kernel properties again, on a real GPU through CuPy. Skipped, with the
reason, where CuPy or a CUDA device is missing (`make gpu-check` runs them where one is)."""

from __future__ import annotations

import importlib
from typing import Any

import pytest


def _why_not() -> str | None:
    try:
        cp: Any = importlib.import_module("cupy")
    except ImportError as e:
        return f"CuPy is not installed ({e}); `make gpu-check` installs the gpu extra"
    try:
        if int(cp.cuda.runtime.getDeviceCount()) < 1:
            return "no CUDA device is visible"
    except Exception as e:
        return f"no usable CUDA device: {type(e).__name__}: {e}"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    why = _why_not()
    if why is None:
        return
    skip = pytest.mark.skip(reason=f"GPU tests skipped: {why}")
    for item in items:
        if "tests/gpu/" in item.nodeid:
            item.add_marker(skip)
