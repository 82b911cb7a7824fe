"""Read only this rank's bytes of each planned tensor, from the memory-mapped checkpoint.

The plans come from ``core.planning`` (pure); this module applies them to raw bytes.

Invariants:
- a tensor whose on-disk dtype, shape or size disagrees with the plan is refused, never
  truncated (a rule with ``stored_singletons`` also takes the plan's shape with extra size-1
  axes, the same row-major bytes, and reads it as the plan's shape); an on-disk dtype the
  rule accepts as ``stored`` is sliced at its own width and
  converted later by the binder; names without a plan entry pass through untouched, so the
  binder's refusal of an unknown tensor still fires;
- a row shard is a zero-copy slice of the memory map; any other axis is a strided gather of
  only the local slice; the full tensor is never materialised;
- a padded split (``TensorPlan.zeros``, a vocabulary tp does not divide) is a new buffer: the
  rank's stored rows copied once, then zero rows to the planned local shape;
- a stacked family (``TensorPlan.members``) is first cut to this ep rank's rows of axis 0 (a
  zero-copy byte range), then split by tp within them: other ep ranks' experts are never read.
- a family's column shards (the experts' ``down_proj``) are gathered into one buffer, member
  k in slot k of this rank's member order; ``ops.stack`` of exactly those members, in order, is
  that buffer (``stacked_run``, checked by address), so they are copied once, not twice.
Trap: a row slice of ``o_proj`` has the same byte count as its column shard and different
contents; only the column shard is right (the tests compare values, not lengths).
"""

from __future__ import annotations

import math
import mmap
import weakref
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from specbind.core.dtypes import DTYPES
from specbind.core.errors import BindError, at
from specbind.core.patterns import fill, parts
from specbind.core.planning import BlockPlan, TensorPlan
from specbind.core.record import replace
from specbind.runtime.binder.checks import Stored, label, stored
from specbind.runtime.io.source import MapSpan, RawTensor, TensorSource

if TYPE_CHECKING:  # annotations only: numpy.typing costs every start ~1 ms
    import numpy.typing as npt


def shard_raw(
    plan: TensorPlan,
    t: RawTensor,
    layer: int,
    into: npt.NDArray[np.uint8] | None = None,
    named: Callable[[], str] | None = None,
) -> RawTensor:
    """This rank's bytes of one tensor, read from the full tensor's (mapped) bytes.

    ``into``: where a column gather writes (this member's slot of a family's stacked buffer,
    ``ShardedSource``), when it is exactly the local bytes; else a new array. ``named``: how a
    refusal names the tensor (the stored tensor, ``runtime.binder.checks.Stored``), asked only then.

    A dtype the rule neither binds nor accepts passes through unsliced: the binder refuses it
    and says why the dtype matters. A wrong shape or size is refused here, before any slicing
    could truncate it.
    """
    if t.dtype != plan.dtype and t.dtype not in plan.stored:
        return t
    dt = DTYPES[t.dtype]
    if (
        plan.singletons
        and tuple(t.shape) != plan.full_shape
        and _squeezed(t.shape) == _squeezed(plan.full_shape)
    ):
        t = RawTensor(t.dtype, plan.full_shape, t.data, t.span)  # [1, 1, H, 1] -> [H]: same bytes
    if tuple(t.shape) != plan.full_shape:
        raise BindError(
            f"{at(layer)}: {plan.name if named is None else named()} has shape "
            f"{list(t.shape)}, expected {list(plan.full_shape)} ({plan.shape_text})"
        )
    full_bytes = dt.nbytes(plan.full_shape)
    if len(t.data) != full_bytes:
        raise BindError(
            f"{at(layer)}: {plan.name if named is None else named()} is {len(t.data)} B, "
            f"shape {list(plan.full_shape)} implies {full_bytes} B"
        )
    if plan.members is not None:
        t, plan = _members(plan, t)
        full_bytes = len(t.data)
    if plan.kind == "replicated" or plan.local_shape == plan.full_shape:
        return t
    if plan.zeros:  # a padded split: the stored rows, then zero rows (``core.vocab_pad``)
        return RawTensor(t.dtype, plan.local_shape, _padded(plan, t, dt.nbytes(plan.local_shape)))
    if plan.axis == 0:
        return RawTensor(t.dtype, plan.local_shape, shard_view(plan, t.data, t.dtype).data)
    itemsize = dt.bits // 8
    inner = math.prod(plan.full_shape[plan.axis :]) * itemsize  # bytes of one outer index
    lo = plan.offset * math.prod(plan.full_shape[plan.axis + 1 :]) * itemsize
    wide = math.prod(plan.local_shape[plan.axis :]) * itemsize
    if t.span is not None:
        outer = full_bytes // inner
        data = _gather_cols(t, t.span, outer, inner, lo, wide, into)
        return RawTensor(t.dtype, plan.local_shape, data)
    local = np.ascontiguousarray(shard_view(plan, t.data, t.dtype))  # the local slice only
    return RawTensor(t.dtype, plan.local_shape, local.reshape(-1).data)


def _padded(plan: TensorPlan, t: RawTensor, nbytes: int) -> memoryview:
    """A padded split's share (the unit is one row of axis 0): a new buffer holding this
    rank's stored rows, read once, and zeros past them (what vLLM's weight_loader leaves in
    VocabParallelEmbedding's padding rows)."""
    assert plan.axis == 0
    out = np.zeros(nbytes, dtype=np.uint8)
    stored_rows = shard_view(plan, t.data, t.dtype)
    out[: stored_rows.size] = stored_rows
    return out.data


def _members(plan: TensorPlan, t: RawTensor) -> tuple[RawTensor, TensorPlan]:
    """A stacked family's rows of axis 0 that this ep rank owns: one contiguous byte range
    (zero-copy), and the plan of the rest of the read on those rows alone."""
    assert plan.members is not None
    first, count = plan.members
    row = len(t.data) // plan.full_shape[0]  # bytes of one member
    shape = (count, *plan.full_shape[1:])  # [E, ...] -> [E_r, ...]
    span = None if t.span is None else MapSpan(t.span.map, t.span.offset + first * row)
    data = t.data[first * row : (first + count) * row]
    return RawTensor(t.dtype, shape, data, span), replace(plan, full_shape=shape, members=None)


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape without its size-1 axes: what the row-major bytes of a tensor say."""
    return tuple(d for d in shape if d != 1)


def shard_view(
    plan: TensorPlan, data: memoryview, dtype: str | None = None
) -> npt.NDArray[np.uint8]:
    """This rank's bytes of a full tensor as a view, no copy: a contiguous byte range for a
    row shard, a strided [outer, local·B] window for any other axis, everything otherwise.
    ``dtype`` is the on-disk dtype when it differs from the plan's (an accepted ``stored``)."""
    raw = np.frombuffer(data, dtype=np.uint8)
    if plan.kind == "replicated":
        return raw
    itemsize = DTYPES[dtype or plan.dtype].bits // 8
    inner = math.prod(plan.full_shape[plan.axis + 1 :]) * itemsize  # bytes of one index
    grid = raw.reshape(-1, plan.full_shape[plan.axis] * inner)  # [outer, axis·inner·B]
    lo = plan.offset * inner
    window = grid[:, lo : lo + plan.stored_local * inner]  # a padded split: its stored rows
    return window.reshape(-1) if plan.axis == 0 else window


GATHER_BLOCK = 4 << 20  # bytes of source rows mapped at a time during a column gather
# Linux's madvise values (5.14+; Python 3.11's mmap module has no names for them): map every
# page of a range in one call (read: a file's pages; write: fresh memory's) instead of one
# fault per touched page. ``runtime.binder.ops`` and the arena use them too.
MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)


def _gather_cols(
    t: RawTensor,
    span: MapSpan,
    rows: int,
    row_bytes: int,
    lo: int,
    wide: int,
    into: npt.NDArray[np.uint8] | None = None,
) -> memoryview:
    """Copy ``wide`` bytes at ``lo`` of every row, a block of rows at a time, and release each
    block's pages from this process once copied.

    Touching one slice per row of a map makes the kernel map the neighbouring pages too
    (fault-around), so a plain gather leaves the whole tensor in this process's RSS: 258 MB
    peak at TP=8 on a full-geometry layer whose rank holds 95 MB. ``MADV_DONTNEED`` on a
    read-only file mapping only drops our page-table entries; the page cache keeps the data.
    Measured against one ``pread`` per row (which never maps): 6.7 ms against 9.0 ms for a
    full-geometry KDA ``o_proj`` at TP=8.
    Each block is populated (``MADV_POPULATE_READ``) before its copy: the strided copy touches
    one slice per 4 KiB page row, and each first touch is a page fault (fault-around maps 16
    pages at most); populating maps the block's pages in one call. Where the kernel refuses it
    (older than 5.14: ``OSError``) the copy faults the pages in as before; nothing else changes.
    """
    if into is not None and into.size == rows * wide:
        out = into.reshape(rows, wide)  # [rows * wide B] -> [rows, wide B]: a view
    else:
        out = np.empty((rows, wide), dtype=np.uint8)
    grid = np.frombuffer(t.data, dtype=np.uint8).reshape(rows, row_bytes)  # [rows, cols·B]
    step = max(1, GATHER_BLOCK // row_bytes)
    page = mmap.PAGESIZE
    populate = True
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        start = (span.offset + r0 * row_bytes) // page * page
        length = span.offset + r1 * row_bytes - start
        if populate:
            try:
                span.map.madvise(MADV_POPULATE_READ, start, length)
            except OSError:  # an older kernel: the copy below faults the pages in instead
                populate = False
        out[r0:r1] = grid[r0:r1, lo : lo + wide]
        span.map.madvise(mmap.MADV_DONTNEED, start, length)
    return out.reshape(-1).data


def empty_in(shape: tuple[int, ...], dtype: Any, into: Any) -> npt.NDArray[Any]:
    """New memory for a result: inside ``into`` (an ``Arena``, the caller's) when one is
    given, else an array of its own. What every op that makes a field, and the gather, call."""
    out: npt.NDArray[Any] = np.empty(shape, dtype) if into is None else into.empty(shape, dtype)
    return out


# Each family buffer a ShardedSource gathered column shards into, by its address: what
# ``ops.stack`` looks up to return the buffer itself when the members it is given are exactly
# its slots, in order (``stacked_run``). Weak: a buffer lives only as long as its arrays.
_FAMILY_BUFFERS: weakref.WeakValueDictionary[int, npt.NDArray[np.uint8]] = (
    weakref.WeakValueDictionary()
)


def gather_room(plan: BlockPlan, p: TensorPlan) -> Literal["family", "shard"] | None:
    """Where ``ShardedSource`` gathers tensor ``p``'s column shard: ``"family"``, a slot of its
    family's stacked buffer (a member of a family ``plan`` splits by rank); ``"shard"``, room
    of its own in the caller's arena, when there is one; None, no gather at all (a row shard
    is a view, as is a tensor read whole, and a family member's rows past ``members``). The
    one rule, read by the bind's arena reservation too (``runtime.bind.bind``)."""
    if p.kind == "replicated" or p.axis == 0 or p.local_shape == p.full_shape:
        return None
    fam = parts(p.pattern)[1]
    if fam is not None and plan.members is not None and fam in plan.members:
        return "family"
    return "shard" if p.members is None else None


class ShardedSource:
    """A layer source that yields this rank's slice of every planned tensor.

    Slices are taken lazily on ``get``, one tensor at a time, so peak memory is this rank's
    bytes plus one column shard being gathered. The column shards of a family's members (the
    experts' ``down_proj``) are gathered into one buffer, member k in slot k of this rank's
    member order, so the stack that joins them is the buffer itself, not a second copy.
    With ``into`` (an ``Arena``: the caller's memory a bind writes every field into) those
    buffers and every other column shard are gathered there, so a field read verbatim or
    stacked from them is not copied a second time.
    """

    def __init__(self, inner: TensorSource, plan: BlockPlan, layer: int, into: Any = None) -> None:
        self._inner = inner
        self.plan = plan
        self._layer = layer
        self._into = into
        self._slots: dict[str, dict[str, int]] = {}  # family pattern -> member name -> slot
        self._buffers: dict[str, npt.NDArray[np.uint8]] = {}  # family pattern -> its buffer

    def names(self) -> list[str]:
        return self._inner.names()

    def get(self, name: str) -> RawTensor | None:
        t = self._inner.get(name)
        p = self.plan.tensors.get(name)
        if t is None or p is None:
            return t  # not planned: pass through, so the binder's census still sees it
        return shard_raw(p, t, self._layer, self._slot(p, t, name), partial(label, self, name))

    def _slot(self, p: TensorPlan, t: RawTensor, name: str) -> npt.NDArray[np.uint8] | None:
        """This member's slot of its family's buffer, for a column shard read at its planned
        dtype; with an arena, room in it for any other column shard; None for anything else
        (it is gathered, or viewed, on its own)."""
        room = gather_room(self.plan, p)
        if room is None or t.span is None or t.dtype != p.dtype:
            return None
        if room == "shard":
            return None if self._into is None else empty_in((p.local_bytes,), np.uint8, self._into)
        assert self.plan.members is not None
        slots = self._slots.get(p.pattern)
        if slots is None:
            order = self.plan.members[parts(p.pattern)[1] or ""]
            slots = {fill(p.pattern, i): k for k, i in enumerate(order)}
            self._slots[p.pattern] = slots
        k = slots.get(name)
        if k is None:
            return None
        buf = self._buffers.get(p.pattern)
        if buf is None:
            shape = (len(slots), p.local_bytes)  # [members, local B]
            buf = empty_in(shape, np.uint8, self._into)
            self._buffers[p.pattern] = buf
            _FAMILY_BUFFERS[buf.ctypes.data] = buf
        row: npt.NDArray[np.uint8] = buf[k]  # member k's local bytes: a view
        return row

    def stored(self, name: str) -> Stored:
        """As ``LayerSource.stored``: where the tensor lies in the checkpoint."""
        return stored(self._inner, name)

    def whole(self, name: str) -> RawTensor | None:
        """The whole tensor as stored (a zero-copy view of a mapped file), checked against the
        plan's full shape as ``get`` checks it: what a rule about the whole tensor reads on
        every rank. Its bytes are touched only by whoever reads them."""
        t = self._inner.get(name)
        p = self.plan.tensors.get(name)
        if t is None or p is None:
            return t
        whole = replace(p, kind="replicated", local_shape=p.full_shape, members=None)
        return shard_raw(whole, t, self._layer, named=partial(label, self, name))


def stacked_run(members: Sequence[Any]) -> npt.NDArray[Any] | None:
    """The family buffer ``members`` already fill, viewed as their stack ``[n, *member]``, when
    they are exactly its slots in order (same dtype and shape, C-contiguous, each at the next
    slot's address, the buffer no larger): what ``np.stack(members)`` would copy. Else None."""
    first = members[0]
    if not isinstance(first, np.ndarray):
        return None
    buf = _FAMILY_BUFFERS.get(first.ctypes.data)
    if buf is None or buf.nbytes != len(members) * first.nbytes:
        return None
    for k, a in enumerate(members):
        if (
            not isinstance(a, np.ndarray)
            or a.dtype != first.dtype
            or a.shape != first.shape
            or not a.flags.c_contiguous
            or a.ctypes.data != first.ctypes.data + k * first.nbytes
        ):
            return None
    return buf.view(first.dtype).reshape(len(members), *first.shape)  # [n, member B] -> [n, *m]
