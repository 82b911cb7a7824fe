"""What an engine layout's ``apply`` and ``dtype`` make of a field (specbind/engine_ops.py): the
bytes the engine's own loader makes, so torch's kernels and torch's rounding are the reference.

Trap: NumPy's F32 ``exp`` is not torch's (it differs in the last bits for a large share of
inputs), so a check against NumPy would pass a layout vLLM's loader disagrees with.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

from specbind.core.errors import BindError
from specbind.engine_ops import apply_values

torch = pytest.importorskip("torch")


def _bf16_valued(n: int, seed: int = 0) -> np.ndarray:
    """F32 values a BF16 checkpoint can hold (an A_log read from BF16), [n]."""
    x = torch.from_numpy(np.random.default_rng(seed).normal(0, 1.5, n).astype(np.float32))
    return x.to(torch.bfloat16).float().numpy()


def test_exp_then_neg_gives_torchs_bytes_where_numpys_exp_gives_others() -> None:
    x = _bf16_valued(4096)
    got = apply_values(x, ("exp", "neg"), "F32", "mixer.A")
    want = (-torch.exp(torch.from_numpy(x))).numpy()
    assert got.dtype == np.float32 and got.tobytes() == want.tobytes()
    # the claim has teeth: NumPy's exp differs from torch's somewhere on these inputs
    assert (-np.exp(x)).tobytes() != want.tobytes()


def test_dtype_bf16_rounds_an_f32_field_to_nearest_even_as_torchs_copy_does() -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(0, 3, 4096).astype(np.float32)
    # exact halfway cases: BF16 keeps the high 16 bits, so low bits 0x8000 is a tie
    ties = (rng.integers(0x3F000000, 0x40000000, 64, dtype=np.uint32) & ~np.uint32(0xFFFF)) | 0x8000
    x = np.concatenate([x, ties.view(np.float32)])
    got = apply_values(x, (), "BF16", "mixer.D")
    want = torch.empty(x.shape, dtype=torch.bfloat16)
    want.copy_(torch.from_numpy(x))  # what vLLM's loader does into a BF16 parameter
    assert got.view(np.uint16).tobytes() == want.view(torch.int16).numpy().tobytes()


def test_rounding_a_finite_f32_past_bf16s_range_is_refused_naming_the_index() -> None:
    x = np.array([1.0, 3.4e38], dtype=np.float32)
    with pytest.raises(BindError, match=r"'mixer\.D'.*index \[1\].*non-finite"):
        apply_values(x, (), "BF16", "mixer.D")


def test_apply_without_torch_is_refused_naming_the_parameter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    with pytest.raises(BindError, match=r"'mixer\.A': exp then neg must run on torch's kernels"):
        apply_values(_bf16_valued(8), ("exp", "neg"), "F32", "mixer.A")
