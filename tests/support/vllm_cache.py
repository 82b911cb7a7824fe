"""The vLLM proofs' results cached by content, outside the clone:
``$XDG_CACHE_HOME/specbind/vllm-proofs/<key>.json`` (``~/.cache`` without it).

A (row, tp)'s key is the SHA-256 of everything that can change its result: every file of
specbind's sources (core, runtime, generator and its templates, generated, the tools under
specbind/), the specs, pyproject.toml, the vLLM pins (which name the venv and vLLM's
version), the proof code (tests/vllm/, the vllm_* helpers, the checkpoint writer), the
transformers version that writes the checkpoint, the row itself (its classes, geometry,
tps), and the kind of result (``RESULTS``: the proofs record parameters and buffers; the token
runs name theirs). Each file enters by path and bytes, so a rename, an edit or a new file changes every key.
Trap: this hashes the working tree, not git's index: an uncommitted edit changes the key too.
``SPECBIND_VLLM_PROOFS_FRESH=1`` ignores the cache (every result is run, then stored).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from vllm_rows import VllmRow

REPO = Path(__file__).resolve().parent.parent.parent
_TREES = ("core", "runtime", "generator", "generated", "specs", "specbind", "tests/vllm")
# every vllm_*.py helper of tests/support, found by name so a new one is never left out
_FILES = (
    "pyproject.toml",
    ".ci/vllm-pins.txt",
    "tests/support/hf_random.py",
    "tests/support/config_fields.py",
    *sorted(p.relative_to(REPO).as_posix() for p in (REPO / "tests/support").glob("vllm_*.py")),
)
_SUFFIXES = (".py", ".yaml", ".json", ".j2", ".cu", ".cpp", ".toml", ".txt")


def folder() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "specbind" / "vllm-proofs"


def _files() -> list[Path]:
    out = [REPO / f for f in _FILES]
    for tree in _TREES:
        # os.walk does not follow links: specbind/ links to the top-level folders, hashed once
        for dirpath, dirs, names in os.walk(REPO / tree):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            out += [Path(dirpath) / n for n in sorted(names) if n.endswith(_SUFFIXES)]
    return out


@functools.cache
def sources() -> str:
    """The digest of every source file the proofs depend on, and the writer's transformers."""
    import transformers

    h = hashlib.sha256(f"transformers {transformers.__version__}\n".encode())
    for p in _files():
        if p.is_symlink():
            continue
        h.update(p.relative_to(REPO).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


# What a result holds; a result of another form is never read back (results before buffers
# or the parameters as loaded were recorded lack them, and a test reading them would fail).
RESULTS = "parameters as loaded and after post-processing, and buffers"


def key(row: VllmRow, tp: int, what: str = RESULTS) -> str:
    """``what``: the kind of result (the proofs' ``RESULTS``; the token runs name theirs)."""
    text = f"{sources()}\n{row.key()}\ntp {tp}\n{what}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def load(k: str) -> dict[str, Any] | None:
    if os.environ.get("SPECBIND_VLLM_PROOFS_FRESH"):
        return None
    p = folder() / f"{k}.json"
    try:
        data: dict[str, Any] = json.loads(p.read_text())
    except (OSError, ValueError):  # absent, or a torn write: run it again
        return None
    return data


def store(k: str, result: dict[str, Any]) -> None:
    """Write atomically (a rename), so a reader never sees half a result."""
    d = folder()
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".{k}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(result))
    tmp.replace(d / f"{k}.json")


def hits(keys: dict[str, str], cached: list[str]) -> dict[str, Any]:
    """{name: result} for each of ``keys`` (name -> key) the cache holds; each name found is
    appended to ``cached`` (a report's list of what came from the cache)."""
    out = {}
    for name, k in keys.items():
        hit = load(k)
        if hit is not None:
            out[name] = hit
            cached.append(name)
    return out
