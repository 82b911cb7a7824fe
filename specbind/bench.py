"""``specbind bench CKPT``: one rank's bind of a checkpoint of your own, timed beside plain
safetensors slicing of the same bytes — seconds, GiB/s and peak RSS of each, as a fresh process.

Two sides, each a ``python -c`` of its own (so neither's imports, allocations or peak memory
reach the other), interleaved round by round after one warm-up round of each (which also warms
the page cache: these are warm-cache figures), ``--repeat`` rounds, medians and minima:

- specbind: ``bind_checkpoint`` of the rank straight into an ``Arena`` (``into=``): every field
  ends in memory the process owns, made there or copied there once, checks included;
- safetensors: ``safe_open(file, "numpy").get_slice(name)[share]`` for each source tensor the
  bind reads, its rank's rows or columns only, every slice kept (a copy the process owns) —
  what a user writes without specbind, reading the same shares and computing nothing (no
  transform, no check): the reading it costs, not a loader that would match the result.

The shares are the bind's own plans (``reads``): the same tensors, the same rank's rows or
columns, an ep rank's members of a stacked family, a row section of a fused tensor. Each
process reports the seconds from its first line (imports included) to the last byte in memory,
the bytes it holds and its peak RSS (``VmHWM``); the parent times each process start to exit.
GiB/s is the rank's share of the checkpoint (the slices' bytes) over a side's seconds, so both
sides divide the same bytes. Nothing here is a pass/fail gate; the benchmark suite beside the
hand-written loaders lives in a clone's ``benchmarks/``.

Trap: a tensor stored in another shape than its plan (a singleton axis more) is read whole when
replicated; a sharded one is refused by name, as plain slicing has no share to take of it.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from specbind.core.errors import SpecbindError
from specbind.core.planning import Ranks, TensorPlan
from specbind.runtime.binder.tables import ModelTable
from specbind.runtime.io.checkpoint import CheckpointDir
from specbind.runtime.io.source import RawTensor

SIDES = ("specbind", "safetensors")
Span = tuple[int, int]  # [start, stop) along one axis
Read = tuple[str, str, list[Span | None]]  # shard file, stored name, each axis's span (None: all)

# What each side's process prints last: its seconds from its first line, the bytes it holds,
# its peak RSS in MiB (VmHWM: ``ru_maxrss`` would carry the parent's peak across exec).
REPORT = """
hwm = [int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM:")]
print(json.dumps([time.perf_counter() - t0, held, (hwm or [0])[0] / 1024]))
"""

SPECBIND = """
import time
t0 = time.perf_counter()
import json, sys
from pathlib import Path
from specbind.generated import MODELS
from specbind.runtime.binder.backends import Arena
from specbind.runtime.bind.bind import bind_checkpoint
from specbind.runtime.io.checkpoint import CheckpointDir

a = json.loads(sys.stdin.read())
into = Arena()
r = bind_checkpoint(
    CheckpointDir(Path(a["ckpt"])), MODELS[a["model"]], a["overrides"], a["tp"], a["tp_rank"],
    progress=False, ep_size=a["ep"], ep_rank=a["ep_rank"], mtp=a["mtp"], into=into,
)
held = sum(x.nbytes for _, x in r.fields().values())
"""

SAFETENSORS = """
import time
t0 = time.perf_counter()
import json, sys
import ml_dtypes  # safetensors hands out BF16 / FP8 to NumPy only once ml_dtypes is imported
from safetensors import safe_open

a = json.loads(sys.stdin.read())
kept = []
for fn, reads in a["files"].items():
    with safe_open(fn, framework="numpy") as f:
        for name, spans in reads:
            kept.append(f.get_slice(name)[tuple(slice(*s) if s else slice(None) for s in spans)])
held = sum(x.nbytes for x in kept)
"""


def reads(
    ckpt: CheckpointDir, table: ModelTable[Any], overrides: Mapping[str, int] | None,
    ranks: Ranks, mtp: bool = True,
) -> list[Read]:  # fmt: skip
    """Every source tensor the bind of ``ranks`` reads, with the rank's share of it: from the
    layout and the plans alone (names and headers; no tensor byte is read)."""
    return [read for _, _, read in planned(ckpt, table, overrides, ranks, mtp)]


def planned(
    ckpt: CheckpointDir, table: ModelTable[Any], overrides: Mapping[str, int] | None,
    ranks: Ranks, mtp: bool = True,
) -> Iterator[tuple[TensorPlan, RawTensor, Read]]:  # fmt: skip
    """Each source tensor the bind reads: its plan at ``ranks``, the tensor as the bind sees
    it (a view of the map under the spec's name) and the slicing side's read of its share."""
    from specbind.runtime.bind.bind import refuse_idle_ep
    from specbind.runtime.bind.preamble import open_layout, slot_quant
    from specbind.runtime.binder.quant import quantize_rules
    from specbind.runtime.layout.config import values_from_config

    values = values_from_config(table, ckpt.config, dict(overrides or {}))
    geometry = table.make_geometry(values)
    opened = open_layout(ckpt, table, values, mtp)
    quant = slot_quant(table, opened, geometry)
    view, lay = opened.view, opened.lay
    refuse_idle_ep(table.name, table.blocks, ranks.ep_size)  # as the bind refuses, up front

    def one(full: str, plan: TensorPlan) -> tuple[TensorPlan, RawTensor, Read]:
        stored = view.on_disk(full)
        t, raw, fn = ckpt.get(stored), view.get(full), ckpt.file_of(stored)
        assert t is not None and raw is not None and fn is not None  # the layout's own names
        where = view.stored(full)  # a section's or member's first stored row, else None
        inside = where.read_as is not None and (where.row, where.member) != (None, None)
        spans = share(plan, t.shape, (where.name, where.row or 0) if inside else None, full)
        return plan, raw, (str(ckpt.root / fn), stored, spans)

    for index, x in lay.layers.items():
        prefix = lay.split.full_name(table, index, "")
        for slot, fill in x.slots.items():
            assert fill.block is not None  # open_layout refused an unfilled slot
            plan = fill.block.plan(geometry, ranks)
            fill.block.check(geometry, ranks)
            lq = quant[(index, slot)]
            tensors = quantize_rules(fill.block.name, fill.block.tensors, plan, lq)[1].tensors
            for n in fill.names:
                if n in tensors:
                    yield one(prefix + n, tensors[n])
    if table.globals and lay.globals:
        plans = table.block(table.globals).plan(geometry, ranks).tensors
        for n, full in lay.globals.items():
            if n in plans:
                yield one(full, plans[n])


def share(
    plan: TensorPlan, stored: tuple[int, ...], section: tuple[str, int] | None, name: str
) -> list[Span | None]:
    """The rank's share of a stored tensor as a span per axis (None: the whole axis): rows of
    a section, then an ep rank's members (rows of axis 0), then the tp shard's rows or columns."""
    if len(stored) != len(plan.full_shape):
        if plan.kind == "replicated" and plan.members is None and section is None:
            return [None] * len(stored)  # a singleton axis more: the same bytes, read whole
        raise SpecbindError(
            f"bench: {name} is stored as {list(stored)}, planned as {list(plan.full_shape)}: "
            "plain slicing has no share to take of it"
        )
    spans: list[Span | None] = [None] * len(stored)
    row0, rows = (section[1] if section else 0), plan.full_shape[0]
    if plan.members is not None:
        row0, rows = row0 + plan.members[0], plan.members[1]
    if row0 or rows != stored[0]:
        spans[0] = (row0, row0 + rows)
    if plan.kind != "replicated" and plan.local_shape[plan.axis] != plan.full_shape[plan.axis]:
        lo, n = plan.offset, plan.stored_local  # a padded split: its stored rows, no zeros
        spans[plan.axis] = (row0 + lo, row0 + lo + n) if plan.axis == 0 else (lo, lo + n)
    return spans


def _side(code: str, stdin: str, side: str, seen: list[list[float]]) -> Callable[[], None]:
    def run() -> None:
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-c", code + REPORT], input=stdin, capture_output=True, text=True
        )
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise SpecbindError(f"bench: the {side} process failed: {last}")
        seconds, held, rss = json.loads(proc.stdout.strip().splitlines()[-1])
        seen.append([seconds, held, rss, wall])

    return run


def run(
    ckpt: Path, table: ModelTable[Any], overrides: Mapping[str, int] | None, ranks: Ranks,
    repeat: int, mtp: bool = True,
) -> dict[str, Any]:  # fmt: skip
    """Both sides, ``repeat`` interleaved rounds after one warm-up round of each."""
    ck = CheckpointDir(ckpt)
    planned = reads(ck, table, overrides, ranks, mtp)
    files: dict[str, list[tuple[str, list[Span | None]]]] = {}
    for path, name, spans in planned:
        files.setdefault(path, []).append((name, spans))
    inputs = {
        "specbind": json.dumps({
            "ckpt": str(ckpt), "model": table.name, "overrides": dict(overrides or {}),
            "tp": ranks.tp_size, "tp_rank": ranks.tp_rank, "ep": ranks.ep_size,
            "ep_rank": ranks.ep_rank, "mtp": mtp,
        }),
        "safetensors": json.dumps({"files": files}),
    }  # fmt: skip
    codes = {"specbind": SPECBIND, "safetensors": SAFETENSORS}
    seen: dict[str, list[list[float]]] = {s: [] for s in SIDES}
    fns = {s: _side(codes[s], inputs[s], s, seen[s]) for s in SIDES}
    for side in fns.values():
        side()  # warm-up: the page cache, the bytecode
    for s in SIDES:
        seen[s].clear()
    for _ in range(repeat):  # interleaved: a busy spell on the machine falls on both alike
        for side in fns.values():
            side()
    share_bytes = int(seen["safetensors"][0][1])
    row: dict[str, Any] = {
        "checkpoint": str(ckpt), "model": table.name, "tp_size": ranks.tp_size,
        "tp_rank": ranks.tp_rank, "ep_size": ranks.ep_size, "ep_rank": ranks.ep_rank,
        "repeat": repeat, "tensors": len(planned), "share_bytes": share_bytes,
    }  # fmt: skip
    for s in SIDES:
        secs = [r[0] for r in seen[s]]
        median = statistics.median(secs)
        row[s] = {
            "seconds": median, "min_seconds": min(secs),
            "process_seconds": statistics.median(r[3] for r in seen[s]),
            "gib_per_s": share_bytes / median / 2**30, "held_bytes": int(seen[s][0][1]),
            "peak_rss_mib": max(r[2] for r in seen[s]),
        }  # fmt: skip
    row["specbind_over_safetensors"] = row["specbind"]["seconds"] / row["safetensors"]["seconds"]
    return row


def render(r: Mapping[str, Any]) -> str:
    """The row as text: a line of what was measured, a table, the ratio."""
    head = (
        f"{r['checkpoint']} ({r['model']}): tp {r['tp_rank']}/{r['tp_size']}, "
        f"ep {r['ep_rank']}/{r['ep_size']}; {r['tensors']} source tensors, this rank's share "
        f"{r['share_bytes'] / 2**30:.3f} GiB; medians (min) of {r['repeat']} rounds, warm cache"
    )
    lines = [
        head,
        "",
        "| side | seconds (min) | process s | GiB/s | held GiB | peak RSS MiB |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for s in SIDES:
        x = r[s]
        lines.append(
            f"| {s} | {x['seconds']:.3f} ({x['min_seconds']:.3f}) | {x['process_seconds']:.3f} "
            f"| {x['gib_per_s']:.2f} | {x['held_bytes'] / 2**30:.3f} | {x['peak_rss_mib']:.0f} |"
        )
    lines += ["", f"specbind / safetensors slicing: {r['specbind_over_safetensors']:.2f}"]
    return "\n".join(lines)
