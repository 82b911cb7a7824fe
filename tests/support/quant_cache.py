"""Real-tool checkpoints, written once per machine: a cache outside the clone, keyed by what
determines their bytes.

The key hashes the writer's source (``tests/support/quant_writers.py``), the Python version and the
versions of the tools and libraries it runs (torch, transformers, ModelOpt, llmcompressor, ...),
so a changed writer or an upgraded tool writes afresh; a fresh machine always writes.

Invariants:
- a recipe's folder under the key appears only complete: each writer writes into a private
  ``.writing-*`` folder beside it, which is renamed into place after the writer exits 0 (a
  rename is atomic; a concurrent session that got there first wins, and ours is dropped);
- a failed or killed writer leaves no recipe folder, so a half-written checkpoint is never
  re-used (a killed one's ``.writing-*`` folder is removed by a later run once it is stale);
- at most ``os.cpu_count()`` writers run at once, each on ``cpu_count // writers`` threads.
``SPECBIND_TEST_CACHE`` names another cache folder (default ``$XDG_CACHE_HOME`` or ``~/.cache``,
then ``specbind-tests``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

import patience

WRITER = Path(__file__).with_name("quant_writers.py")
# Everything whose version can change what the writer writes.
PACKAGES = (
    "torch", "transformers", "nvidia-modelopt", "llmcompressor", "compressed-tensors",
    "safetensors", "tokenizers", "accelerate", "datasets", "numpy",
)  # fmt: skip
STALE_WRITING_S = 3 * 3600  # a writer times out after 20 minutes; older staging is abandoned


def cache_root() -> Path:
    env = os.environ.get("SPECBIND_TEST_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specbind-tests"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "absent"


def key(writer: Path = WRITER, deps: Iterable[Path] = ()) -> str:
    """The cache folder's key: the writer's source, the sources it imports (``deps``), the
    Python version and the versions of the tools and libraries it runs."""
    h = hashlib.sha256(writer.read_bytes())
    for d in deps:
        h.update(b"\0" + d.read_bytes())
    h.update(f"\0python {sys.version_info[:3]}".encode())
    for p in PACKAGES:
        h.update(f"\0{p} {_version(p)}".encode())
    return h.hexdigest()[:24]


def written(
    recipes: Iterable[str], writer: Path = WRITER, kind: str = "quant_real",
    deps: Iterable[Path] = (),
) -> dict[str, Path]:  # fmt: skip
    """Each recipe's checkpoint folder: from the cache, or written now (then cached);
    ``writer`` is run as ``python WRITER RECIPE OUT``, its checkpoints kept under ``kind``."""
    folder = cache_root() / kind / key(writer, deps)
    folder.mkdir(parents=True, exist_ok=True)
    _drop_stale_staging(folder)
    out = {r: folder / r for r in recipes}
    todo = [r for r, p in out.items() if not p.is_dir()]
    if todo:
        jobs = max(1, min(len(todo), os.cpu_count() or 1))
        threads = str(max(1, (os.cpu_count() or 1) // jobs))
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            failures = [
                f for f in pool.map(lambda r: _write(writer, r, folder, threads), todo) if f
            ]
        assert not failures, "\n\n".join(failures)
    return out


def _write(writer: Path, recipe: str, folder: Path, threads: str) -> str | None:
    """Write one recipe into staging and rename it into place; the failure's log, or None."""
    staging = Path(tempfile.mkdtemp(prefix=".writing-", dir=folder))
    try:
        env = os.environ | {
            "CUDA_VISIBLE_DEVICES": "",
            "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": threads,
        }
        # Bounded by CPU (tests/support/patience.py): the old 1200 s of wall time per thread.
        p = patience.run(
            [sys.executable, str(writer), recipe, str(staging / recipe)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cpu=1200 * int(threads),
            check=False,
        )  # fmt: skip
        if p.returncode != 0:
            return f"{recipe} failed:\n{p.stdout.decode(errors='replace')[-3000:]}"
        try:
            os.rename(staging / recipe, folder / recipe)
        except OSError:
            if not (folder / recipe).is_dir():  # not a concurrent writer's complete copy
                raise
        return None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _drop_stale_staging(folder: Path) -> None:
    now = time.time()
    for p in folder.glob(".writing-*"):
        try:
            if now - p.stat().st_mtime > STALE_WRITING_S:
                shutil.rmtree(p, ignore_errors=True)
        except OSError:
            pass  # another run removed it first
