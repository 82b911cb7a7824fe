"""Shards of a synthetic checkpoint written as sparse files: real headers, data left as holes.

This is how the whole real-geometry checkpoint (hundreds of GB apparent) fits on a machine
with tens of GB of disk: each shard is its safetensors header, then ``truncate`` to the full
length, so the data buffer is a hole that reads back as zeros and takes no disk.

Invariants: shards are filled in the order given (the model's layer order), a new one started
when the next tensor would take the current one past ``max_bytes`` (save_pretrained's rule for
``max_shard_size``: a tensor larger than that gets a shard of its own); within a shard, data
and header entries are in the order the safetensors library writes them — by dtype alignment,
widest first, then by name — with ``__metadata__`` first and the header padded with spaces to
a multiple of 8. Every header passes ``SafetensorsFile``'s checks: the entries tile the data.
Trap: the bytes are zeros, so a bind reads fast (no disk) and absorbs multiply zeros: fine for
measuring overhead and memory, never for numerics.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from specbind.core.dtypes import DTYPES

SHARD_BYTES = 5 * 10**9  # save_pretrained's default max_shard_size="5GB" (decimal)

Entry = tuple[str, str, tuple[int, ...]]  # (name, dtype, shape)


def split(entries: list[Entry], max_bytes: int) -> list[list[Entry]]:
    """``entries`` in order, cut into shards of at most ``max_bytes`` (but never empty)."""
    shards: list[list[Entry]] = [[]]
    size = 0
    for e in entries:
        n = DTYPES[e[1]].nbytes(e[2])
        if shards[-1] and size + n > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(e)
        size += n
    return shards


def header(chunk: list[Entry]) -> tuple[bytes, int]:
    """The header bytes (length prefix excluded, padded) and the data length of one shard."""
    order = sorted(chunk, key=lambda e: (-DTYPES[e[1]].bits, e[0]))
    doc: dict[str, object] = {"__metadata__": {"format": "pt"}}
    pos = 0
    for name, dtype, shape in order:
        n = DTYPES[dtype].nbytes(shape)
        doc[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [pos, pos + n]}
        pos += n
    raw = json.dumps(doc, separators=(",", ":")).encode("utf-8")
    return raw + b" " * (-len(raw) % 8), pos


def write_shard(path: Path, chunk: list[Entry]) -> int:
    """Write one sparse shard; return its apparent size."""
    raw, data = header(chunk)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        f.truncate(8 + len(raw) + data)  # the data: one hole, read back as zeros
    return 8 + len(raw) + data
