"""``python -m benchmarks --reload``: loading a rank's ``--out`` file back, beside a memcpy.

One rank's share (tp 8 x ep 8, rank 0) of the 4-layer sparse real-geometry checkpoint is bound
to a file once; then, interleaved (A B C A B C ...), each on a warm page cache:
- ``open_bound(path, copy=True)``: checks, then the data read into one fresh buffer;
- ``safetensors.numpy.load_file``: the library's loader, for reference;
- memcpy: the same number of bytes copied from a warm buffer into a fresh one (``np.empty``,
  so its page faults count as the loaders' do).
Target (issue #15): the reload at >= 0.7 of memcpy throughput. Minima and medians.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from specbind.core.errors import SpecbindError


def run(table: Any, cache: Path, repeat: int) -> dict[str, Any]:
    from safetensors.numpy import load_file

    from benchmarks.common import interleaved
    from benchmarks.scale import ensure_sparse
    from specbind.api import open_bound

    ckpt = ensure_sparse(table, cache, 4)
    out = cache / "reload-tp8-ep8.safetensors"
    cmd = [sys.executable, "-m", "specbind", "bind", str(ckpt), "--tp-size", "8", "--tp-rank",
           "0", "--ep-size", "8", "--out", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SpecbindError(f"bench --reload: the bind failed: {proc.stderr.strip()}")
    try:
        nbytes = open_bound(out).bytes
        src = np.ones(nbytes, dtype=np.uint8)

        def memcpy() -> object:
            dst = np.empty_like(src)
            np.copyto(dst, src)
            return dst

        times = interleaved(
            {
                "open_bound_copy": lambda: open_bound(out, copy=True),
                "safetensors_load_file": lambda: load_file(out),
                "memcpy": memcpy,
            },
            max(5, repeat),
        )
    finally:
        out.unlink(missing_ok=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    mins = {k: min(v) for k, v in times.items()}
    return {
        "bytes": nbytes, "repeat": max(5, repeat), "median_s": med, "min_s": mins,
        "reload_share_of_memcpy": med["memcpy"] / med["open_bound_copy"],
        "reload_share_of_memcpy_min": mins["memcpy"] / mins["open_bound_copy"],
        "load_file_share_of_memcpy": med["memcpy"] / med["safetensors_load_file"],
    }  # fmt: skip


def render(r: dict[str, Any]) -> str:
    m, n = r["median_s"], r["min_s"]
    return (
        f"reload of a tp 8 x ep 8 rank file ({r['bytes'] / 1e9:.2f} GB, {r['repeat']} "
        f"interleaved rounds): open_bound(copy=True) {m['open_bound_copy']:.3f} s (min "
        f"{n['open_bound_copy']:.3f}), safetensors load_file {m['safetensors_load_file']:.3f} s "
        f"(min {n['safetensors_load_file']:.3f}), memcpy {m['memcpy']:.3f} s (min "
        f"{n['memcpy']:.3f}); reload at {r['reload_share_of_memcpy']:.2f} of memcpy "
        f"(min {r['reload_share_of_memcpy_min']:.2f}), load_file at "
        f"{r['load_file_share_of_memcpy']:.2f}"
    )
