"""What landing a checkpoint's bytes in memory costs on this machine, whatever the loader.

    python -m benchmarks.floor CKPT [--repeat R] [--threads T]

Every tensor of the checkpoint folder's ``*.safetensors`` files, from a warm page cache (read
once first), T threads (default: the cores) sharing the tensors, R rounds (default 5) of each
way in turn; prints min and median seconds and GB/s of each:
- ``fresh``: ``preadv`` into fresh anonymous maps, one a tensor (what a loader that copies
  every byte into new memory does at best);
- ``faulted``: the same into maps whose pages were touched first (memory reused);
- ``touch``: one byte a page of fresh maps written, nothing read (the first touch alone);
- ``populate``: a private map of each file with every page mapped in
  (``MADV_POPULATE_READ``: the page cache's own pages, nothing copied).
Trap: a fresh map's first touch is the kernel zeroing the page (and, on a virtual machine,
the host backing it); measured here by the byte, so 2 MiB pages do not take it away.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import struct
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

PAGE = mmap.PAGESIZE
MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)

Job = tuple[int, int, int]  # (descriptor, file offset, bytes)


def tensors(ckpt: Path) -> tuple[list[Job], list[int]]:
    """Every tensor's (descriptor, offset, bytes) and the open descriptors."""
    jobs: list[Job] = []
    fds: list[int] = []
    for f in sorted(ckpt.glob("*.safetensors")):
        fd = os.open(f, os.O_RDONLY)
        fds.append(fd)
        (n,) = struct.unpack("<Q", os.pread(fd, 8, 0))
        header = json.loads(os.pread(fd, n, 8))
        for name, info in header.items():
            if name != "__metadata__":
                lo, hi = info["data_offsets"]
                jobs.append((fd, 8 + n + lo, hi - lo))
    if not jobs:
        raise SystemExit(f"{ckpt}: no *.safetensors tensors")
    return jobs, fds


def _read(buf: mmap.mmap, job: Job) -> None:
    fd, offset, n = job
    view = memoryview(buf)
    done = 0
    while done < n:
        got = os.preadv(fd, [view[done:n]], offset + done)
        if got <= 0:
            raise SystemExit("a short read: the checkpoint changed under the bench")
        done += got


def _touch(buf: mmap.mmap) -> None:
    np.frombuffer(buf, np.uint8)[::PAGE] = 1  # one byte a page: each page faulted in


def rounds(jobs: list[Job], fds: list[int], threads: int) -> dict[str, Callable[[], float]]:
    """Each way, as a call that does it once and returns its seconds."""
    pool = ThreadPoolExecutor(threads)

    def maps() -> list[mmap.mmap]:
        return [mmap.mmap(-1, max(n, 1)) for _, _, n in jobs]

    def fresh() -> float:
        bufs = maps()
        t = time.perf_counter()
        list(pool.map(_read, bufs, jobs))
        return time.perf_counter() - t

    def faulted() -> float:
        bufs = maps()
        list(pool.map(_touch, bufs))
        t = time.perf_counter()
        list(pool.map(_read, bufs, jobs))
        return time.perf_counter() - t

    def touch() -> float:
        bufs = maps()
        t = time.perf_counter()
        list(pool.map(_touch, bufs))
        return time.perf_counter() - t

    def populate() -> float:
        t = time.perf_counter()
        for fd in fds:
            size = os.fstat(fd).st_size
            m = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
            m.madvise(MADV_POPULATE_READ, 0, size)
            m.close()
        return time.perf_counter() - t

    return {"fresh": fresh, "faulted": faulted, "touch": touch, "populate": populate}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ckpt", type=Path)
    ap.add_argument("--repeat", type=int, default=5, help="rounds of each way (default 5)")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    args = ap.parse_args(argv)
    if args.repeat < 1 or args.threads < 1:
        ap.error("--repeat and --threads take a positive count")
    jobs, fds = tensors(args.ckpt)
    total = sum(n for _, _, n in jobs)
    for fd, offset, n in jobs:  # the page cache warm, as the loaders' warm rows are
        os.posix_fadvise(fd, offset, n, os.POSIX_FADV_WILLNEED)
    for fd in fds:
        while os.read(fd, 64 << 20):
            pass
    ways = rounds(jobs, fds, args.threads)
    took: dict[str, list[float]] = {w: [] for w in ways}
    for _ in range(args.repeat):
        for way, run in ways.items():
            took[way].append(run())
    print(
        f"{total / 1e9:.3f} GB, {len(jobs)} tensors, {args.threads} threads, "
        f"load {os.getloadavg()[0]:.2f}"
    )
    for way, xs in took.items():
        print(
            f"{way:9s} min {min(xs):.3f} s, median {statistics.median(xs):.3f} s, "
            f"{total / min(xs) / 1e9:.2f} GB/s at the min"
        )


if __name__ == "__main__":
    main()
