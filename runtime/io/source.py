"""The tensor-source interface a generated binder reads one layer through.

Invariants: names are layer-relative (``self_attn.q_proj.weight``), so one binder serves any
layer index and any container; ``names()`` lists everything in the layer, attention or not,
so the binder's census sees what it does not bind; ``get`` returns the on-disk dtype, shape
and raw bytes untouched (no cast, no copy for a memory-mapped source).
"""

from __future__ import annotations

import mmap
from typing import Protocol, runtime_checkable

from specbind.core.record import record


@record
class MapSpan:
    """Where a tensor's bytes sit in a memory map, so a reader can release pages it is done with."""

    map: mmap.mmap
    offset: int  # offset of the tensor's first byte in the map (= its file offset)


@record
class RawTensor:
    dtype: str
    shape: tuple[int, ...]
    data: memoryview  # raw little-endian bytes, exactly as stored
    span: MapSpan | None = None  # set when ``data`` is a view of a memory map


class TensorSource(Protocol):
    def names(self) -> list[str]: ...

    def get(self, name: str) -> RawTensor | None: ...


@runtime_checkable
class WholeSource(Protocol):
    """A source whose ``get`` yields a rank's slice, and ``whole`` the tensor as stored (checked
    against the plan's full shape), for a verdict that must not depend on the rank's slice."""

    def names(self) -> list[str]: ...

    def get(self, name: str) -> RawTensor | None: ...

    def whole(self, name: str) -> RawTensor | None: ...


class DictSource:
    """An in-memory source, for tests and for callers that already hold the bytes."""

    def __init__(self, tensors: dict[str, RawTensor]) -> None:
        self._t = dict(tensors)

    def names(self) -> list[str]:
        return list(self._t)

    def get(self, name: str) -> RawTensor | None:
        return self._t.get(name)
