"""A strict, lazy reader of one ``.safetensors`` file through a read-only memory map.

Format: 8-byte little-endian header length N, N bytes of UTF-8 JSON, then the data buffer.

Invariants (each violation is a ``CheckpointError`` naming the file and the tensor):
- N is capped (``MAX_HEADER_BYTES``) and 8 + N lies inside the file, checked *before* reading,
  so a lying header never makes us allocate what it claims;
- the header is a JSON object without duplicate keys; ``__metadata__`` maps str to str;
- every entry has a known dtype, a shape of non-negative ints and ``data_offsets`` [b, e] with
  b <= e and e - b == bytes(dtype, shape);
- the entries tile the data buffer exactly: sorted by offset they are contiguous from 0 with no
  overlap and no hole, and end at the end of the file;
- tensors are memoryview slices of the map: nothing is read until it is used; each also
  carries a ``MapSpan`` so a strided read can release the pages it has copied from;
- a file that shrinks while it is read (truncated, or rewritten in place) is refused in one line
  naming it (``check_size``: one ``fstat`` of the map's descriptor as each tensor is taken, and
  after a ``preadv`` that comes up short), never read past its new end: a read of the map there
  raises SIGBUS (and of its last page, zeros). A shrink between that check and the copy is
  caught by ``specbind.sigbus`` (the CLI installs it); a rewrite that keeps the size is not
  seen (a Hub cache's blobs are never rewritten);
- ``read_view`` copies a contiguous view's bytes with ``preadv`` from the very file mapped (a
  descriptor opened again by path, its device and inode compared with the mapped file's), else
  says it did not, and the caller copies from the map; within ``split_reads(n)`` a large one
  is cut into up to n page-aligned ranges read at once by n threads (the same bytes);
- one descriptor per open file: the map's own (Python's ``mmap`` keeps a duplicate of the
  descriptor it was made from, which is closed once mapped). ``read_view``'s descriptors are
  at most ``READERS``, the files read most recently (closed as others are read, or as their
  file goes), so a checkpoint of 3,000 shards needs about 3,000 descriptors, not 6,000.
Trap: the mmap stays open while any view of it lives.

A field that is one run of the file's bytes, held as a private map of the file
(``private_view``, ``run_of``; what ``Arena(file_views=True)`` binds, for an engine whose
host parameters may be the checkpoint's own pages): the same file mapped again, private and
writable (``MAP_PRIVATE``: copy-on-write, the file never written), every page of the field
mapped in before it returns (``MADV_POPULATE_READ``: the page cache's own pages, read from
the disk first where they are not cached), so the parameter holds every byte it claims: a read
of it afterwards faults in nothing and reads nothing from the disk.
Why by hand: safetensors' ``safe_open`` and torch's ``frombuffer`` give read-only or copied
memory, NumPy's ``memmap`` has no populate, and Python's ``mmap`` keeps a duplicate of the
file's descriptor for the map's whole life (one more descriptor per shard for as long as an
engine runs: a checkpoint of thousands of shards would run out); libc's ``mmap`` needs none
once the map is made.
Invariants:
- ``run_of`` returns a view only where every part is C-contiguous, of one dtype and row shape,
  each starting at the byte after the one before, all inside one file's map: exactly the bytes
  ``np.concatenate`` would copy, in the same order;
- ``private_view`` returns the same bytes as its argument (same file, offset and length; the
  file opened again by path and checked to be the one mapped: device, inode, size), writable,
  every page mapped in; each in a private map of its own (the file's pages around its bytes),
  unmapped when its last view goes, so a parameter an engine drops gives its pages back at once
  whatever becomes of the others (a map per file kept every dropped parameter's pages until the
  last went: vLLM-CPU's AVX-512 kernels repack every linear after loading, and a fresh
  engine's peak RSS was 1.29 of its default loader's); None where it cannot (no such file
  open, another file at the path now, no libc, a private map refused, the process's map count
  among them): the caller copies instead.
Traps of a private view:
- a write into it copies that page (copy-on-write): neither the file nor the page cache
  changes; a page never written stays the page cache's, shared with every process that maps
  or reads the file (the tp workers of one engine among them);
- the file must not be truncated or rewritten in place while a view of it lives: the kernel
  raises SIGBUS on a page past the new end, and an unwritten page shows the new bytes. A Hub
  cache's blobs are never rewritten; a folder a trainer overwrites in place is (the vLLM
  loader's ``"mmap": False`` copies instead);
- its pages are the page cache's, so memory pressure may drop them (clean file pages) and a
  later read fetch them from the disk again, where anonymous memory with no swap would stay.
"""

from __future__ import annotations

import _thread
import contextlib
import ctypes
import json
import mmap
import os
import stat
import struct
import weakref
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from specbind.core.dtypes import DTYPES
from specbind.core.errors import CheckpointError
from specbind.core.shown import shown
from specbind.runtime.io.source import MapSpan, RawTensor

MAX_HEADER_BYTES = 100 * 1024 * 1024  # the cap the safetensors library itself applies
MAX_RANK = 16


class Entry(NamedTuple):  # a tuple, not a frozen dataclass: 3x cheaper to build, 40,000 a file
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


def _no_dup_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # dict() in C; the Python loop runs only when a key repeats. With the loop on every object
    # the hook doubled the parse of a 40,000-tensor header set; now it costs about nothing.
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise ValueError(f"duplicate key {k!r}")
            seen.add(k)
    return out


def parse_header(raw: bytes, data_len: int, where: str) -> tuple[dict[str, Entry], dict[str, str]]:
    """Validate a header against a data buffer of ``data_len`` bytes."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{where}: header is not UTF-8 (byte {e.start})") from None
    try:
        obj = json.loads(text, object_pairs_hook=_no_dup_object)
    except (ValueError, RecursionError) as e:
        raise CheckpointError(f"{where}: header is not valid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise CheckpointError(f"{where}: header is a JSON {type(obj).__name__}, not an object")
    meta_raw = obj.pop("__metadata__", {})
    if not isinstance(meta_raw, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in meta_raw.items()
    ):
        raise CheckpointError(f"{where}: __metadata__ must map strings to strings")
    entries: dict[str, Entry] = {}
    for name, info in obj.items():
        entries[name] = _entry_fast(name, info) or _entry(name, info, where)
    spans = sorted(entries.values(), key=lambda t: (t.begin, t.end))
    pos = 0
    for t in spans:
        if t.begin < pos:
            raise CheckpointError(
                f"{where}: tensor {shown(t.name)} overlaps the previous one "
                f"(offset {t.begin} < {pos})"
            )
        if t.begin > pos:
            raise CheckpointError(
                f"{where}: hole of {t.begin - pos} B before tensor {shown(t.name)} at offset {pos}"
            )
        pos = t.end
    if pos != data_len:
        if pos > data_len:
            raise CheckpointError(
                f"{where}: tensors need {pos} B of data but the file holds {data_len} B "
                "(truncated?)"
            )
        raise CheckpointError(f"{where}: {data_len - pos} B of trailing data after the last tensor")
    return entries, dict(meta_raw)


def _entry_fast(name: str, info: Any) -> Entry | None:
    """The entry when it passes every check of ``_entry``, else None (then ``_entry`` says
    why, in its words). The same checks, in the cheapest order: at 40,000 tensors the header
    parse is most of opening a checkpoint (measured: 1.2 s with ``_entry`` alone)."""
    if type(info) is not dict or len(info) != 3:
        return None
    dtype, shape, offs = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    dt = DTYPES.get(dtype) if type(dtype) is str else None
    if dt is None or type(shape) is not list or len(shape) > MAX_RANK:
        return None
    if type(offs) is not list or len(offs) != 2:
        return None
    begin, end = offs
    if type(begin) is not int or type(end) is not int or not 0 <= begin <= end < 1 << 62:
        return None
    n = 1
    for d in shape:
        if type(d) is not int or not 0 <= d < 1 << 48:
            return None
        n *= d
    if end - begin != (n * dt.bits + 7) // 8:  # DType.nbytes, inline
        return None
    return Entry(name, dt.name, tuple(shape), begin, end)


def _entry(name: str, info: Any, where: str) -> Entry:
    at = f"{where}: tensor {shown(name)}"
    if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
        raise CheckpointError(f"{at}: entry must be an object with dtype, shape and data_offsets")
    dtype, shape, offs = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise CheckpointError(f"{at}: unknown dtype {shown(dtype)}")
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_RANK
        or not all(type(d) is int and 0 <= d < 1 << 48 for d in shape)
    ):
        raise CheckpointError(f"{at}: shape {shown(shape)} is not a list of non-negative integers")
    if (
        not isinstance(offs, list)
        or len(offs) != 2
        or not all(type(o) is int and 0 <= o < 1 << 62 for o in offs)
    ):
        raise CheckpointError(f"{at}: data_offsets {shown(offs)} is not [begin, end]")
    begin, end = offs
    if begin > end:
        raise CheckpointError(f"{at}: data_offsets reversed ({begin} > {end})")
    want = DTYPES[dtype].nbytes(tuple(shape))
    if end - begin != want:
        raise CheckpointError(f"{at}: {end - begin} B on disk, but {dtype} x {shape} is {want} B")
    return Entry(name, dtype, tuple(shape), begin, end)


class SafetensorsFile:
    """One file, opened lazily, its header validated on open."""

    def __init__(self, path: Path, display: str | None = None) -> None:
        self.path = path
        self.where = display or str(path)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not block the open
        except OSError as e:
            raise CheckpointError(f"{self.where}: cannot open: {e.strerror}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise CheckpointError(f"{self.where}: not a regular file")
            size = st.st_size
            if size < 8:
                raise CheckpointError(
                    f"{self.where}: {size} B is too short for a safetensors header"
                )
            (n,) = struct.unpack("<Q", os.pread(fd, 8, 0))
            if n > MAX_HEADER_BYTES:
                raise CheckpointError(
                    f"{self.where}: header length {n} B is over the {MAX_HEADER_BYTES} B cap"
                )
            if 8 + n > size:
                raise CheckpointError(
                    f"{self.where}: header length {n} B runs past the end of the file ({size} B)"
                )
            raw = os.pread(fd, n, 8)
            self.data_start = 8 + n
            self.entries, self.metadata = parse_header(raw, size - self.data_start, self.where)
            self._map = mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if size > 0 else None
        finally:
            os.close(fd)  # the map holds a descriptor of its own
        self._view = memoryview(self._map) if self._map is not None else memoryview(b"")
        self.size = size
        self._inode = (st.st_dev, st.st_ino)
        weakref.finalize(self, _drop_reader, id(self))
        self._base = 0
        if self._map is not None:
            import numpy as np

            self._base = int(np.frombuffer(self._map, np.uint8).ctypes.data)
            _MAPPED[self._base] = self

    @property
    def view(self) -> memoryview:
        """The whole file's map, read-only (the header too: offsets add ``data_start``)."""
        return self._view

    def names(self) -> list[str]:
        return list(self.entries)

    def release(self, name: str) -> None:
        """``MADV_DONTNEED`` over the whole pages inside ``name``'s bytes (see
        ``CheckpointDir.release``); the partial pages at its ends may hold a neighbour's bytes."""
        if self._map is None:
            return
        e = self.entries[name]
        lo = -(-(self.data_start + e.begin) // mmap.PAGESIZE) * mmap.PAGESIZE
        hi = (self.data_start + e.end) // mmap.PAGESIZE * mmap.PAGESIZE
        if hi > lo:
            self._map.madvise(mmap.MADV_DONTNEED, lo, hi - lo)

    def shrunk(self) -> int | None:
        """The file's size now if it is shorter than when it was opened (truncated, or
        rewritten in place, while being read), else None."""
        if self._map is None:
            return None
        try:
            now = self._map.size()  # fstat of the map's own descriptor: the file mapped
        except (OSError, ValueError):  # a closed map: nothing more is read through it
            return None
        return now if now < self.size else None

    def check_size(self, name: str | None = None) -> None:
        """Refuse, naming the file, a file that has shrunk since it was opened: a read of its
        map past the new end would raise SIGBUS, and one of its last page read zeros."""
        now = self.shrunk()
        if now is not None:
            raise CheckpointError(shrunk_message(self.where, now, self.size, name))

    def raw(self, name: str) -> RawTensor:
        self.check_size(name)  # one fstat: a file truncated under a bind is refused, not read
        e = self.entries[name]
        start = self.data_start + e.begin
        view = self._view[start : self.data_start + e.end]
        span = MapSpan(self._map, start) if self._map is not None else None
        return RawTensor(e.dtype, e.shape, view, span)


def shrunk_message(where: str, now: int, size: int, name: str | None = None) -> str:
    """The one line for a file that shrank while it was read (``check_size``, and the SIGBUS
    handler of ``specbind.sigbus``)."""
    reading = f" (reading {name})" if name is not None else ""
    return (
        f"{where}: is {now} B now, {size} B when opened{reading}: the file was truncated or "
        "rewritten while it was read; bind it again once nothing writes it"
    )


# read_view's descriptors: id(file) -> fd, the most recently read last; at most READERS.
READERS = 8
_readers: OrderedDict[int, int] = OrderedDict()
_readers_lock = _thread.allocate_lock()  # held over each read: no descriptor closed mid-read


def _drop_reader(key: int) -> None:
    with _readers_lock:
        fd = _readers.pop(key, None)
    if fd is not None:
        os.close(fd)


def _reader(f: SafetensorsFile) -> int | None:
    """``f``'s read descriptor (call with ``_readers_lock`` held): kept, or opened again by path
    and checked to be the file mapped (None: the path names another file now, or cannot be
    opened; the caller reads from the map)."""
    key = id(f)
    fd = _readers.get(key)
    if fd is not None:
        _readers.move_to_end(key)
        return fd
    try:
        fd = os.open(f.path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
    except OSError:
        os.close(fd)
        return None
    if (st.st_dev, st.st_ino) != f._inode:
        os.close(fd)
        return None
    _readers[key] = fd
    while len(_readers) > READERS:
        os.close(_readers.popitem(last=False)[1])
    return fd


# Each open file by its map's first address, so a holder of nothing but a view of the map (a
# field about to be copied into an arena) can find the file and offset it came from. Weak: an
# entry goes with its file (and its map).
_MAPPED: weakref.WeakValueDictionary[int, SafetensorsFile] = weakref.WeakValueDictionary()
# the file the last read came from (weak), looked at first
_last: list[weakref.ref[SafetensorsFile] | None] = [None]
READ_STEP = 1 << 30  # bytes one preadv asks for (Linux moves at most ~2 GiB a call)


def read_view(dest: Any, src: Any) -> bool:
    """``src`` (a NumPy view of a mapped checkpoint file) copied into ``dest`` (an array of the
    same dtype and shape) with ``preadv`` from the file (``_reader``); False, having written
    nothing the caller keeps, where that cannot be done: the caller copies from the map. That
    is when either is not C-contiguous, ``src`` is writable (memory of its own, not a map's
    view), no open file's map holds ``src``, there is no ``preadv`` (Windows), the path names
    another file than the one mapped (rewritten in place since), or a read comes up short.

    Why not copy from the map: the copy faults the map's pages into this process (or populates
    them), and the kernel unmaps them again on release; ``preadv`` moves the same page-cache
    bytes into ``dest`` without mapping them at all: a 158 MB row shard in 23 ms against 34 ms
    for populate, copy and release (medians of 11, warm page cache)."""
    if (
        src.dtype != dest.dtype
        or src.shape != dest.shape
        or src.flags.writeable
        or not (src.flags.c_contiguous and dest.flags.c_contiguous)
        or not hasattr(os, "preadv")
    ):
        return False
    address, nbytes = int(src.ctypes.data), int(src.nbytes)
    f = _holder(address, nbytes)
    if f is None:
        return False
    view = memoryview(dest.reshape(-1).view("u1"))  # [n] -> [n * itemsize B]: dest's bytes
    offset = address - f._base
    with _readers_lock:
        fd = _reader(f)
        if fd is None:
            return False
        parts = _parts(nbytes)
        if len(parts) == 1:
            done = _pread(fd, view, offset, 0, nbytes)
        else:
            done = all(_pool().map(lambda p: _pread(fd, view, offset, *p), parts))
    if not done:  # a read that came up short: the file may have shrunk under it
        f.check_size()  # refused here; the map must not be read past its file's end
    return done


def _pread(fd: int, view: memoryview, offset: int, lo: int, hi: int) -> bool:
    """``view[lo:hi]`` read from ``fd`` at ``offset + lo``; False on a short or failed read."""
    try:
        while lo < hi:
            got = os.preadv(fd, [view[lo : min(hi, lo + READ_STEP)]], offset + lo)
            if got <= 0:
                return False
            lo += got
    except OSError:
        return False
    return True


PARALLEL_MIN = 8 << 20  # bytes: a read at least twice this is split over the threads
_POOL: list[Any] = []
_THREADS = [1]  # threads one read may use (``split_reads``); 1: the caller's thread alone


def cores() -> int:
    """The cores this thread may run on (threads it starts inherit that set)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no affinity call (macOS): the machine's count
        return max(1, os.cpu_count() or 1)


@contextlib.contextmanager
def split_reads(threads: int) -> Iterator[None]:
    """Within it, a ``read_view`` of at least twice ``PARALLEL_MIN`` bytes is cut into up to
    ``threads`` page-aligned ranges read at once, each by its own thread (the caller's thread
    waits): the first writes into fresh memory are page faults, which then run on that many
    cores instead of one. Off by default: where ranks share a host each already has its core.
    Trap: process-wide while it lasts (every thread's reads split), not nested-safe beyond
    restoring the count it found."""
    before = _THREADS[0]
    _THREADS[0] = max(1, threads)
    try:
        yield
    finally:
        _THREADS[0] = before


def _parts(nbytes: int) -> list[tuple[int, int]]:
    """``[0, nbytes)`` cut into one page-aligned range per thread ``split_reads`` allows, each
    at least ``PARALLEL_MIN`` (one range below twice that, or with one thread)."""
    k = min(_THREADS[0], nbytes // PARALLEL_MIN)
    if k < 2:
        return [(0, nbytes)]
    step = -(-nbytes // k // mmap.PAGESIZE) * mmap.PAGESIZE
    return [(lo, min(nbytes, lo + step)) for lo in range(0, nbytes, step)]


def _pool() -> Any:
    """The threads split reads run on (started on first use, as many as the cores; a read uses
    at most ``split_reads``' count of them)."""
    if not _POOL:
        from concurrent.futures import ThreadPoolExecutor

        _POOL.append(ThreadPoolExecutor(max(2, cores()), thread_name_prefix="specbind-read"))
    return _POOL[0]


def mapped_at(address: int) -> tuple[SafetensorsFile, int] | None:
    """The open file whose map holds the byte at ``address``, and that byte's offset in the
    file; None when no open file's map does (``specbind.sigbus`` asks it of a fault)."""
    for f in list(_MAPPED.values()):
        if f._base <= address < f._base + f.size:
            return f, address - f._base
    return None


def _holder(address: int, nbytes: int) -> SafetensorsFile | None:
    """The open file whose map holds ``[address, address + nbytes)``: the last one read from
    first (a layer's tensors mostly share a shard), else a scan of every open file."""
    last = _last[0]() if _last[0] is not None else None
    for f in ([last] if last is not None else []) + list(_MAPPED.values()):
        if f._base <= address and address + nbytes <= f._base + f.size:
            _last[0] = weakref.ref(f)
            return f
    return None


# -- private views: a field that is one run of the file's bytes (see the module's docstring)

MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)  # Linux 5.14; Python 3.12 names it
_LIBC: list[Any] = []  # libc with mmap / munmap / madvise typed, or None where there is none


def _libc() -> Any:
    if not _LIBC:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.mmap.restype = ctypes.c_void_p
            libc.mmap.argtypes = (
                ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                ctypes.c_long,
            )  # fmt: skip
            libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
            libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        except (OSError, AttributeError, TypeError):  # no libc mmap (Windows)
            libc = None
        _LIBC.append(libc)
    return _LIBC[0]


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


def run_of(parts: Any) -> Any:
    """``parts`` concatenated along axis 0 as one view of the file's map, where the file stores
    them one after the other in this order (see the invariants); else None."""
    if not parts or not isinstance(parts[0], np.ndarray) or parts[0].ndim == 0:
        return None
    first = parts[0]
    where = _run(first)
    if where is None:
        return None
    f, lo = where
    at = int(first.ctypes.data)
    for p in parts:
        if (
            not isinstance(p, np.ndarray)
            or p.dtype != first.dtype
            or p.shape[1:] != first.shape[1:]
            or _run(p) is None
            or int(p.ctypes.data) != at
        ):
            return None
        at += int(p.nbytes)
    n = at - int(first.ctypes.data)
    if lo + n > f.size:
        return None
    rows = sum(int(p.shape[0]) for p in parts)
    flat = np.frombuffer(f.view, np.uint8)  # [file B]: the file's read-only map
    return flat[lo : lo + n].view(first.dtype).reshape(rows, *first.shape[1:])  # [n B] -> rows


def _private_map(f: SafetensorsFile, offset: int, n: int) -> Any:
    """Bytes ``offset`` to ``offset + n`` of ``f``'s file mapped again through libc, private
    and writable, every page mapped in: a map of their own (the pages around them), unmapped
    when its last view goes; None where it cannot be."""
    libc = _libc()
    if libc is None:
        return None
    lo = offset // mmap.PAGESIZE * mmap.PAGESIZE  # a file map starts on a page
    length = offset + n - lo
    with _readers_lock:
        fd = _reader(f)  # opened by path, its device and inode checked against the map's
        if fd is None:
            return None
        try:
            if os.fstat(fd).st_size != f.size:
                return None  # the file changed length since it was mapped
        except OSError:
            return None
        prot = mmap.PROT_READ | mmap.PROT_WRITE
        address = libc.mmap(None, length, prot, mmap.MAP_PRIVATE, fd, lo)
    if address is None or address == ctypes.c_void_p(-1).value:  # refused: ENOMEM, a limit
        return None
    raw = (ctypes.c_uint8 * length).from_address(address)
    weakref.finalize(raw, libc.munmap, address, length)  # unmapped when its last view goes
    m = np.frombuffer(memoryview(raw).cast("B"), np.uint8)  # [length B]: it keeps ``raw`` alive
    if libc.madvise(address, length, MADV_POPULATE_READ) != 0:  # before 5.14: a byte a page
        int(m[:: mmap.PAGESIZE].sum())
    return m[offset - lo :]  # [n B]


def private_view(a: Any) -> Any:
    """The bytes of ``a`` (a contiguous view of a mapped checkpoint file) as a writable view of
    the file's private map, every page mapped in; None where that cannot be (the caller
    copies). See the module's invariants and traps."""
    where = _run(a)
    if where is None:
        return None
    f, offset = where
    view = _private_map(f, offset, int(a.nbytes))
    if view is None:
        return None
    return view.view(a.dtype).reshape(a.shape)  # [n B] -> a's dtype and shape
