"""Bandwidth on a GPU (``make gpu-check`` step 4). Needs CuPy and a CUDA device.

- ``run``: each generated kernel's GB/s beside a device-to-device copy of the same bytes;
- ``transfers``: host-to-device GB/s of the link (one pinned buffer, the best of three), of a
  rank's bytes through two pinned staging buffers on two streams (``Stager``: one host copy
  into a buffer while the other's copy to the device runs), and of the backend's own upload
  (``Backend.upload``: pageable memory);
- ``rank_bind``: one rank of the model's bench slice bound on the host and on the GPU.
Timings are wall clock after a device synchronize (CUDA events for the kernels). Nothing here
is a gate: the check reports each figure beside its target.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from specbind.runtime.binder import backends


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


def _sync(cp: Any) -> None:
    cp.cuda.Device().synchronize()


def _best(cp: Any, fn: Callable[[], object], repeat: int = 3) -> float:
    """The fastest of ``repeat`` runs of ``fn`` (after one warm-up), in seconds."""
    fn()
    _sync(cp)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        _sync(cp)
        best = min(best, time.perf_counter() - t0)
    return best


class Stager:
    """Two pinned host buffers of ``chunk`` bytes and a stream for each, allocated once."""

    def __init__(self, cp: Any, chunk: int = 32 << 20) -> None:
        self.cp, self.chunk = cp, chunk
        self.bufs = [np.frombuffer(cp.cuda.alloc_pinned_memory(chunk), np.uint8, chunk)
                     for _ in "ab"]  # fmt: skip
        self.streams = [cp.cuda.Stream(non_blocking=True) for _ in "ab"]

    def upload(self, arrays: list[Any]) -> list[Any]:
        """Each host array's bytes on the device (flat ``uint8``), the two buffers taking
        turns: while one buffer's copy to the device runs on its stream, the next piece is
        copied into the other."""
        out, turn, chunk = [], 0, self.chunk
        for a in arrays:
            src = np.ascontiguousarray(a).reshape(-1).view(np.uint8)  # [..] -> [bytes]
            dev = self.cp.empty(src.size, dtype=self.cp.uint8)
            for off in range(0, src.size, chunk):
                n = min(chunk, src.size - off)
                buf, stream = self.bufs[turn % 2], self.streams[turn % 2]
                stream.synchronize()  # this buffer's last copy has left it
                buf[:n] = src[off : off + n]
                dev[off : off + n].set(buf[:n], stream=stream)
                turn += 1
            out.append(dev)
        for stream in self.streams:
            stream.synchronize()
        return out


def transfers(cp: Any, arrays: list[Any], link_bytes: int = 256 << 20) -> dict[str, Any]:
    from specbind.generated import kernels as k

    nbytes = sum(int(a.nbytes) for a in arrays)
    pinned = np.frombuffer(cp.cuda.alloc_pinned_memory(link_bytes), np.uint8, link_bytes)
    pinned[:] = 1
    dst = cp.empty(link_bytes, dtype=cp.uint8)
    link_s = _best(cp, lambda: dst.set(pinned))
    stager = Stager(cp)
    staged_s = _best(cp, lambda: stager.upload(arrays))
    device = backends.cupy_backend(k)
    host = {str(i): a for i, a in enumerate(arrays)}
    upload_s = _best(cp, lambda: device.upload(host))
    back = stager.upload(arrays)
    same = all(
        b.get().tobytes() == np.ascontiguousarray(a).reshape(-1).view(np.uint8).tobytes()
        for a, b in zip(arrays, back, strict=True)
    )
    link = link_bytes / link_s / 1e9
    return {
        "rank_bytes": nbytes,
        "link_pinned_gbps": link,
        "staged_pinned_gbps": nbytes / staged_s / 1e9,
        "staged_over_link": nbytes / staged_s / 1e9 / link,
        "staged_bytes_equal": same,
        "backend_upload_pageable_gbps": nbytes / upload_s / 1e9,
    }


def rank_bind(ck: Any, table: Any, tp: int, rank: int, repeat: int = 2) -> dict[str, Any]:
    """One rank of ``ck`` bound on the host (NumPy) and on the GPU (CuPy), best of ``repeat``
    each, and its host fields for ``transfers``."""
    from specbind.generated import kernels as k
    from specbind.runtime.bind.bind import bind_checkpoint

    cp = k.cupy()
    device = backends.cupy_backend(k)

    def host_bind() -> Any:
        return bind_checkpoint(ck, table, tp_size=tp, tp_rank=rank, progress=False)

    def gpu_bind() -> Any:
        return bind_checkpoint(ck, table, tp_size=tp, tp_rank=rank, progress=False,
                               backend=device)  # fmt: skip

    host_s = _best(cp, host_bind, repeat)
    gpu_s = _best(cp, gpu_bind, repeat)
    fields = [a for _, a in host_bind().fields().values()]
    nbytes = sum(int(a.nbytes) for a in fields)
    return {
        "model": table.name, "tp_size": tp, "tp_rank": rank, "rank_bytes": nbytes,
        "host_bind_s": host_s, "gpu_bind_s": gpu_s, "gpu_over_host": host_s / gpu_s,
        "fields": fields,
    }  # fmt: skip


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
