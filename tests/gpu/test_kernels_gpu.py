"""The generated kernels on a real GPU, bit for bit against ml_dtypes/NumPy, and the CuPy
backend's bound weights against the NumPy backend's."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
from budget import examples
from hypothesis import given, settings
from hypothesis import strategies as st

U16, U32, F32 = np.uint16, np.uint32, np.float32


def cp() -> Any:
    return importlib.import_module("cupy")


def k() -> Any:
    return importlib.import_module("specbind.generated.kernels")


def test_widen_matches_ml_dtypes_for_every_bf16_bit_pattern() -> None:
    bits = np.arange(1 << 16, dtype=U16)
    got = k().widen_bf16_f32(cp().asarray(bits)).get().view(U32)
    assert np.array_equal(got, bits.view(ml_dtypes.bfloat16).astype(F32).view(U32))


def test_narrow_matches_ml_dtypes_at_every_tie_and_special_value() -> None:
    base = np.arange(1 << 16, dtype=U32) << 16
    bits = np.concatenate(
        [base, base | 0x8000, base | 0x7FFF, base | 0x8001, base | 1, base | 0xFFFF]
    )
    got = k().narrow_f32_bf16(cp().asarray(bits.view(F32))).get()
    with np.errstate(invalid="ignore"):
        want = bits.view(F32).astype(ml_dtypes.bfloat16).view(U16)
    assert np.array_equal(got, want)


@settings(max_examples=examples(2), deadline=None)
@given(st.lists(st.integers(0, 2**16 - 1), max_size=5000), st.floats(width=32, allow_nan=False))
def test_scale_equals_widen_multiply_narrow(raw: list[int], factor: float) -> None:
    bits = np.array(raw, dtype=U16)
    got = k().scale_bf16(cp().asarray(bits), factor).get()
    with np.errstate(all="ignore"):
        want = (
            (bits.view(ml_dtypes.bfloat16).astype(F32) * F32(factor))
            .astype(ml_dtypes.bfloat16)
            .view(U16)
        )
    assert np.array_equal(got, want)


@settings(max_examples=examples(2), deadline=None)
@given(st.integers(0, 300), st.integers(1, 700), st.data())
def test_gather_cols_equals_numpy_slicing(rows: int, cols: int, data: st.DataObject) -> None:
    col0 = data.draw(st.integers(0, cols))
    width = data.draw(st.integers(0, cols - col0))
    x = np.random.default_rng(rows + cols).integers(0, 2**16, size=(rows, cols), dtype=U16)
    got = k().gather_cols_b2(cp().asarray(x), col0, width).get()
    assert np.array_equal(got, x[:, col0 : col0 + width])


@settings(max_examples=examples(2), deadline=None)
@given(st.lists(st.integers(0, 3000), min_size=3, max_size=3), st.integers(1, 9))
def test_concat_rows_equals_numpy_concatenate(lengths: list[int], width: int) -> None:
    rng = np.random.default_rng(sum(lengths))
    parts = [rng.integers(0, 2**16, size=(n, width), dtype=U16) for n in lengths]
    got = k().concat_rows_3_b2([cp().asarray(p) for p in parts]).get()
    assert np.array_equal(got, np.concatenate(parts))


def test_the_cupy_backend_binds_the_numpy_backends_bytes(tmp_path: Path) -> None:
    from specbind.core.dtypes import within_one_bf16_ulp
    from specbind.generated import MODELS
    from specbind.runtime.bind.bind import bind_checkpoint
    from specbind.runtime.binder import backends
    from specbind.runtime.io.checkpoint import CheckpointDir
    from specbind.synth import synth, tiny_values

    table = MODELS["glm-5.3-flash"]
    synth(table, tmp_path / "ck", tiny_values(table), layers=8, seed=3)
    for tp in (1, 2, 4):
        host = bind_checkpoint(CheckpointDir(tmp_path / "ck"), table, tp_size=tp, progress=False)
        backend = backends.get("cupy", importlib.import_module("specbind.generated.kernels"))
        dev = bind_checkpoint(
            CheckpointDir(tmp_path / "ck"), table, tp_size=tp, progress=False, backend=backend
        )
        on_device = dev.fields()
        for name, (rule, want) in host.fields().items():
            got = backend.to_host(on_device[name][1], rule.dtype)
            if name.endswith("absorb"):  # cuBLAS may sum in another order: within 1 BF16 ulp
                assert within_one_bf16_ulp(got, want), name
            else:
                assert got.tobytes() == want.tobytes(), (tp, name)
