"""The one writer of a rank's bound file (``bind --out`` and each ``--out-dir`` rank file):
written as the bind goes, one slot's output in memory at a time.

Layout (safetensors): the 8-byte header length, a header region reserved before any tensor is
read, then each field's bytes in the order they are bound. The header — ``__metadata__`` first
(``bound_format.BoundMeta``, completed from the bind's ``Expected`` and the tensor count), then
the fields sorted by name — is written into the reserved region at the end, padded with spaces
(which the safetensors format allows) to its exact size. The reservation is a proven upper
bound: every name that may come (``Expected``), each with the longest dtype, a rank-16 shape of
15-digit dims and 19-digit offsets, plus the metadata with the largest tensor count and a
digest (fixed width) for every name that may come.
Each tensor's content digest (``runtime.bound_format``) is computed from the bytes as they are
written, so recording it costs one hash pass over memory already in hand, no read of the file.
Written by hand rather than with ``safetensors.serialize_file``, which needs every tensor's
bytes in memory at once (a full-geometry rank is many GB).
Invariants: the path is checked again as the file is opened (``out_path.check_out_path``: never
a file of the checkpoint being read); the file appears whole or not at all (``atomic_writer``:
a refusal mid-bind, or a failed header write, leaves the previous file and no temp file); the
bytes are deterministic (same bind, same file); a field not in ``Expected`` is a bug, refused
rather than written past the reservation.
Trap: the data order is the bind order, not the name order; readers use the offsets.
"""

from __future__ import annotations

import json
import struct
import sys
from collections.abc import Iterable
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import numpy as np

from specbind.core.dtypes import DTYPES, dtype_name
from specbind.core.errors import OutputError
from specbind.runtime.atomic import atomic_writer
from specbind.runtime.backends import Backend
from specbind.runtime.bound_format import HEX, BoundMeta, quant_of, tensor_hasher
from specbind.runtime.checks import Array
from specbind.runtime.out_path import check_out_path

if TYPE_CHECKING:
    from specbind.runtime.bind import Expected, SlotResult

_LONGEST_DTYPE = max(len(d) for d in DTYPES)
# {"dtype":"<dtype>","shape":[16 dims of <= 15 digits],"data_offsets":[<=19 digits,<=19]},
_PER_ENTRY = len('{"dtype":"","shape":[],"data_offsets":[,]},:') + _LONGEST_DTYPE + 16 * 16 + 40


class StreamWriter:
    """The ``Sink`` of a streaming bind. Use as a context manager around the bind; the file is
    only put in place when the block exits without an exception.

    ``head`` is the record as known before the bind (model, hash, ranks, geometry, overrides,
    and under ``--out-dir`` the world and rank); ``start`` adds the layers and quantization.
    ``inputs`` and ``dirs`` are the checkpoint's files and directories (``check_out_path``).
    """

    def __init__(
        self,
        out: Path,
        head: BoundMeta,
        backend: Backend,
        inputs: Iterable[Path] = (),
        dirs: Iterable[Path] = (),
    ) -> None:
        self._out = out
        self._inputs = tuple(inputs)
        self._dirs = tuple(dirs)
        self._meta = head
        self._backend = backend
        self._stack = ExitStack()
        self._f: BinaryIO | None = None
        self._expected: set[str] = set()
        self._reserved = 0
        self._pos = 0
        self._entries: dict[str, tuple[str, list[int], int, int]] = {}
        self._digests: dict[str, str] = {}
        self.bytes = 0

    def __enter__(self) -> StreamWriter:
        real = check_out_path(self._out, self._inputs, dirs=self._dirs)
        self._f = self._stack.enter_context(atomic_writer(real))
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
        quant = quant_of(expected.quant, str(self._out))
        count = len(expected.names)  # the most there can be: reserves room; _finish counts
        self._meta = replace(self._meta, layers=expected.layers, quant=quant, tensors=count)
        self._expected = set(expected.names)
        most = replace(self._meta, digests=dict.fromkeys(expected.names, "0" * HEX))
        meta = json.dumps({"__metadata__": most.encode()})
        names = sum(len(json.dumps(n)) for n in expected.names)
        reserve = len(meta) + names + _PER_ENTRY * len(expected.names) + 16
        self._reserved = reserve + (-reserve % 8)  # the data buffer starts 8-byte aligned
        self._f.write(b"\0" * (8 + self._reserved))  # overwritten by _finish

    def slot(self, where: str, bound: SlotResult) -> None:
        for name, a in sorted(bound.weights.arrays().items()):
            self.tensor(f"{where}.{name}", self._backend.to_host(a, bound.fields[name].dtype))

    def tensor(self, name: str, host: Array) -> None:
        """Write one announced tensor's bytes now; nothing of it is kept but its entry."""
        assert self._f is not None, "use StreamWriter as a context manager"
        if name not in self._expected or name in self._entries:
            raise OutputError(f"{self._out}: field {name} was not announced to the writer (a bug)")
        flat = np.ascontiguousarray(host).reshape(-1)  # shape -> [n], row-major
        data = flat.view(np.uint8).data  # a view of the mmap: no copy for verbatim fields
        dtype, shape = dtype_name(host), list(host.shape)
        h = tensor_hasher(name, dtype, shape)
        h.update(data)  # the bytes in hand, hashed once as they go out
        self._f.write(data)
        end = self._pos + flat.nbytes
        self._entries[name] = (dtype, shape, self._pos, end)
        self._digests[name] = h.hexdigest()
        self._pos = end

    def _finish(self) -> None:
        assert self._f is not None
        meta = replace(self._meta, tensors=len(self._entries), digests=self._digests)
        header: dict[str, object] = {"__metadata__": meta.encode()}
        for name in sorted(self._entries):
            dtype, shape, b, e = self._entries[name]
            header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [b, e]}
        raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
        if len(raw) > self._reserved:  # the bound is proven; this would be a bug
            raise OutputError(f"{self._out}: header {len(raw)} B is over its {self._reserved} B")
        self._f.seek(0)
        self._f.write(struct.pack("<Q", self._reserved))
        self._f.write(raw + b" " * (self._reserved - len(raw)))
        self._f.seek(0, 2)
        self.bytes = 8 + self._reserved + self._pos
