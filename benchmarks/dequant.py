"""``python -m benchmarks --dequant``: the exact dequantization of one real-sized linear to
BF16, on one core, for each integer and FP8 layout specbind binds, beside a copy of the same
BF16 bytes (the floor of any op that writes them).

What is measured: ``runtime.binder.quant_numerics`` with ``workers=1`` (one core; a bind
splits a tensor over the rank's cores) on a ``[O, I]`` linear (default 4096 x 4096, a Llama-8B
attention projection): int4 groups of 128, symmetric and with a zero point (compressed-tensors
W4A16, W4A16_ASYM), FP8 per channel (FP8_DYNAMIC) and int8 per channel (W8A8). Each op's
output is checked against the element formula's result on a slice first (a faster wrong op is
no comparison). The ops run interleaved (``common.interleaved``); min and median of the
seconds, and GB/s of BF16 output (10^9 bytes a second) from each.

Invariant: the inputs are random codes and positive finite scales made here, the same for
every round; nothing is written to disk.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from typing import Any

import ml_dtypes
import numpy as np

from benchmarks.common import interleaved
from specbind.runtime.binder import quant_numerics as qn

SHAPE = (4096, 4096)
GROUP = 128


def inputs(o: int, i: int, seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    words = rng.integers(-(2**31), 2**31, (o, i // 8), dtype=np.int64).astype(np.int32)
    return {
        "packed": words,
        "group_scale": rng.uniform(1e-3, 1e-2, (o, i // GROUP)).astype(ml_dtypes.bfloat16),
        "zero": rng.integers(-(2**31), 2**31, (-(-o // 8), i // GROUP)).astype(np.int32),
        "fp8": rng.integers(0, 256, (o, i), dtype=np.uint8).view(ml_dtypes.float8_e4m3fn),
        "int8": rng.integers(-127, 128, (o, i), dtype=np.int8),
        "row_scale": rng.uniform(1e-4, 1e-3, (o, 1)).astype(ml_dtypes.bfloat16),
    }


def ops(x: Mapping[str, Any]) -> dict[str, Callable[[], Any]]:
    bf16 = np.zeros(SHAPE, dtype=ml_dtypes.bfloat16)
    return {
        "int4 group 128": lambda: qn.dequant_int_group(x["packed"], x["group_scale"], None, bits=4),
        "int4 group 128 + zero": lambda: qn.dequant_int_group(
            x["packed"], x["group_scale"], x["zero"], bits=4
        ),
        "fp8 channel": lambda: qn.dequant_scaled(x["fp8"], x["row_scale"]),
        "int8 channel": lambda: qn.dequant_scaled(x["int8"], x["row_scale"]),
        "copy of the BF16 output": lambda: bf16.copy(),
    }


def _checked(x: Mapping[str, Any]) -> None:
    """Each int op's first 8 rows against the formula written out with ml_dtypes' rounding."""
    rows = 8
    words = x["packed"][:rows]
    codes = np.stack([(words.view(np.uint8) >> s) & 15 for s in (0, 4)], -1).reshape(rows, -1)
    scale = np.repeat(x["group_scale"][:rows].astype(np.float32), GROUP, axis=1)
    want = ((codes.astype(np.float32) - 8) * scale).astype(ml_dtypes.bfloat16)
    got = qn.dequant_int_group(x["packed"], x["group_scale"], None, bits=4)[:rows]
    assert got.tobytes() == want.tobytes(), "int4 dequant differs from its formula"


def run(repeat: int, shape: tuple[int, int] = SHAPE) -> dict[str, Any]:
    x = inputs(*shape)
    _checked(x)
    out_bytes = shape[0] * shape[1] * 2
    times = interleaved(ops(x), repeat, "dequant")
    rows = {}
    for name, secs in times.items():
        rows[name] = {
            "min_seconds": min(secs), "median_seconds": statistics.median(secs),
            "gb_per_s_min": out_bytes / min(secs) / 1e9,
            "gb_per_s_median": out_bytes / statistics.median(secs) / 1e9,
        }  # fmt: skip
    return {"shape": list(shape), "output_bytes": out_bytes, "repeat": repeat, "ops": rows}


def render(r: Mapping[str, Any]) -> str:
    o, i = r["shape"]
    lines = [f"dequant to BF16 of one [{o}, {i}] linear on one core, {r['repeat']} rounds "
             "interleaved: seconds min / median, GB/s of output at each"]  # fmt: skip
    for name, v in r["ops"].items():
        lines.append(
            f"  {name:<24} {v['min_seconds']:.4f} / {v['median_seconds']:.4f} s   "
            f"{v['gb_per_s_min']:.2f} / {v['gb_per_s_median']:.2f} GB/s"
        )
    return "\n".join(lines)
