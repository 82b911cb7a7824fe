"""``python -m benchmarks.digest``: what the bound file's content digests cost.

Three rows, each interleaved (A B A B ...) after a warm-up round, minima and medians:
- hash throughput on one buffer in memory (256 MiB): XXH3-64, XXH3-128 (the one used),
  BLAKE2b-128, CRC32, SHA-256;
- ``bind --out`` of a synth checkpoint in process (``StreamWriter``), with the digests and
  with the hasher replaced by a no-op;
- ``open_bound`` of that file, copies and views, with and without ``_verify``.
The "without" variants exist only here (monkeypatched); the product always digests.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import statistics
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import xxhash

SYNTH = ["--set", "hidden=1024", "--set", "moe_intermediate=512", "--set", "intermediate=2048",
         "--set", "experts=64", "--set", "vocab=16384", "--layers", "3"]  # fmt: skip


class _NoHash:
    def update(self, data: object) -> None:
        pass

    def hexdigest(self) -> str:
        return "0" * 32


def hashes(repeat: int, size: int = 256 << 20) -> dict[str, list[float]]:
    from benchmarks.common import interleaved

    buf = os.urandom(size)
    fns: dict[str, Callable[[], object]] = {
        "xxh3_64": lambda: xxhash.xxh3_64(buf).digest(),
        "xxh3_128": lambda: xxhash.xxh3_128(buf).digest(),
        "blake2b_128": lambda: hashlib.blake2b(buf, digest_size=16).digest(),
        "crc32": lambda: zlib.crc32(buf),
        "sha256": lambda: hashlib.sha256(buf).digest(),
    }
    return interleaved(fns, repeat)


def binds(ck: Path, out: Path, repeat: int) -> tuple[dict[str, list[float]], int]:
    from benchmarks.common import interleaved
    from specbind.cli import main
    from specbind.runtime.bound import stream_out

    args = ["bind", str(ck), "--out", str(out)]

    def bind() -> object:
        with contextlib.redirect_stdout(io.StringIO()):  # the bind's table
            return main(args)

    def plain() -> object:
        with mock.patch.object(stream_out, "tensor_hasher", lambda *a: _NoHash()):
            return bind()

    times = interleaved({"bind_out_digests": bind, "bind_out_none": plain}, repeat)
    bind()  # leave a file with digests for the reload row
    return times, out.stat().st_size


def reloads(out: Path, repeat: int) -> dict[str, list[float]]:
    from benchmarks.common import interleaved
    from specbind.api import open_bound
    from specbind.runtime.bound import reload

    def without(copy: bool) -> object:
        with mock.patch.object(reload, "_verify", lambda *a: None):
            return open_bound(out, copy=copy)

    fns: dict[str, Callable[[], object]] = {
        "copy_verified": lambda: open_bound(out, copy=True),
        "copy_unverified": lambda: without(True),
        "views_verified": lambda: open_bound(out, copy=False),
        "views_unverified": lambda: without(False),
    }
    return interleaved(fns, repeat)


def _summary(times: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    return {k: {"min": min(v), "median": statistics.median(v)} for k, v in times.items()}


def run(repeat: int, cache: Path) -> dict[str, Any]:
    from specbind.cli import main

    ck, out = cache / "digest-ck", cache / "digest.safetensors"
    if not (ck / "config.json").exists():
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["synth", str(ck), *SYNTH]) == 0
    size = sum(p.stat().st_size for p in ck.iterdir())
    bind_t, out_bytes = binds(ck, out, repeat)
    return {
        "repeat": repeat,
        "load_before": os.getloadavg(),
        "hash_256MiB": _summary(hashes(repeat)),
        "checkpoint_bytes": size,
        "out_bytes": out_bytes,
        "bind": _summary(bind_t),
        "reload": _summary(reloads(out, repeat)),
        "load_after": os.getloadavg(),
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "specbind-bench")
    a = ap.parse_args()
    a.cache.mkdir(parents=True, exist_ok=True)
    print(json.dumps(run(max(5, a.repeat), a.cache), indent=2))
