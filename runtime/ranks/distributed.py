"""Bind one shard per rank, every rank at once, and prove together that the shards are the model.

Launched as ``torchrun --nproc-per-node N -m specbind bind CKPT --out-dir D`` (or with
``--nnodes/--node-rank``), or as a plain ``specbind bind CKPT --out-dir D`` (a world of one).

The parallel layout: world = tp_size x ep_size. ``--ep-size`` defaults to 1 and ``--tp-size``
to world / ep_size; a product other than the world is refused. Rank r is tp rank ``r % tp``
of ep rank ``r // tp`` (tp innermost, so a tp group shares a node when tp <= the ranks per
node). ``--tp-rank``/``--ep-rank`` are refused: the process group gives the rank.

Phases, each closed by a collective on which every rank reports success or its error:
1. prepare: open the checkpoint, plan its layout, check the output path; all-gather each
   rank's description (``runtime.ranks.agreement``) and refuse, on every rank, any disagreement;
2. plan: each rank's byte windows of every tensor (``runtime.ranks.byte_coverage``), with
   digests where other ranks read the same bytes; gathered on rank 0 (one rank holds every
   rank's windows, not all of them), which proves the coverage and broadcasts the verdict
   (and, before it, removes the index of any earlier run in D);
3. bind: bind this rank's shard, streamed into ``D/rank-RRRRR-of-WWWWW.safetensors`` as it goes
   (``stream_out.StreamWriter``, as ``bind --out``: one slot's output in memory at a time; the
   file appears whole or not at all);
4. index: rank 0 writes ``D/specbind-index.json`` (atomically) naming the layout and every
   rank's file, only once every rank's file is written.
Rank 0 prints one report (text, or ``--json``) and shows the one progress bar; the other ranks
print nothing on success. Digests cost a hash of every replicated byte on every rank (and, at
ep > 1, of each non-expert tp shard), read before the bind, which then finds them cached.

Invariants: the collectives carry metadata only (descriptions, windows, digests, statuses);
if any rank fails — a bad shard, a missing file, an exception — every rank raises the same
``DistributedError`` naming the first failing rank and its message, and exits non-zero; a
rank that dies or hangs makes the others' next collective fail within the timeout (torchrun
also tears down a node's other workers when one dies). A directory with rank files but no
index is an unfinished run: the index is the commit point.
Trap: with node-local output directories each node holds its own ranks' files and only node 0's
holds the index; give every node the same shared ``--out-dir`` for one complete directory.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from specbind.core.errors import DistributedError, RankError, SpecbindError
from specbind.core.planning import Ranks
from specbind.core.record import record
from specbind.core.units import GIB, done, size
from specbind.runtime.bind.bind import ReportOnly, bind_checkpoint
from specbind.runtime.bind.preamble import NamedView, open_layout, slot_quant
from specbind.runtime.binder.backends import Backend
from specbind.runtime.binder.quant import LayerQuant
from specbind.runtime.binder.tables import ModelTable
from specbind.runtime.bound.bound_format import BoundMeta
from specbind.runtime.bound.stream_out import StreamWriter
from specbind.runtime.io.atomic import atomic_writer
from specbind.runtime.io.checkpoint import CheckpointDir
from specbind.runtime.io.out_path import check_out_path
from specbind.runtime.layout.config import values_from_config
from specbind.runtime.layout.slots import Layout
from specbind.runtime.ranks import agreement, byte_coverage
from specbind.runtime.ranks.comm import Comm

INDEX = "specbind-index.json"
T = TypeVar("T")


@record
class Job:
    """One ``bind`` across ranks, as the CLI was asked for it (the same on every rank)."""

    ckpt: Path
    table: ModelTable[Any]
    specs_sha256: str
    overrides: dict[str, int]
    tp_size: int | None
    ep_size: int
    backend: Backend
    out_dir: Path | None
    progress: bool | None = None
    allow_unshared_scales: bool = False
    quant_outputs: tuple[str, ...] = ()
    mtp: bool = True  # False: the decoder alone (--no-mtp)


def rank_file(rank: int, world: int) -> str:
    return f"rank-{rank:05d}-of-{world:05d}.safetensors"


def place(world: int, rank: int, tp_size: int | None, ep_size: int) -> Ranks:
    """This rank's (tp, ep) place in a world of ``tp_size x ep_size`` ranks."""
    if ep_size < 1:
        raise RankError(f"--ep-size {ep_size}: must be >= 1")
    if tp_size is None:
        if world % ep_size:
            raise RankError(f"--ep-size {ep_size} does not divide the {world} rank(s)")
        tp_size = world // ep_size
    if tp_size * ep_size != world:
        raise RankError(
            f"--tp-size {tp_size} x --ep-size {ep_size} = {tp_size * ep_size} ranks, but "
            f"{world} rank(s) run (launch them with torchrun --nproc-per-node)"
        )
    return Ranks(tp_size, rank % tp_size, ep_size, rank // tp_size)


def _error(e: BaseException) -> str:
    if isinstance(e, SpecbindError):
        return str(e)
    if isinstance(e, OSError):
        where = f"{e.filename}: " if e.filename else ""
        return f"{where}{e.strerror or e}"
    return f"internal error: {type(e).__name__}: {e}"


def _step(
    comm: Comm, phase: str, fn: Callable[[], T], share: Callable[[T], Any] = lambda _: None
) -> tuple[T, list[Any]]:
    """Run ``fn`` on every rank and all-gather (error, ``share(value)``); raise on every rank
    if any rank failed, else return this rank's value and every rank's shared payload."""
    value: T | None = None
    err: str | None = None
    try:
        value = fn()
        payload = share(value)
    except Exception as e:
        err, payload = _error(e), None
    statuses = comm.all_gather((err, payload))
    _raise_first(comm, phase, [s[0] for s in statuses])
    return value, [s[1] for s in statuses]  # type: ignore[return-value]  # no error: set


def _raise_first(comm: Comm, phase: str, errors: list[str | None]) -> None:
    failed = [(r, m) for r, m in enumerate(errors) if m is not None]
    if failed:
        r, msg = failed[0]
        more = f" (and {len(failed) - 1} more rank(s) failed)" if len(failed) > 1 else ""
        raise DistributedError(f"rank {r} of {comm.world} failed while {phase}: {msg}{more}")


@record(frozen=False)
class _Prepared:
    ranks: Ranks
    ckpt: CheckpointDir
    values: dict[str, int]
    geometry: Any
    lay: Layout
    out: Path | None
    describe: dict[str, str]
    view: NamedView  # the checkpoint under the specs' names (the name map, packed names)
    quant: dict[tuple[int, str], LayerQuant | None]  # each slot's quantization


def _prepare(job: Job, comm: Comm) -> _Prepared:
    ranks = place(comm.world, comm.rank, job.tp_size, job.ep_size)
    ckpt = CheckpointDir(job.ckpt)
    values = values_from_config(job.table, ckpt.config, job.overrides)
    geometry = job.table.make_geometry(values)
    opened = open_layout(ckpt, job.table, values, job.mtp)
    view, lay = opened.view, opened.lay
    # as bind_checkpoint decides it, before any byte
    quant = slot_quant(job.table, opened, geometry, job.quant_outputs, job.allow_unshared_scales)
    out = None
    if job.out_dir is not None:
        given = job.out_dir / rank_file(comm.rank, comm.world)
        out = check_out_path(given, ckpt.files(), "--out-dir", ckpt.dirs())
        check_out_path(job.out_dir / INDEX, ckpt.files(), "--out-dir", ckpt.dirs())
    shape = f"world {comm.world} = tp {ranks.tp_size} x ep {ranks.ep_size}"
    desc = agreement.describe(job.specs_sha256, job.table.name, shape, job.overrides, ckpt)
    return _Prepared(ranks, ckpt, values, geometry, lay, out, desc, view, quant)


def run(job: Job, comm: Comm) -> dict[str, Any] | None:
    """Bind across every rank of ``comm``; the report on rank 0, None on the others."""
    t0 = time.perf_counter()
    p, descs = _step(
        comm, "reading the checkpoint", lambda: _prepare(job, comm), lambda x: x.describe
    )
    problems = agreement.disagreements(descs)
    if problems:
        raise DistributedError(agreement.refusal(problems))

    def plan() -> list[byte_coverage.Piece]:
        return byte_coverage.plan_pieces(
            p.view, job.table, p.lay, p.geometry, p.ranks, lambda i, s: p.quant.get((i, s))
        )

    pieces, _ = _step(comm, "planning its byte ranges", plan)
    gathered = comm.gather(pieces)
    verdict: list[str] | None = None
    if gathered is not None:  # rank 0
        verdict = byte_coverage.check(gathered, byte_coverage.claimed_names(job.table, p.lay))
        if not verdict and job.out_dir is not None:
            (job.out_dir / INDEX).unlink(missing_ok=True)  # the old run is no longer whole
    verdict = comm.broadcast(verdict)
    if verdict:
        more = f" (and {len(verdict) - 3} more)" if len(verdict) > 3 else ""
        raise DistributedError(
            "the ranks' byte ranges do not cover the model exactly once per replica: "
            + " | ".join(verdict[:3])
            + more
        )

    def bind() -> dict[str, Any]:
        run = partial(
            bind_checkpoint, p.ckpt, job.table, job.overrides, p.ranks.tp_size, p.ranks.tp_rank,
            progress=job.progress if comm.rank == 0 else False,  # one bar, not one per rank
            backend=job.backend, ep_size=p.ranks.ep_size, ep_rank=p.ranks.ep_rank,
            allow_unshared_scales=job.allow_unshared_scales, quant_outputs=job.quant_outputs,
            mtp=job.mtp,
        )  # fmt: skip
        file_bytes: int | None = None
        if p.out is None:  # checks and reports only: each slot dropped once bound
            result = run(sink=ReportOnly())
        else:  # streamed, as bind --out: one slot's output in memory at a time
            head = BoundMeta(job.table.name, job.specs_sha256, p.ranks, p.values, job.overrides,
                             world=comm.world, rank=comm.rank,
                             padding=job.table.padding(p.values, p.ranks))  # fmt: skip
            with StreamWriter(p.out, head, job.backend, p.ckpt.files(), p.ckpt.dirs()) as sink:
                result = run(sink=sink)
            file_bytes = sink.bytes
        row: dict[str, Any] = {
            "rank": comm.rank,
            "tp_rank": p.ranks.tp_rank,
            "ep_rank": p.ranks.ep_rank,
            "host": socket.gethostname(),
            "bytes": result.as_dict()["bytes"],
            "seconds": round(result.seconds, 6),
            "file": None if p.out is None else rank_file(comm.rank, comm.world),
        }
        if file_bytes is not None:
            row["file_bytes"] = file_bytes
        return row

    _, rows = _step(comm, "binding its shard", bind, lambda row: row)

    def index() -> Path | None:
        if comm.rank != 0 or job.out_dir is None:
            return None
        return write_index(job, p, rows, comm.world)

    written, _ = _step(comm, "writing the index", index)  # every rank waits for the index
    if comm.rank != 0:
        return None
    return {
        "world": comm.world,
        "tp_size": p.ranks.tp_size,
        "ep_size": p.ranks.ep_size,
        "rank_order": "rank = ep_rank * tp_size + tp_rank",
        "collectives": comm.backend,
        "specs_sha256": job.specs_sha256,
        "agreed": sorted(p.describe),
        "coverage": byte_coverage.summary(gathered or []),
        "ranks": rows,
        "out_dir": None if job.out_dir is None else str(job.out_dir),
        "index": None if written is None else str(written),
        "seconds": round(time.perf_counter() - t0, 6),
    }


def write_index(job: Job, p: _Prepared, rows: list[dict[str, Any]], world: int) -> Path:
    """``D/specbind-index.json``: the layout and each rank's file, written atomically last."""
    assert job.out_dir is not None
    doc = {
        "format": "specbind-ranks/1",
        "model": job.table.name,
        "specs_sha256": job.specs_sha256,
        "world": world,
        "tp_size": p.ranks.tp_size,
        "ep_size": p.ranks.ep_size,
        "rank_order": "rank = ep_rank * tp_size + tp_rank",
        "geometry": p.values,
        "overrides": job.overrides,
        "checkpoint": p.describe,
        "ranks": [
            {k: r[k] for k in ("rank", "tp_rank", "ep_rank", "host", "file", "file_bytes")}
            for r in rows
        ],
    }
    path = check_out_path(job.out_dir / INDEX, p.ckpt.files(), "--out-dir", p.ckpt.dirs())
    with atomic_writer(path) as f:
        f.write((json.dumps(doc, indent=2, sort_keys=True) + "\n").encode())
    return path


def render(rep: dict[str, Any]) -> str:
    """The text report rank 0 prints."""
    row = "{:>5} {:>4} {:>4}  {:<16} {:>14} {:>8} {:>9}  {}"
    lines = [row.format("rank", "tp", "ep", "host", "bytes", "GiB", "seconds", "file")]
    for r in rep["ranks"]:
        cells = (r["rank"], r["tp_rank"], r["ep_rank"], r["host"][:16], r["bytes"])
        gib = f"{r['bytes'] / GIB:.2f}"
        lines.append(row.format(*cells, gib, f"{r['seconds']:.3f}", r["file"] or "-"))
    c = rep["coverage"]
    lines.append(
        f"{rep['world']} rank(s) = tp {rep['tp_size']} x ep {rep['ep_size']} over "
        f"{rep['collectives']}: agreed on {len(rep['agreed'])} facts (spec hash, layout, "
        f"checkpoint files, config, tensors); {c['tensors']} tensors ({c['sharded']} sharded) "
        f"read exactly once per replica, {size(c['bytes_read'])} in all, {c['digests_compared']} "
        f"shared ranges compared by digest; {rep['seconds']:.3f} s"
        + (f"; wrote {rep['index']}" if rep["index"] else "")
    )
    lines.append(done("bound", sum(r["bytes"] for r in rep["ranks"]), rep["seconds"]))
    return "\n".join(lines)
