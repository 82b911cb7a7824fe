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
        *_quant_cases(cp, k, n),
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


def _quant_cases(cp: Any, k: Any, n: int) -> list[tuple[str, Callable[[], object], int]]:
    """NVFP4 and FP8-block dequant to BF16 and the block-scale swizzle, each reading ``n``
    bytes of packed weight or scales (moved = bytes read + bytes written)."""
    rows = n // 2048
    packed = cp.random.randint(0, 256, size=(rows, 2048), dtype=cp.uint8)  # [O, I/2], I = 4096
    scale = cp.full((rows, 256), 0x38, dtype=cp.uint8)  # [O, I/16] E4M3 1.0
    one = cp.ones(1, dtype=cp.float32)
    w8 = packed.reshape(rows // 2, 4096)  # [n] bytes -> [O, I] F8 bits
    s8 = cp.ones((-(-(rows // 2) // 128), 32), dtype=cp.float32)  # [O/128, I/128]
    sw = packed.reshape(n // 256, 256)  # [n] bytes -> [M, K] scales
    nvfp4 = partial(k.dequant_nvfp4_bf16, packed, scale, one, 16, False, False)
    return [
        ("dequant_nvfp4_bf16, group 16", nvfp4, n + n // 8 + 4 * n),
        ("dequant_fp8_block_bf16, 128x128", lambda: k.dequant_fp8_block_bf16(w8, s8, 128, 128),
         3 * n),
        ("swizzle_blockscale_b1", lambda: k.swizzle_blockscale_b1(sw), 2 * n),
    ]  # fmt: skip


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
