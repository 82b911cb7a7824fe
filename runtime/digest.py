"""Content digests of a bound file: one per tensor, and one of the whole metadata record.

- A tensor's digest is XXH3-128 over ``name``, ``dtype`` and ``shape`` (one ASCII line) and
  then its bytes, so a changed byte, two same-shape fields swapped, or a tensor re-saved under
  another name or shape each change it. ``StreamWriter`` feeds each tensor's bytes to the hash
  as it writes them (no second read of the file); a reload hashes exactly the bytes it hands
  out, so a rank that reads some tensors verifies only those.
- The record digest is XXH3-128 over the file's ``__metadata__`` strings (sorted, JSON) except
  itself: the ranks, geometry, layers, counts and the per-tensor digests. A forged
  ``tp_rank``, an edited ``layers`` or ``tensors`` all change it.

What this detects: corruption and accidental edits (a copy cut short, a tool that re-saves a
tensor, a hand-edited header). Not a deliberate forger: anyone can recompute an XXH3 digest;
there is no key. Measured at ~6 GB/s on one core (BENCHMARKS.md, "Issue #22: reload
digests").
Invariant: one algorithm, named ``ALGORITHM`` in the record; a file naming another is refused.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import xxhash

ALGORITHM = "xxh3_128"
HEX = 32  # characters of one digest
RECORD_KEY = "record_digest"  # the metadata key of the record digest, left out of its own hash


def tensor_hasher(name: str, dtype: str, shape: tuple[int, ...] | list[int]) -> xxhash.xxh3_128:
    """A hash already fed one tensor's identity; feed it the tensor's bytes, in file order."""
    h = xxhash.xxh3_128()
    h.update(f"{name}\0{dtype}\0{','.join(str(int(d)) for d in shape)}\n".encode())
    return h


def tensor_digest(
    name: str, dtype: str, shape: tuple[int, ...] | list[int], data: memoryview | bytes
) -> str:
    h = tensor_hasher(name, dtype, shape)
    h.update(data)
    return h.hexdigest()


def record_digest(meta: Mapping[str, str]) -> str:
    """The digest of a ``__metadata__`` mapping, every key but ``RECORD_KEY``."""
    rest = {k: v for k, v in meta.items() if k != RECORD_KEY}
    text = json.dumps(rest, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return xxhash.xxh3_128(text.encode()).hexdigest()


def is_digest(text: object) -> bool:
    return isinstance(text, str) and len(text) == HEX and all(c in "0123456789abcdef" for c in text)
