"""Bandwidth of each generated kernel on a GPU, beside a device-to-device copy of the same
bytes, in one run (``make gpu-check``). Needs CuPy and a CUDA device."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from functools import partial
from typing import Any

from specbind.runtime import backends


def _time(cp: Any, fn: Callable[[], object], repeat: int = 20) -> float:
    fn()
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(repeat):
        fn()
    stop.record()
    stop.synchronize()
    return float(cp.cuda.get_elapsed_time(start, stop)) / 1e3 / repeat


def run(n: int = 64 << 20) -> list[dict[str, Any]]:
    from specbind.generated import kernels as k

    backends.cupy_backend(k)  # a clear error when CuPy or a device is missing
    import cupy as cp  # type: ignore[import-not-found, unused-ignore]

    bits = cp.random.randint(0, 1 << 16, size=n, dtype=cp.uint16)
    f32 = k.widen_bf16_f32(bits)
    rows = n // 4096
    grid = bits[: rows * 4096].reshape(rows, 4096)  # [n] -> [rows, 4096]
    third = n // 12 * 4
    parts = [bits[:third].reshape(-1, 4) for _ in range(3)]  # [third] -> [third / 4, 4]
    cases: list[tuple[str, Callable[[], object], int]] = [
        ("widen_bf16_f32", lambda: k.widen_bf16_f32(bits), 6 * n),
        ("narrow_f32_bf16", lambda: k.narrow_f32_bf16(f32), 6 * n),
        ("scale_bf16", lambda: k.scale_bf16(bits, 0.125), 4 * n),
        (
            "gather_cols_b2, 1/8 of the columns",
            lambda: k.gather_cols_b2(grid, 1024, 512),
            4 * rows * 512,
        ),
        ("concat_rows_3_b2", lambda: k.concat_rows_3_b2(parts), 4 * 3 * third),
    ]
    out = []
    for name, fn, moved in cases:
        src = cp.empty(moved // 2, dtype=cp.uint8)
        dst = cp.empty_like(src)
        kernel_s = _time(cp, fn)
        copy_s = _time(cp, partial(cp.copyto, dst, src))  # reads and writes the same byte count
        out.append(
            {
                "kernel": name,
                "bytes_moved": moved,
                "kernel_gbps": moved / kernel_s / 1e9,
                "d2d_copy_gbps": moved / copy_s / 1e9,
                "kernel_over_copy": copy_s / kernel_s,
            }
        )
    return out


if __name__ == "__main__":
    rows = run()
    if "--json" in sys.argv:
        print(json.dumps(rows, indent=2))
    else:
        print("| kernel | GB moved | kernel GB/s | D2D copy GB/s | kernel / copy |")
        print("|---|---:|---:|---:|---:|")
        for r in rows:
            print(f"| {r['kernel']} | {r['bytes_moved'] / 1e9:.2f} | {r['kernel_gbps']:.0f} | "
                  f"{r['d2d_copy_gbps']:.0f} | {r['kernel_over_copy']:.2f} |")  # fmt: skip
