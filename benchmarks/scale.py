"""``python -m benchmarks --scale``: one rank's share of the real model, from a sparse checkpoint.

For each size (1, 4 and 46 layers: 1 and 4 decoder layers, then all 45 plus the MTP layer),
``synth --full --sparse`` writes the checkpoint once (headers only; the data are holes), and a
fresh process per run binds one rank's share streaming to ``--out``: tp 8 x ep 8 rank (0, 0),
every block; and tp 1, the attention slot only. Each run reports:
- ``index_open_s``: ``CheckpointDir(...)``: the index, every shard header, every path check;
- ``planning_s`` and ``per_tensor_us``: the layout (names to layers, slots and blocks), the
  refusal of any problem, every block's plan and constraint checks, over every tensor of the
  checkpoint (the bind repeats this pass; it is timed on its own first);
- ``bind_s``: the streaming bind and write, to the last byte handed to the file; of it,
  ``write_s`` in the writes (the copy into the page cache, and any wait for writeback on a
  busy disk), and after it ``fsync_s``: the header, fsync and rename;
- ``peak_rss_mb`` (VmHWM) beside the largest single output field: streaming keeps one slot's
  output at a time, so the peak must be that plus a fixed margin, not the rank's bytes;
- ``memcpy_s``: a copy of as many bytes as were written, 256 MiB at a time between two
  buffers — the limit for a loader that moves the rank's bytes once.
Trap: the input is holes, which read back as zeros without touching a disk, and the absorbs
multiply zeros: this measures specbind's overhead and memory, not disk speed or numerics. The
``--out`` file is real (written to the cache directory's disk), and so is its fsync.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from specbind.core.errors import SpecbindError

SIZES = (1, 4, 46)  # layers, the MTP layer counted in the last
RANKS = ({"part": "all", "tp": 8, "ep": 8}, {"part": "attention", "tp": 1, "ep": 1})


def ensure_sparse(table: Any, cache: Path, layers: int) -> Path:
    """The sparse real-geometry checkpoint of ``layers`` layers (the last one the MTP layer
    when ``layers`` is the model's whole count)."""
    from specbind.generated import SPECS_SHA256
    from specbind.synth import synth

    whole = table.real_layers + table.real_mtp
    decoder, mtp = (table.real_layers, True) if layers == whole else (layers, False)
    ck = cache / f"{table.name}-sparse-{layers}-{SPECS_SHA256[:12]}"
    if not (ck / "config.json").exists():
        synth(table, ck, table.default_values(), layers=decoder, mtp=mtp, sparse=True)
    return ck


def child(ckpt: str, out: str, tp: int, ep: int, part: str) -> dict[str, Any]:
    """One streamed bind in this (fresh) process; its phases, bytes and peak RSS."""
    from benchmarks.common import parts, peak_rss_mb
    from specbind.api import model_table
    from specbind.core.planning import Ranks
    from specbind.generated import SPECS_SHA256
    from specbind.runtime.bind.bind import bind_checkpoint
    from specbind.runtime.bind.preamble import refuse_problems
    from specbind.runtime.binder.backends import NUMPY
    from specbind.runtime.bound.bound_format import BoundMeta
    from specbind.runtime.bound.stream_out import StreamWriter
    from specbind.runtime.io.checkpoint import CheckpointDir
    from specbind.runtime.layout.config import values_from_config
    from specbind.runtime.layout.slots import layout

    table = model_table(None, "--model", CheckpointDir(Path(ckpt)).config)  # as the CLI picks
    kinds = None if part == "all" else parts(table)[part]
    t0 = time.perf_counter()
    ck = CheckpointDir(Path(ckpt))
    t1 = time.perf_counter()
    values = values_from_config(table, ck.config)
    geometry = table.make_geometry(values)
    lay = layout(table, ck.names(), ck.config)
    refuse_problems(lay)
    ranks = Ranks(tp, 0, ep, 0)
    for name in {f.block.name for x in lay.layers.values() for f in x.slots.values() if f.block}:
        table.block(name).plan(geometry, ranks)
        table.block(name).check(geometry, ranks)
    t2 = time.perf_counter()
    writer = StreamWriter(Path(out), BoundMeta(table.name, SPECS_SHA256, ranks, values), NUMPY)
    largest = 0
    write_s = 0.0

    class Counting:
        def start(self, expected: Any) -> None:
            writer.start(expected)

        def slot(self, where: str, bound: Any) -> None:
            nonlocal largest, write_s
            largest = max([largest, *(a.nbytes for a in bound.weights.arrays().values())])
            t = time.perf_counter()
            writer.slot(where, bound)
            write_s += time.perf_counter() - t

    with writer:
        bind_checkpoint(ck, table, tp_size=tp, ep_size=ep, kinds=kinds, sink=Counting())
        t3 = time.perf_counter()
    t4 = time.perf_counter()
    tensors = len(ck.names())
    return {
        "tensors": tensors, "index_open_s": t1 - t0, "planning_s": t2 - t1,
        "per_tensor_us": (t2 - t1) / tensors * 1e6, "bind_s": t3 - t2, "write_s": write_s,
        "fsync_s": t4 - t3,
        "bytes": writer.bytes, "largest_field_mb": largest / 2**20, "peak_rss_mb": peak_rss_mb(),
    }  # fmt: skip


def memcpy_seconds(nbytes: int, chunk: int = 256 << 20) -> float:
    src = np.ones(chunk, dtype=np.uint8)
    dst = np.zeros_like(src)
    np.copyto(dst, src)  # both buffers paged in before the clock starts
    t0 = time.perf_counter()
    left = nbytes
    while left > 0:
        n = min(chunk, left)
        np.copyto(dst[:n], src[:n])
        left -= n
    return time.perf_counter() - t0


def _run_child(ckpt: Path, out: Path, rank: dict[str, Any]) -> dict[str, Any]:
    call = f"child({str(ckpt)!r}, {str(out)!r}, {rank['tp']}, {rank['ep']}, {rank['part']!r})"
    code = f"import json; from benchmarks.scale import child; print(json.dumps({call}))"
    from benchmarks.common import lab_env

    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=lab_env()
    )
    if proc.returncode != 0:
        raise SpecbindError(f"bench --scale child failed: {proc.stderr.strip().splitlines()[-1:]}")
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def run(table: Any, cache: Path, repeat: int, sizes: tuple[int, ...] = SIZES) -> dict[str, Any]:
    cache.mkdir(parents=True, exist_ok=True)
    rows = []
    for layers in sizes:
        ckpt = ensure_sparse(table, cache, layers)
        for rank in RANKS:
            out = cache / f"scale-out-{layers}-{rank['part']}.safetensors"
            runs = []
            for _ in range(repeat):
                r = _run_child(ckpt, out, rank)
                r["memcpy_s"] = memcpy_seconds(r["bytes"])
                runs.append(r)
            out.unlink(missing_ok=True)
            med = {k: statistics.median(x[k] for x in runs) for k in runs[0]}
            mins = {k: min(x[k] for x in runs) for k in runs[0]}
            rows.append({"layers": layers, **rank, "repeat": repeat, "median": med, "min": mins,
                         "fraction_of_memcpy": med["memcpy_s"] / med["bind_s"]})  # fmt: skip
    return {"rows": rows}


HEAD = (
    "| layers | part | tp x ep | tensors | index open s | planning us/tensor | bind s (min) "
    "| of it write s | +fsync s | GB written | memcpy s | memcpy share | largest field MB "
    "| peak RSS MB |"
)


def render(r: dict[str, Any]) -> str:
    lines = [HEAD, "|" + "---:|" * (HEAD.count("|") - 1)]
    for x in r["rows"]:
        m, n = x["median"], x["min"]
        cells = [
            f"{x['layers']}", x["part"], f"{x['tp']} x {x['ep']}", f"{m['tensors']:.0f}",
            f"{m['index_open_s']:.3f}", f"{m['per_tensor_us']:.1f}",
            f"{m['bind_s']:.2f} ({n['bind_s']:.2f})", f"{m['write_s']:.2f}", f"{m['fsync_s']:.2f}",
            f"{m['bytes'] / 1e9:.2f}", f"{m['memcpy_s']:.2f}", f"{x['fraction_of_memcpy']:.2f}",
            f"{m['largest_field_mb']:.0f}", f"{m['peak_rss_mb']:.0f}",
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
