"""Where bound weights live: host memory (NumPy) or a CUDA device (CuPy).

A backend uploads the checked, sharded host arrays once and supplies the ops that build the
derived fields. Invariants: only this rank's bytes are uploaded, each tensor once; the host
checks (names, dtypes, shapes, bytes) all run before any upload; on the device BF16 travels
as ``uint16`` bits and F8 as ``uint8`` bits, each tagged back (ml_dtypes) when copied to the
host.
"""

from __future__ import annotations

import importlib
import math
import mmap
from collections.abc import Mapping
from typing import Any

import ml_dtypes
import numpy as np

from specbind.core.dtypes import DTYPES
from specbind.core.errors import BindError, SpecbindError
from specbind.core.record import record
from specbind.runtime.binder import ops as numpy_ops
from specbind.runtime.binder.checks import Array
from specbind.runtime.binder.ops import Ops

F8 = tuple(
    np.dtype(t) for t in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, ml_dtypes.float8_e8m0fnu)
)


@record
class Backend:
    name: str
    ops: Ops
    device: bool

    def upload(self, host: Mapping[str, Array]) -> dict[str, Any]:
        if not self.device:
            return dict(host)
        cp = importlib.import_module("cupy")
        out: dict[str, Any] = {}
        for name, a in host.items():
            bits = a.view(np.uint16) if a.dtype == ml_dtypes.bfloat16 else a
            if a.dtype in F8:  # CuPy has no F8 dtypes: the device holds their bits
                bits = a.view(np.uint8)
            out[name] = cp.asarray(bits)  # one host-to-device copy of this rank's bytes
        return out

    def to_host(self, a: Any, dtype: str) -> Array:
        if not self.device:
            out: Array = a
            return out
        host: Array = a.get()
        tagged = DTYPES[dtype].numpy
        if dtype == "BF16" or tagged in F8:
            assert tagged is not None
            return host.view(tagged)
        return host


NUMPY = Backend("numpy", numpy_ops, device=False)


def cupy_backend(kernels: Any) -> Backend:
    """The CuPy backend running the generated ``kernels`` module, or a clear error naming what
    is missing (CuPy, or a CUDA device)."""
    try:
        cp = importlib.import_module("cupy")
    except ImportError as e:
        raise SpecbindError(
            f"--backend cupy needs CuPy (pip install 'specbind[gpu]'): {e}"
        ) from None
    try:
        count = int(cp.cuda.runtime.getDeviceCount())
    except Exception as e:  # CUDARuntimeError, or a driver that is not there
        raise SpecbindError(
            f"--backend cupy needs a CUDA device: {type(e).__name__}: {e}"
        ) from None
    if count < 1:
        raise SpecbindError("--backend cupy needs a CUDA device: none is visible")
    from specbind.runtime.binder import ops_cupy

    ops_cupy.use(kernels)
    return Backend("cupy", ops_cupy, device=True)


def get(name: str, kernels: Any = None) -> Backend:
    """A backend by name; ``cupy`` runs the generated ``kernels`` module it is handed."""
    if name == "numpy":
        return NUMPY
    if name == "cupy":
        return cupy_backend(kernels)
    raise SpecbindError(f"unknown backend {name!r} (numpy or cupy)")


ALIGN = 64  # bytes: every array an Arena hands out starts on a cache line
PAGE = mmap.PAGESIZE
POPULATE_STEP = 16 << 20  # bytes a background populate maps per call
AHEAD_MIN = 64 << 20  # bytes: a separate arena's map this large is populated in the background


def _populate_write(chunk: Any) -> None:
    """Map every page of ``chunk`` writable, a step at a time (see ``Arena.reserve``)."""
    from specbind.runtime.binder.ops import advise
    from specbind.runtime.binder.tp import MADV_POPULATE_WRITE

    base, size = chunk.ctypes.data, chunk.nbytes
    for off in range(0, size, POPULATE_STEP):
        if not advise(base + off, min(POPULATE_STEP, size - off), MADV_POPULATE_WRITE):
            return


class Arena:
    """Host memory a bind writes every field into (``bind_checkpoint(..., into=arena)``): the
    caller's memory, each byte of the rank written once.

    A stacked, concatenated or computed field is made in the arena (the op writes its result
    there); a field that would be a zero-copy view of the mapped checkpoint is copied in once.
    Without an arena those fields live in memory of their own and the views stay views, so a
    caller who wants the bytes in its own buffers (an engine's parameters, a reused staging
    area) would copy every computed field a second time.

    The arena grows: a request that does not fit adds a chunk of ``max(chunk_bytes,
    request)``; ``reset`` keeps the chunks for the next bind.
    Invariants: every array handed out is C-contiguous, ``ALIGN``-byte aligned and inside one
    chunk; ``holds(a)`` is True exactly when all of ``a``'s bytes lie inside one chunk.
    Traps: ``reset()`` hands the same bytes out again, so every array bound into the arena
    before is overwritten by the next bind (drop them first: what a benchmark or a weight
    reload wants, with pages already faulted in). The arena also holds the bytes a bind gathers
    that no field keeps (at tp > 1, the column shards a transform reads, such as an ``o_proj``
    an absorb multiplies): room the arena keeps until reset, never a wrong byte.

    ``separate=True``: every array is handed out in a map of its own (page-aligned, sized to
    it), so each field's memory goes back to the system as soon as the last view of it goes,
    whatever becomes of the others: what an engine wants whose parameters take the fields'
    memory (``specbind.engine.fill(adopt=...)``) and which later drops some of them (vLLM's
    CPU linears, repacked after loading). ``sole(a)`` says whether ``a`` is the whole of one
    such map. Trap: ``reserve`` maps nothing ahead then (the maps are made when carved), and
    ``reset`` forgets the maps instead of handing them out again (arrays already handed out
    keep their memory). A map of ``AHEAD_MIN`` bytes or more (a stack of experts, a whole
    vocabulary) has its pages mapped in by a background thread from its start, as ``reserve``
    does, while the bind writes it: a stack is written one member at a time (each a read of a
    few MiB, too small to split over the cores), so its fresh pages would otherwise fault in
    on the bind's one thread (a 4.2 GB Qwen3-MoE bind, 3 interleaved pairs: 3.14 s without,
    2.28 s with, min 2.68 / 1.99).

    ``views``: (block, field) pairs a bind leaves as they are bound (a view of the mapped
    checkpoint stays a view) instead of copying them in: for a caller that reads only a share
    of such a field into the arena itself (an engine's padded vocabulary split, where the
    field bound whole is the embedding and each rank keeps its rows). Trap: such a field is
    then not in the arena; the caller must copy what it keeps.

    ``file_views=True`` (separate only): a field that is one contiguous run of a checkpoint
    file's bytes (a verbatim tensor or the rank's rows of one, or tensors the file stores one
    after the other, concatenated by rows: ``ops.concat_squeeze``) is not copied in: it is
    that run of a private, copy-on-write map of the file, every page mapped in
    (``runtime.io.safetensors_file.private_view``, whose traps hold for it), memory it alone names
    (``sole``), which ``specbind.engine.fill(adopt=)`` makes its parameter's storage. Trap:
    such a field is outside the arena's chunks (``holds`` is False for it).
    """

    def __init__(
        self, chunk_bytes: int = 256 << 20, *, separate: bool = False,
        views: frozenset[tuple[str, str]] = frozenset(), file_views: bool = False,
    ) -> None:  # fmt: skip
        if chunk_bytes < 1:
            raise BindError(f"Arena chunk_bytes is {chunk_bytes}, expected a positive size")
        self._chunk = chunk_bytes
        self._separate = separate
        if file_views and not separate:
            raise BindError("Arena(file_views=True) needs separate=True: each field its own map")
        self.views = views  # (block, field) pairs the bind leaves as views of the map
        self.file_views = file_views  # every contiguous run of a file's bytes mapped, not copied
        self._mapped: dict[int, int] = {}  # file_views: a private view's address -> its bytes
        self._chunks: list[Any] = []
        self._sizes: dict[int, int] = {}  # separate: a map's address -> the bytes handed out
        self._at = 0  # the chunk being carved
        self._donors: dict[int, list[Any]] = {}  # separate: bytes -> memory handed to reuse
        self._donated: set[int] = set()  # separate: the address of every donated buffer
        self._off = 0  # the next free byte in it
        self.used = 0  # bytes handed out since the last reset (alignment padding excluded)

    def reserve(self, nbytes: int) -> None:
        """Room for ``nbytes`` more bytes, as one new chunk whose pages a background thread maps
        in (``MADV_POPULATE_WRITE``) front to back, ahead of the writes. The first touch of
        fresh memory is the kernel zeroing it (and, on a virtual machine, the host backing it):
        done by the bind's own writes it stalls every copy; done ahead on another core it
        overlaps them. Only a hint: bytes past it grow the arena as before, and a kernel without
        the advice (before 5.14) leaves the writes to fault the pages in."""
        free = sum(int(c.nbytes) for c in self._chunks[self._at :]) - self._off
        if self._separate or nbytes <= free:
            return
        chunk = self._new_chunk(nbytes - free)
        import threading

        threading.Thread(target=_populate_write, args=(chunk,), daemon=True).start()

    def donate(self, buffers: Any) -> None:
        """Memory a separate arena hands out again before it maps any: each buffer (a
        writable C-contiguous NumPy ``uint8`` array, such as an engine parameter's storage
        about to be filled) serves one ``empty`` request of exactly its size, the first
        donated first; the arena keeps it alive while it is handed out. What the engine
        allocated is then the memory the bind writes: its pages, where they were faulted in
        before (a heap an earlier engine of the process freed), are not faulted in again.
        Trap: the caller must not read a donated buffer as its own afterwards: a field of
        another name may lie in it (``specbind.engine.fill`` adopts by memory, not by name)."""
        if not self._separate:
            raise BindError("Arena.donate: only a separate arena hands donated memory out")
        for b in buffers:
            if not (
                isinstance(b, np.ndarray) and b.dtype == np.uint8 and b.ndim == 1
                and b.flags.c_contiguous and b.flags.writeable and b.nbytes > 0
            ):  # fmt: skip
                raise BindError("Arena.donate: a donated buffer is not writable contiguous uint8")
            self._donors.setdefault(int(b.nbytes), []).append(b)
            self._donated.add(int(b.ctypes.data))
        for same in self._donors.values():
            same.reverse()  # popped from the end: the first donated first

    def _new_chunk(self, nbytes: int, pad: int = ALIGN) -> Any:
        """A chunk of at least ``nbytes`` (plus ``pad``, room to align a start) at the end of
        the arena: an anonymous private map, page-aligned."""
        size = -(-(nbytes + pad) // PAGE) * PAGE
        m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        chunk = np.frombuffer(m, dtype=np.uint8)  # [size B]: the array keeps the map alive
        self._chunks.append(chunk)
        return chunk

    @property
    def nbytes(self) -> int:
        """The arena's size: every chunk's bytes."""
        return sum(int(c.nbytes) for c in self._chunks)

    def empty(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """An uninitialised C-contiguous array of ``shape`` and ``dtype`` inside the arena."""
        dt = np.dtype(dtype)
        n = math.prod(shape) * dt.itemsize
        if self._separate:  # a donated buffer of its size, else a map of its own
            same = self._donors.get(n)
            if same:
                chunk = same.pop()
                self._chunks.append(chunk)
            else:
                chunk = self._new_chunk(max(n, 1), pad=0)
            if n >= AHEAD_MIN:  # its pages mapped in ahead, on another core (see the class)
                import threading

                threading.Thread(target=_populate_write, args=(chunk,), daemon=True).start()
            self._sizes[chunk.ctypes.data] = n
            self.used += n
            return chunk[:n].view(dt).reshape(shape)  # [n B] -> shape
        while True:
            if self._at < len(self._chunks):
                chunk = self._chunks[self._at]
                base = chunk.ctypes.data
                start = -(-(base + self._off) // ALIGN) * ALIGN - base  # aligned in memory
                if start + n <= chunk.nbytes:
                    self._off = start + n
                    self.used += n
                    return chunk[start : start + n].view(dt).reshape(shape)  # [n B] -> shape
                if self._at + 1 < len(self._chunks):  # a chunk kept from before a reset
                    self._at, self._off = self._at + 1, 0
                    continue
            self._new_chunk(max(self._chunk, n))
            self._at, self._off = len(self._chunks) - 1, 0

    def holds(self, a: Any) -> bool:
        """Whether every byte of ``a`` (a NumPy array) lies inside one of the arena's chunks."""
        if not isinstance(a, np.ndarray):
            return False
        lo, hi = np.lib.array_utils.byte_bounds(a)
        for c in self._chunks:
            base = c.ctypes.data
            if base <= lo and hi <= base + c.nbytes:
                return True
        return False

    def sole(self, a: Any) -> bool:
        """Whether ``a`` is C-contiguous and its bytes are exactly all those handed out in one
        of a separate arena's maps (nothing else carved from them): memory ``a`` alone names."""
        if not (isinstance(a, np.ndarray) and a.flags.c_contiguous and a.nbytes > 0):
            return False
        lo, hi = np.lib.array_utils.byte_bounds(a)
        return self._sizes.get(lo) == hi - lo or self._mapped.get(lo) == hi - lo

    def lent(self, address: int) -> bool:
        """Whether a separate arena has handed out the map or donated buffer starting at
        ``address``: a donated parameter's storage that now holds a field (``donate``), which
        the parameter must not be written through."""
        return address in self._sizes

    def donated(self, address: int) -> bool:
        """Whether a donated buffer (``donate``) starts at ``address``, handed out or not: the
        arena holds a view of it, so the storage has one more holder than its parameter."""
        return address in self._donated

    def mapped(self, a: Any) -> Any:
        """``a``'s bytes as a private map of its file (``file_views``; ``a`` one contiguous run
        of a mapped checkpoint file, or already such a private view), recorded as memory
        ``a`` alone names (``sole``); None where the arena does not keep file views or ``a``
        is no such run."""
        if not self.file_views or not isinstance(a, np.ndarray) or a.nbytes == 0:
            return None
        if self._mapped.get(int(a.ctypes.data)) == a.nbytes and a.flags.c_contiguous:
            return a
        from specbind.runtime.io.safetensors_file import private_view

        out = private_view(a)
        if out is not None:
            self._mapped[int(out.ctypes.data)] = int(out.nbytes)
        return out

    def place(self, a: Any) -> Any:
        """``a`` itself if the arena holds it, else a copy in the arena (one read of ``a``: a
        contiguous view of a mapped checkpoint file is read from the file, ``ops.copy_in``)."""
        if a is None or self.holds(a):
            return a
        mapped = self.mapped(a)
        if mapped is not None:
            return mapped
        out = self.empty(a.shape, a.dtype)
        numpy_ops.copy_in(out, a)
        return out

    def reset(self) -> None:
        """Hand out the arena's bytes again from the start (see the trap above); a separate
        arena forgets its maps instead."""
        if self._separate:
            self._chunks, self._sizes, self._donors, self._mapped = [], {}, {}, {}
            self._donated = set()
        self._at, self._off, self.used = 0, 0, 0
