"""Which source bytes each rank reads, and the proof that the ranks together read the model
exactly as the parallel layout says: every sharded tensor once per replica, every replicated
tensor whole on each rank that holds it.

A rank's ``Piece`` of a tensor is a strided window of its bytes: ``rows`` rows of ``row_bytes``
each, of which the rank reads ``[lo, lo + width)`` in every row (a row shard or a replicated
tensor is one row). Pieces come from the plan alone (``core.planning``), so they can be
exchanged and checked before any rank binds.

``expect`` is how many ranks must read each byte: a tensor replicated across tp is read by
every tp rank, a unit replicated on ``tp / units`` ranks (KV heads at tp > heads) by those
ranks, and one that is not an expert is read again by every ep rank; an expert's tensors are
read only by the tp ranks of the ep rank that owns it.

A padded split (a vocabulary tp does not divide, ``TensorPlan.zeros``) reads its stored rows
only; its zero rows are no bytes of the checkpoint, and a rank whose share is all padding reads
an empty window, which tiles nothing.

Invariants checked by ``check``:
- every tensor the layout claims is read by some rank (an expert no ep rank owns is caught);
- the ranks agree on each tensor's size and row structure and on its ``expect``;
- the distinct windows of a tensor tile ``[0, row_bytes)`` with no gap and no overlap, and
  each window is read by exactly ``expect`` ranks; a stacked family's ep ranks each read their
  members' rows (``first_row``, ``row_count``), which tile the rows, and the windows tile
  within each ep rank's rows;
- a window read by more than one rank has the same digest on each of them (the same bytes,
  even when the ranks read different copies of the checkpoint on different nodes).
Trap: a digest is taken only of windows more than one rank reads — a window one rank alone
reads has nothing to be compared with, and hashing it would re-read every sharded byte.
"""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from specbind.core.dtypes import DTYPES
from specbind.core.planning import Ranks, TensorPlan
from specbind.core.record import record
from specbind.runtime.binder.quant import LayerQuant, quantize_rules
from specbind.runtime.binder.tables import ModelTable
from specbind.runtime.binder.tp import shard_raw
from specbind.runtime.io.source import TensorSource
from specbind.runtime.layout.slots import Layout

DIGEST_BYTES = 16  # blake2b-128: a collision by chance is not a concern at any model size


@record
class Piece:
    name: str  # the tensor's full checkpoint name
    nbytes: int  # the whole tensor's bytes on disk
    rows: int
    row_bytes: int
    lo: int
    width: int
    expect: int  # ranks that must read each of its bytes
    digest: str = ""  # of the window's bytes, when more than one rank reads it
    first_row: int = 0  # a stacked family: the rows of this ep rank's members only,
    row_count: int = -1  # [first_row, first_row + row_count); -1: every row

    @property
    def read_bytes(self) -> int:
        return (self.rows if self.row_count < 0 else self.row_count) * self.width


def window(plan: TensorPlan, itemsize: int) -> tuple[int, int, int, int]:
    """``(rows, row_bytes, lo, width)`` of this rank's bytes of one tensor (for a stacked
    family, of every member's; ``member_rows`` says which rows this rank reads)."""
    n = math.prod(plan.full_shape) * itemsize
    if plan.members is not None and n:  # rows are per member: [E, ...] as E rows at least
        tp_local = (plan.full_shape[0], *plan.local_shape[1:])
        if plan.kind == "replicated" or tp_local == plan.full_shape:
            return plan.full_shape[0], n // plan.full_shape[0], 0, n // plan.full_shape[0]
    elif n == 0 or plan.kind == "replicated" or plan.local_shape == plan.full_shape:
        return 1, n, 0, n
    inner = math.prod(plan.full_shape[plan.axis + 1 :]) * itemsize  # bytes of one index
    row_bytes = plan.full_shape[plan.axis] * inner
    # a padded split reads its stored rows only: its zero rows are no bytes of the checkpoint
    return n // row_bytes, row_bytes, plan.offset * inner, plan.stored_local * inner


def member_rows(plan: TensorPlan, rows: int) -> tuple[int, int]:
    """``(first_row, row_count)`` of a stacked family's rows this ep rank reads (every row:
    ``(0, -1)``); ``rows`` is ``window``'s row count, a whole multiple of the members."""
    if plan.members is None:
        return 0, -1
    per = rows // plan.full_shape[0]  # rows of one member
    return plan.members[0] * per, plan.members[1] * per


def _digest(data: Any) -> str:
    h = hashlib.blake2b(digest_size=DIGEST_BYTES)
    h.update(np.ascontiguousarray(np.frombuffer(data, dtype=np.uint8)).data)
    return h.hexdigest()


def plan_pieces(
    ckpt: TensorSource,
    table: ModelTable[Any],
    lay: Layout,
    geometry: Any,
    ranks: Ranks,
    quant: Callable[[int, str], LayerQuant | None] = lambda i, s: None,
) -> list[Piece]:
    """This rank's piece of every tensor it will read, with digests where they can be compared.

    Reads only the bytes of windows other ranks read too (replicated tensors, and the tp
    shards of non-expert tensors when ep > 1), through the same ``shard_raw`` the binder uses,
    so a bad dtype, shape or size is refused here exactly as bind would refuse it. A quantized
    linear is planned as its scheme's companions (``quant``: each slot's quantization), each
    split in whole groups as the binder splits it.
    """
    out: list[Piece] = []
    for index, x in lay.layers.items():
        prefix = lay.split.full_name(table, index, "")
        for slot, fill in x.slots.items():
            assert fill.block is not None  # refuse_problems ran first
            plan = fill.block.plan(geometry, ranks)
            _, plan = quantize_rules(fill.block.name, fill.block.tensors, plan, quant(index, slot))
            present = set(fill.names)
            pairs = [(n, p, prefix + n) for n, p in plan.tensors.items() if n in present]
            out.extend(_pieces(ckpt, pairs, ranks, index))
    if table.globals and lay.globals:
        plan = table.block(table.globals).plan(geometry, ranks)
        pairs = [(n, p, lay.globals[n]) for n, p in plan.tensors.items() if n in lay.globals]
        out.extend(_pieces(ckpt, pairs, ranks, -1))
    return out


def _pieces(
    ckpt: TensorSource, pairs: Sequence[tuple[str, TensorPlan, str]], ranks: Ranks, layer: int
) -> Iterator[Piece]:
    for rel, plan, full in pairs:
        t = ckpt.get(full)
        assert t is not None  # the layout's names come from the checkpoint
        disk = t.dtype if t.dtype in (plan.dtype, *plan.stored) else plan.dtype
        itemsize = DTYPES[disk].bits // 8
        rows, row_bytes, lo, width = window(plan, itemsize)
        # a family member, or a stacked family's rows: one ep rank owns them
        family = plan.pattern != rel or plan.members is not None
        tp_copies = ranks.tp_size if plan.kind == "replicated" else plan.replicas
        expect = tp_copies * (1 if family else ranks.ep_size)
        digest = ""
        if expect > 1:
            digest = _digest(shard_raw(plan, t, layer).data)
        first, count = member_rows(plan, rows)
        yield Piece(full, len(t.data), rows, row_bytes, lo, width, expect, digest, first, count)


def claimed_names(table: ModelTable[Any], lay: Layout) -> set[str]:
    """Every tensor name of the layout that some rank must read (each slot's and the globals)."""
    out = set(lay.globals.values()) if table.globals else set()
    for index, x in lay.layers.items():
        prefix = lay.split.full_name(table, index, "")
        for fill in x.slots.values():
            out.update(prefix + n for n in fill.names)
    return out


def check(by_rank: Sequence[Sequence[Piece]], claimed: set[str]) -> list[str]:
    """Every way the ranks' pieces fail to read the layout exactly once per replica, one line
    each (empty when the proof holds)."""
    pieces: dict[str, list[tuple[int, Piece]]] = defaultdict(list)
    for rank, ps in enumerate(by_rank):
        for p in ps:
            pieces[p.name].append((rank, p))
    problems = [f"{n}: no rank reads it" for n in sorted(claimed - set(pieces))]
    problems += [f"{n}: read, but not in the layout" for n in sorted(set(pieces) - claimed)]
    for name in sorted(pieces):
        problems.extend(_check_one(name, pieces[name]))
    return problems


def _ranks(rs: Sequence[int]) -> str:
    return ("rank " if len(rs) == 1 else "ranks ") + ",".join(map(str, rs))


def _check_one(name: str, pieces: Sequence[tuple[int, Piece]]) -> list[str]:
    shapes: dict[tuple[int, int, int, int], list[int]] = defaultdict(list)
    for r, p in pieces:
        shapes[(p.nbytes, p.rows, p.row_bytes, p.expect)].append(r)
    if len(shapes) > 1:
        shown = "; ".join(
            f"{n} B as {rows} x {rb} B read by {e} on {_ranks(rs)}"
            for (n, rows, rb, e), rs in shapes.items()
        )
        return [f"{name}: the ranks plan it differently: {shown}"]
    (_, rows, row_bytes, expect) = next(iter(shapes))
    by_rows: dict[tuple[int, int], list[tuple[int, Piece]]] = defaultdict(list)
    for r, p in pieces:
        count = rows if p.row_count < 0 else p.row_count
        by_rows[(p.first_row, count)].append((r, p))
    out: list[str] = []
    end = 0
    for first, count in sorted(by_rows):  # a stacked family's ep ranks tile its rows
        if first != end:
            out.append(f"{name}: rows [{min(first, end)}, {max(first, end)}) are read by "
                       f"{'no rank' if first > end else 'two ep ranks'}")  # fmt: skip
        end = max(end, first + count)
        out.extend(_check_rows(name, row_bytes, expect, by_rows[(first, count)]))
    if end < rows:
        out.append(f"{name}: rows [{end}, {rows}) are read by no rank")
    return out


def _check_rows(
    name: str, row_bytes: int, expect: int, pieces: Sequence[tuple[int, Piece]]
) -> list[str]:
    """The column windows of one set of rows tile ``[0, row_bytes)``, each read ``expect``
    times, with one digest."""
    windows: dict[tuple[int, int], list[tuple[int, Piece]]] = defaultdict(list)
    for r, p in pieces:
        windows[(p.lo, p.width)].append((r, p))
    out: list[str] = []
    end = 0
    for lo, width in sorted(windows):
        if width == 0:  # a padded split's rank past the stored rows: it reads no byte
            continue
        readers = [r for r, _ in windows[(lo, width)]]
        if lo > end:
            out.append(f"{name}: bytes [{end}, {lo}) of each row are read by no rank")
        elif lo < end:
            out.append(
                f"{name}: bytes [{lo}, {end}) of each row are read twice ({_ranks(readers)})"
            )
        end = max(end, lo + width)
        if len(readers) != expect:
            out.append(
                f"{name}: bytes [{lo}, {lo + width}) are read by {_ranks(readers)}, "
                f"expected {expect} rank(s)"
            )
        out.extend(_same_bytes(name, lo, width, windows[(lo, width)]))
    if end < row_bytes:
        out.append(f"{name}: bytes [{end}, {row_bytes}) of each row are read by no rank")
    return out


def _same_bytes(name: str, lo: int, width: int, readers: Sequence[tuple[int, Piece]]) -> list[str]:
    by_digest: dict[str, list[int]] = defaultdict(list)
    for r, p in readers:
        by_digest[p.digest].append(r)
    if len(by_digest) <= 1:
        return []
    shown = " but ".join(f"{d[:12] or 'none'} on {_ranks(rs)}" for d, rs in by_digest.items())
    return [f"{name}: bytes [{lo}, {lo + width}) differ between ranks: {shown}"]


def summary(by_rank: Sequence[Sequence[Piece]]) -> dict[str, int]:
    """Counts for the report: tensors, how many are sharded, bytes read, digests compared."""
    names: Mapping[str, Piece] = {p.name: p for ps in by_rank for p in ps}
    return {
        "tensors": len(names),
        "sharded": sum(1 for p in names.values() if p.width < p.row_bytes),
        "bytes_read": sum(p.read_bytes for ps in by_rank for p in ps),
        "digests_compared": sum(1 for ps in by_rank for p in ps if p.digest),
    }
