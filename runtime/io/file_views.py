"""A field that is one run of a checkpoint file's bytes, held as a private map of that file.

A bound field that is a contiguous view of a mapped checkpoint file (a verbatim tensor, the
rank's rows of one, or a row-concatenation of tensors the file stores one after the other in
that order, such as Llama's ``gate_proj`` then ``up_proj``) needs no copy to become an
engine's host parameter: ``private_view`` maps the same file again, private and writable
(``MAP_PRIVATE``: copy-on-write, the file never written), and maps every page of the field's
bytes in before it returns (``MADV_POPULATE_READ``: the page cache's own pages, read from the
disk first where they are not cached). The parameter then holds every byte it claims: a
read of it after the load faults in nothing and reads nothing from the disk.

Why by hand: safetensors' ``safe_open`` and torch's ``frombuffer`` give read-only or copied
memory; NumPy's ``memmap`` has no populate; the kernel calls are two lines of ``mmap``.

Invariants:
- ``run_of`` returns a view only where every part is C-contiguous, of one dtype and row
  shape, each part starting at the byte after the one before, all inside one file's map:
  exactly the bytes ``np.concatenate`` would copy, in the same order;
- ``private_view`` returns the same bytes as its argument (the same file, offset and length;
  the file checked to be the one mapped: device and inode), writable, every page mapped in;
  one private map per file, shared by the views of it (one kernel map, not one a field);
  None where it cannot (no such file open, another file at the path now, no private map
  allowed, a short file): the caller copies instead.
Traps:
- a write into a private view copies that page (copy-on-write): neither the file nor the page
  cache's page changes; a page never written stays the page cache's, shared with every
  process that maps or reads the file (the tp workers of one engine among them);
- the file must not be truncated or rewritten in place while a view of it lives: the kernel
  raises SIGBUS on a page past the new end, and an unwritten page shows the new bytes. A Hub
  cache's blobs are never rewritten; a folder a trainer overwrites in place is, so its engine
  copies (``vllm_loader``: ``model_loader_extra_config={"specbind_mmap": False}``);
- the pages are the page cache's, so memory pressure may drop them (clean file pages) and a
  later read fetches them from the disk again, where anonymous memory with no swap would not
  be dropped at all.
"""

from __future__ import annotations

import mmap
import os
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from specbind.runtime.io.safetensors_file import SafetensorsFile, _holder

MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)  # Linux 5.14; Python 3.12 names it

# Each file's private map, by (device, inode, size): weak, so the map goes when its last view
# goes; by the file's identity, not the reader object's, which a bind drops before its fields.
_PRIVATE: weakref.WeakValueDictionary[tuple[int, int, int], Any] = weakref.WeakValueDictionary()


def _run(a: Any) -> tuple[SafetensorsFile, int] | None:
    """``a``'s file and byte offset in it, where ``a`` is a C-contiguous, read-only view of an
    open file's map; else None."""
    if not (isinstance(a, np.ndarray) and a.flags.c_contiguous and a.nbytes > 0):
        return None
    if a.flags.writeable:  # memory of its own, not a view of a read-only map
        return None
    address = int(a.ctypes.data)
    f = _holder(address, int(a.nbytes))
    return None if f is None else (f, address - f._base)


def is_file_view(a: Any) -> bool:
    """Whether ``a`` is one contiguous run of an open checkpoint file's mapped bytes."""
    return _run(a) is not None


def run_of(parts: Sequence[Any]) -> Any:
    """``parts`` concatenated along axis 0 as one view of the file's map, where the file stores
    them one after the other in this order (see the invariants); else None."""
    if not parts or not isinstance(parts[0], np.ndarray):
        return None
    first = parts[0]
    where = _run(first)
    if where is None:
        return None
    f, _ = where
    at = int(first.ctypes.data)
    for p in parts:
        if (
            not isinstance(p, np.ndarray)
            or p.dtype != first.dtype
            or p.shape[1:] != first.shape[1:]
            or p.ndim == 0
            or _run(p) is None
            or int(p.ctypes.data) != at
        ):
            return None
        at += int(p.nbytes)
    if at > f._base + f.size:
        return None
    rows = sum(int(p.shape[0]) for p in parts)
    flat = np.frombuffer(f.view, np.uint8)  # [file B]: the file's read-only map
    lo = int(first.ctypes.data) - f._base
    joined = flat[lo : lo + (at - int(first.ctypes.data))].view(first.dtype)  # [n B] -> [n]
    return joined.reshape(rows, *first.shape[1:])  # [n] -> [rows, *row shape]


def _private_map(f: SafetensorsFile) -> Any:
    """``f``'s file mapped again, private and writable (one map per file, kept while viewed);
    None where it cannot be (see ``private_view``)."""
    key = (*f._inode, f.size)
    m = _PRIVATE.get(key)
    if m is not None:
        return m
    from specbind.runtime.io.safetensors_file import _reader, _readers_lock

    with _readers_lock:
        fd = _reader(f)  # opened by path, its device and inode checked against the map's
        if fd is None:
            return None
        try:
            if os.fstat(fd).st_size != f.size:
                return None  # the file changed length since it was mapped
            raw = mmap.mmap(
                fd, f.size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE
            )
        except (OSError, ValueError):  # a kernel or limit that refuses a private map
            return None
    m = np.frombuffer(raw, np.uint8)  # [file B]: the array keeps the map alive
    _PRIVATE[key] = m
    return m


def private_view(a: Any) -> Any:
    """The bytes of ``a`` (a contiguous view of a mapped checkpoint file) as a writable view of
    the file's private map, every page mapped in; None where that cannot be (the caller
    copies). See the module's invariants and traps."""
    where = _run(a)
    if where is None:
        return None
    f, offset = where
    m = _private_map(f)
    if m is None:
        return None
    n = int(a.nbytes)
    view = m[offset : offset + n]  # [n B] of the private map
    page = mmap.PAGESIZE
    lo = offset // page * page
    try:
        m.base.obj.madvise(MADV_POPULATE_READ, lo, offset + n - lo)
    except (OSError, ValueError, AttributeError):  # before 5.14: touch a byte of every page
        int(view[::page].sum())
    return view.view(a.dtype).reshape(a.shape)  # [n B] -> a's dtype and shape
