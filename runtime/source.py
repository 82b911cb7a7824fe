"""The tensor-source interface a generated binder reads one layer through.

Invariants: names are layer-relative (``self_attn.q_proj.weight``), so one binder serves any
layer index and any container; ``names()`` lists everything in the layer, attention or not,
so the binder's census sees what it does not bind; ``get`` returns the on-disk dtype, shape
and raw bytes untouched (no cast, no copy for a memory-mapped source).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class FileSpan:
    """Where a tensor's bytes start in an open file, for reads that bypass the memory map."""

    fd: int  # owned (kept open) by the reader that made the span
    offset: int  # absolute file offset of the tensor's first byte


@dataclass(frozen=True)
class RawTensor:
    dtype: str
    shape: tuple[int, ...]
    data: memoryview  # raw little-endian bytes, exactly as stored
    span: FileSpan | None = None  # set when the bytes also live in a file


class TensorSource(Protocol):
    def names(self) -> list[str]: ...

    def get(self, name: str) -> RawTensor | None: ...


class DictSource:
    """An in-memory source, for tests and for callers that already hold the bytes."""

    def __init__(self, tensors: dict[str, RawTensor]) -> None:
        self._t = dict(tensors)

    def names(self) -> list[str]:
        return list(self._t)

    def get(self, name: str) -> RawTensor | None:
        return self._t.get(name)
