"""A rank's ``--out`` file written as the bind goes: one slot's output in memory at a time.

Layout: the 8-byte header length, a header region reserved before any tensor is read, then
each field's bytes in the order they are bound. The header (``__metadata__`` first, then the
fields sorted by name, as ``export.write_safetensors`` writes them) is written into the
reserved region at the end, padded with spaces — which the safetensors format allows — to its
exact size. The reservation is a proven upper bound: every name that may come (``Expected``),
each with the longest dtype, a rank-16 shape of 15-digit dims and 19-digit offsets, plus the
metadata, whose per-layer part is known from the layout.
Invariants: the file appears whole or not at all (``atomic_writer``: a refusal mid-bind
leaves no file); the bytes are deterministic (same bind, same file); a field not in
``Expected`` is a bug, refused rather than written past the reservation.
Trap: the data order is the bind order, not the name order; readers use the offsets.
"""

from __future__ import annotations

import json
import struct
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import numpy as np

from specbind.core.dtypes import DTYPES, dtype_name
from specbind.core.errors import OutputError
from specbind.runtime.atomic import atomic_writer
from specbind.runtime.backends import Backend

if TYPE_CHECKING:
    from specbind.runtime.bind import BoundSlot, Expected

_LONGEST_DTYPE = max(len(d) for d in DTYPES)
# {"dtype":"<dtype>","shape":[16 dims of <= 15 digits],"data_offsets":[<=19 digits,<=19]},
_PER_ENTRY = len('{"dtype":"","shape":[],"data_offsets":[,]},:') + _LONGEST_DTYPE + 16 * 16 + 40


def layers_metadata(expected: Expected) -> str:
    """The ``layers`` metadata value: each layer's role and slot blocks, as ``bind`` writes it."""
    return json.dumps(
        {str(i): {"role": role, "slots": slots} for i, (role, slots) in expected.layers.items()},
        sort_keys=True,
    )


class StreamWriter:
    """The ``Sink`` of a streaming bind. Use as a context manager around the bind; the file is
    only put in place when the block exits without an exception."""

    def __init__(
        self,
        real: Path,
        metadata: dict[str, str],
        backend: Backend,
    ) -> None:
        self._real = real
        self._meta = dict(metadata)
        self._backend = backend
        self._stack = ExitStack()
        self._f: BinaryIO | None = None
        self._expected: set[str] = set()
        self._reserved = 0
        self._pos = 0
        self._entries: dict[str, tuple[str, list[int], int, int]] = {}
        self.bytes = 0

    def __enter__(self) -> StreamWriter:
        self._f = self._stack.enter_context(atomic_writer(self._real))
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None:
            self._stack.__exit__(*exc)  # type: ignore[arg-type]  # the bind failed: discarded
            return
        try:
            self._finish()
        except BaseException:  # a failed header write must discard the file, not commit it
            if not self._stack.__exit__(*sys.exc_info()):
                raise
        else:
            self._stack.__exit__(None, None, None)

    def start(self, expected: Expected) -> None:
        assert self._f is not None, "use StreamWriter as a context manager"
        self._meta["layers"] = layers_metadata(expected)
        if expected.quant is not None:
            self._meta["quant"] = expected.quant
        self._meta["tensors"] = str(len(expected.names))  # reserves room; _finish counts
        self._expected = set(expected.names)
        meta = json.dumps({"__metadata__": dict(sorted(self._meta.items()))})
        names = sum(len(json.dumps(n)) for n in expected.names)
        reserve = len(meta) + names + _PER_ENTRY * len(expected.names) + 16
        self._reserved = reserve + (-reserve % 8)  # the data buffer starts 8-byte aligned
        self._f.write(b"\0" * (8 + self._reserved))  # overwritten by _finish

    def slot(self, where: str, bound: BoundSlot) -> None:
        assert self._f is not None
        for name, a in sorted(bound.weights.arrays().items()):
            full = f"{where}.{name}"
            if full not in self._expected or full in self._entries:
                raise OutputError(f"--out: field {full} was not announced to the writer (a bug)")
            host = self._backend.to_host(a, bound.fields[name].dtype)
            flat = np.ascontiguousarray(host).reshape(-1)  # shape -> [n], row-major
            self._f.write(flat.view(np.uint8).data)
            end = self._pos + flat.nbytes
            self._entries[full] = (dtype_name(host), list(host.shape), self._pos, end)
            self._pos = end

    def _finish(self) -> None:
        assert self._f is not None
        self._meta["tensors"] = str(len(self._entries))  # a reload refuses a file missing one
        header: dict[str, object] = {"__metadata__": dict(sorted(self._meta.items()))}
        for name in sorted(self._entries):
            dtype, shape, b, e = self._entries[name]
            header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [b, e]}
        raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
        if len(raw) > self._reserved:  # the bound is proven; this would be a bug
            raise OutputError(f"--out: header {len(raw)} B is over its {self._reserved} B")
        self._f.seek(0)
        self._f.write(struct.pack("<Q", self._reserved))
        self._f.write(raw + b" " * (self._reserved - len(raw)))
        self._f.seek(0, 2)
        self.bytes = 8 + self._reserved + self._pos
