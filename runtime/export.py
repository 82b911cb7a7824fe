"""Write bound weights to one ``.safetensors`` file, atomically and with bounded memory.

Tensors are named ``layers.{i}.{slot}.{field}`` and ``globals.{field}``; ``__metadata__``
records the model, the tp and ep sizes and ranks, the geometry and any ``--set`` overrides,
each layer's role and slot blocks, and the hash of the specs that generated the binders.

Written by hand rather than with ``safetensors.serialize_file`` because that call needs every
tensor's bytes in memory at once (a full-geometry bind is many GB); here each array streams
from its memory map to the file. Tests read the result back with the safetensors library.
Invariants: the file appears whole or not at all (temp file + fsync + ``os.replace``); tensor
order and header bytes are deterministic, so two binds give byte-identical files.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from core.dtypes import dtype_name
from runtime.atomic import atomic_writer
from runtime.backends import Backend
from runtime.binding import Array

if TYPE_CHECKING:
    from runtime.bind import BindResult


def bound_tensors(result: BindResult, backend: Backend) -> dict[str, Array]:
    """Every bound field of a result on the host, by its name in an ``--out`` file."""
    return {name: backend.to_host(a, rule.dtype) for name, (rule, a) in result.fields().items()}


def write_safetensors(path: Path, tensors: dict[str, Array], metadata: dict[str, str]) -> int:
    header: dict[str, object] = {"__metadata__": dict(sorted(metadata.items()))}
    pos = 0
    order = sorted(tensors)
    for name in order:
        a = tensors[name]
        header[name] = {
            "dtype": dtype_name(a),
            "shape": list(a.shape),
            "data_offsets": [pos, pos + a.nbytes],
        }
        pos += a.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # pad so the data buffer starts 8-byte aligned
    with atomic_writer(path) as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for name in order:
            flat = np.ascontiguousarray(tensors[name]).reshape(-1)  # shape -> [n], row-major
            f.write(flat.view(np.uint8).data)  # a view of the mmap: no copy for verbatim fields
    return 8 + len(raw) + pos
