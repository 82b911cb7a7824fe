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
Each tensor's content digest (``runtime.bound.bound_format``) is computed from the bytes as they are
written, so recording it costs one hash pass over memory already in hand, no read of the file.
Written by hand rather than with ``safetensors.serialize_file``, which needs every tensor's
bytes in memory at once (a full-geometry rank is many GB).
Invariants: the path is checked again as the file is opened (``out_path.check_out_path``: never
a file of the checkpoint being read); the file appears whole or not at all (``atomic_writer``:
a refusal mid-bind, or a failed header write, leaves the previous file and no temp file); the
bytes are deterministic (same bind, same file); a field not in ``Expected`` is a bug, refused
rather than written past the reservation.
Trap: the data order is the bind order, not the name order; readers use the offsets.

Writing runs on a background thread (``_Background``) so the bind's next slot is computed while
the last one goes to disk: ``tensor`` queues the bytes (the main thread keeps the order and the
offsets, so the file is the same bytes as a write in line), the thread hashes and writes them
and starts the kernel's writeback every 64 MiB, so the disk works while the bind does.
Invariants: the queue is bounded in bytes (``QUEUE_BYTES``; one larger tensor waits for an
empty queue), so streaming keeps its small peak RSS; an error in the thread (ENOSPC, EIO)
stops it and is raised in the main thread at its next ``tensor`` or at the end, as one
``OutputError`` line naming the file, and the temp file is removed; an exception in the main
thread (a refusal, Ctrl-C, SIGTERM) drops what is queued and joins the thread before the temp
file is removed.
"""

from __future__ import annotations

import json
import struct
import sys
from collections import deque
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from specbind.core.dtypes import DTYPES, dtype_name
from specbind.core.errors import OutputError
from specbind.core.record import replace
from specbind.runtime.binder.backends import Backend
from specbind.runtime.binder.checks import Array
from specbind.runtime.bound.bound_format import HEX, BoundMeta, quant_of, tensor_hasher
from specbind.runtime.io.atomic import atomic_writer, write_failed
from specbind.runtime.io.out_path import check_out_path

if TYPE_CHECKING:
    from specbind.runtime.bind.bind import Expected, SlotResult

_LONGEST_DTYPE = max(len(d) for d in DTYPES)
# {"dtype":"<dtype>","shape":[16 dims of <= 15 digits],"data_offsets":[<=19 digits,<=19]},
_PER_ENTRY = len('{"dtype":"","shape":[],"data_offsets":[,]},:') + _LONGEST_DTYPE + 16 * 16 + 40
QUEUE_BYTES = 256 << 20  # the most bytes handed to the writer thread and not yet written
WRITEBACK = 64 << 20  # start the kernel's writeback after each this many bytes (see _Background)
LAG = 1 << 30  # the most bytes written whose writeback is not yet waited for


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
        self._thread: _Background | None = None
        self.bytes = 0

    def __enter__(self) -> StreamWriter:
        real = check_out_path(self._out, self._inputs, dirs=self._dirs)
        self._f = self._stack.enter_context(atomic_writer(real))
        self._thread = _Background(self._f, self._digests, str(self._out))
        self._stack.callback(self._thread.abort)  # runs first: no write after the file is gone
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None:
            self._stack.__exit__(*exc)  # type: ignore[arg-type]  # the bind failed: discarded
            return
        try:
            assert self._thread is not None
            self._thread.close()  # every queued byte written, or the thread's error raised
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
        try:
            self._f.write(b"\0" * (8 + self._reserved))  # overwritten by _finish
        except OSError as e:
            raise write_failed(self._out, e, 0) from e

    def slot(self, where: str, bound: SlotResult) -> None:
        for name, a in sorted(bound.weights.arrays().items()):
            self.tensor(f"{where}.{name}", self._backend.to_host(a, bound.fields[name].dtype))

    def tensor(self, name: str, host: Array) -> None:
        """Write one announced tensor's bytes now; nothing of it is kept but its entry."""
        assert self._f is not None, "use StreamWriter as a context manager"
        if name not in self._expected or name in self._entries:
            raise OutputError(f"{self._out}: field {name} was not announced to the writer (a bug)")
        assert self._thread is not None
        flat = np.ascontiguousarray(host).reshape(-1)  # shape -> [n], row-major
        data = flat.view(np.uint8).data  # a view of the mmap: no copy for verbatim fields
        dtype, shape = dtype_name(host), list(host.shape)
        end = self._pos + flat.nbytes
        self._entries[name] = (dtype, shape, self._pos, end)
        # the bytes in hand, hashed once by the thread as they go out
        self._thread.put(name, data, tensor_hasher(name, dtype, shape), 8 + self._reserved + end)
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
        try:
            self._f.seek(0)
            self._f.write(struct.pack("<Q", self._reserved))
            self._f.write(raw + b" " * (self._reserved - len(raw)))
            self._f.seek(0, 2)
        except OSError as e:
            raise write_failed(self._out, e) from e
        self.bytes = 8 + self._reserved + self._pos


class _Background:
    """The thread that hashes and writes queued tensors, in queue order, to ``f``.

    Why a thread: the write (a copy into the page cache, and a wait whenever writeback lags)
    and the hash release the GIL, so they overlap the bind of the next slot.
    Why ``sync_file_range`` (through ctypes: ``os`` has no binding for it): without it the
    kernel holds up to ``dirty_ratio`` of RAM of dirty pages and the final fsync writes them
    all while nothing else runs; started every ``WRITEBACK`` bytes, the disk works through the
    whole bind. Writeback more than ``LAG`` behind is waited for, so dirty pages stay bounded
    while the disk's queue stays deep (waiting one 64 MiB step behind kept it shallow: 33 s
    against 28-35 s for a 2.8 GB rank on the shared machine, within its noise).
    """

    def __init__(self, f: BinaryIO, digests: dict[str, str], where: str) -> None:
        import threading  # here: every bind imports this module, only --out needs a thread

        self._f = f
        self._digests = digests
        self._where = where
        self._cond = threading.Condition()
        self._items: deque[tuple[str, memoryview, Any, int]] = deque()
        self._queued = 0  # bytes queued or being written
        self._error: BaseException | None = None
        self._stop = False
        self._failed_at = 0  # where the tensor whose write failed began: the file's bytes before it
        self._synced = 0  # file offset up to which writeback was started
        self._waited = 0  # ... and up to which it was waited for
        self._sync = _sync_file_range()
        self._thread = threading.Thread(target=self._run, name="specbind-out", daemon=True)
        self._thread.start()

    def put(self, name: str, data: memoryview, hasher: Any, end: int) -> None:
        n = data.nbytes
        with self._cond:
            while self._queued and self._queued + n > QUEUE_BYTES and self._error is None:
                self._cond.wait()
            self._raise()
            self._items.append((name, data, hasher, end))
            self._queued += n
            self._cond.notify_all()

    def close(self) -> None:
        """Wait for every queued byte to be written; raise the thread's error if it had one."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join()
        self._raise()

    def abort(self) -> None:
        """Drop what is queued and wait for the write in progress (the file is discarded)."""
        with self._cond:
            self._stop = True
            self._items.clear()
            self._cond.notify_all()
        self._thread.join()

    def _raise(self) -> None:
        e = self._error
        if e is not None:
            raise write_failed(self._where, e, self._failed_at) from e

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._items and not self._stop:
                    self._cond.wait()
                if not self._items:
                    return
                item = self._items[0]
            try:
                n = self._write(*item)
            except BaseException as e:  # surfaced in the main thread; nothing more is written
                with self._cond:
                    self._error = e
                    self._failed_at = item[3] - item[1].nbytes
                    self._items.clear()
                    self._queued = 0
                    self._cond.notify_all()
                return
            with self._cond:
                if self._items and self._items[0] is item:  # abort() may have cleared it
                    self._items.popleft()
                    self._queued -= n
                self._cond.notify_all()
            del item  # the tensor's memory goes now, not when the next one comes

    def _write(self, name: str, data: memoryview, hasher: Any, end: int) -> int:
        hasher.update(data)
        self._f.write(data)
        self._digests[name] = hasher.hexdigest()
        if end - self._synced >= WRITEBACK:
            self._writeback(end)
        return data.nbytes

    def _writeback(self, end: int) -> None:
        self._f.flush()
        fd = self._f.fileno()
        if self._sync is None:  # no sync_file_range (not Linux): a plain fdatasync, off-thread
            import os

            os.fdatasync(fd) if hasattr(os, "fdatasync") else os.fsync(fd)
        else:
            # start writing [synced, end); wait for what lies more than LAG behind (long done
            # on a disk that keeps up). A failure here is only a lost hint: the final fsync
            # reports any real write error.
            self._sync(fd, self._synced, end - self._synced, _SYNC_WRITE)
            if end - self._waited > LAG:
                self._sync(fd, self._waited, end - LAG - self._waited, _SYNC_WAIT)
                self._waited = end - LAG
        self._synced = end


_SYNC_WRITE = 2  # SYNC_FILE_RANGE_WRITE
_SYNC_WAIT = 1 | 2 | 4  # WAIT_BEFORE | WRITE | WAIT_AFTER


def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    """libc's ``sync_file_range`` (Linux), or None where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    out: Callable[[int, int, int, int], int] = fn
    return out
