"""``python -m benchmarks`` rows that separate what the machine limits from what specbind adds.

Each row is interleaved rounds (every method once per round, after one warm-up round), median
and minimum, every byte touched on every side:

- ``rank``: an in-memory bind of one rank (every block, (tp, ep) rank 0) of the slice's real,
  non-sparse data, every field then copied into an arena (what an upload does), beside a memcpy
  of as many bytes out of the checkpoint's page-cache pages into the same arena: the limit for
  a loader that moves the rank's bytes once. A size whose rank is over ``ARENA_LIMIT`` is
  skipped with its reason (the arena and the bind's own copies must fit one process).
- ``out``: the same kind of rank bound to a file as ``bind --out`` does (``StreamWriter``:
  written, fsync'd, renamed), beside ``dd if=<that file> of=<another> bs=64M conv=fdatasync``:
  the same bytes, durable, at the disk's speed. Both files lie in the cache directory, on one
  disk; each round writes new files. The ``--out`` side also binds (reads, slices, absorbs).
- ``planning``: the layout, the refusal of any problem, every block's plan and constraint
  checks over every tensor of the sparse real-geometry checkpoint (``scale.ensure_sparse``) at
  tp 8 x ep 8, in a fresh process per round; microseconds per tensor.
- ``runai``: runai-model-streamer (``SafetensorsStreamer.stream_files(..., tensor_names=...)``)
  streams the whole tensors this rank needs, then the vLLM-style loader
  (``baselines/vllm_style.py``) slices, concatenates, stacks and absorbs them in NumPy, as a
  user would; beside specbind's bind and the same loader on the memory map; each then copied
  into the arena. Outputs are checked equal to specbind's before timing. Skipped, with the
  reason, when the package or torch (it returns torch tensors) is absent: both are optional
  (``pip install specbind[loaders]``).
Trap: the ``rank`` and ``runai`` rows bind the attention and expert blocks and (``rank``) every
other block of the rank; the vLLM-style loader knows the attention and MoE blocks only, so the
``runai`` row binds those (``kinds``) on every side.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import interleaved, lab_env, parts, say
from specbind.core.errors import SpecbindError
from specbind.runtime.binder.checks import Array
from specbind.runtime.binder.tables import ModelTable
from specbind.runtime.io.checkpoint import CheckpointDir

ARENA_LIMIT = 2 << 30  # the most bytes of one rank an in-memory row holds (plus the bind's own)
# The runai row holds specbind's, the hand loader's and the streamed loader's outputs, the
# streamed whole tensors and the arena at once: about 5.5x the rank's bytes at its peak (5.8 GB
# RSS for a 1.0 GB rank at tp 2 x ep 2 of the full slice), so it keeps to a smaller rank.
RUNAI_LIMIT = 768 << 20
PLAN_RANKS = (8, 8)  # tp x ep of the planning row


def _stats(times: dict[str, list[float]]) -> dict[str, Any]:
    return {
        k: {"median_s": statistics.median(v), "min_s": min(v), "runs": len(v)}
        for k, v in times.items()
    }


def _ratio(s: dict[str, Any], a: str, b: str) -> dict[str, float]:
    return {
        "median": s[a]["median_s"] / s[b]["median_s"],
        "min": s[a]["min_s"] / s[b]["min_s"],
    }


def _fields(
    ckpt: Path, table: ModelTable[Any], tp: int, ep: int, kinds: Collection[str] | None = None
) -> list[Array]:
    from specbind.runtime.bind.bind import bind_checkpoint

    r = bind_checkpoint(
        CheckpointDir(ckpt), table, tp_size=tp, ep_size=ep, progress=False, kinds=kinds
    )
    return [a for _, a in r.fields().values()]


def _specbind_load(
    ckpt: Path, table: ModelTable[Any], tp: int, ep: int, kinds: Collection[str]
) -> dict[str, Array]:
    """``kinds``' fields of rank 0, keyed ``layer.slot.field``."""
    from specbind.runtime.bind.bind import bind_checkpoint

    r = bind_checkpoint(
        CheckpointDir(ckpt), table, tp_size=tp, ep_size=ep, progress=False, kinds=kinds
    )
    return {
        f"{layer.index}.{name}.{k}": v
        for layer in r.layers
        for name, slot in layer.slots.items()
        for k, v in slot.weights.arrays().items()
    }


def _into(arrays: list[Array], arena: Array) -> int:
    """Copy every array's bytes, in turn, into ``arena``: every byte read and written."""
    pos = 0
    for a in arrays:
        n = a.nbytes
        np.copyto(arena[pos : pos + n].view(a.dtype).reshape(a.shape), a)  # [n B] -> a's shape
        pos += n
    return pos


def _source(ckpt: Path, nbytes: int) -> list[Array]:
    """``nbytes`` of the checkpoint's shard files, as read-only views of their maps."""
    out: list[Array] = []
    for f in sorted(ckpt.glob("*.safetensors")):
        m = np.memmap(f, dtype=np.uint8, mode="r")
        take = min(nbytes, m.size)
        out.append(m[:take])
        nbytes -= take
        if nbytes == 0:
            return out
    raise SpecbindError(f"bench: the slice holds fewer bytes than a rank of it ({ckpt})")


def rank_row(ckpt: Path, table: ModelTable[Any], tp: int, ep: int, repeat: int) -> dict[str, Any]:
    """One rank bound in memory (every block) beside a memcpy of as many bytes."""
    first = _fields(ckpt, table, tp, ep)
    nbytes = sum(a.nbytes for a in first)
    del first
    if nbytes > ARENA_LIMIT:
        return {"tp": tp, "ep": ep, "bytes": nbytes,
                "skipped": f"{nbytes / 2**30:.1f} GiB rank is over the bench's "
                           f"{ARENA_LIMIT / 2**30:.0f} GiB in-memory limit"}  # fmt: skip
    arena = np.zeros(nbytes, dtype=np.uint8)  # paged in before any clock starts
    src = _source(ckpt, nbytes)
    times = interleaved(
        {
            "specbind": lambda: _into(_fields(ckpt, table, tp, ep), arena),
            "memcpy": lambda: _into(src, arena),
        },
        repeat,
        f"rank tp {tp} x ep {ep}",
    )
    s = _stats(times)
    share = _ratio(s, "memcpy", "specbind")
    return {"tp": tp, "ep": ep, "bytes": nbytes, "times": s, "memcpy_share": share}


def _bind_out(ckpt: Path, table: ModelTable[Any], tp: int, ep: int, out: Path) -> int:
    from specbind.core.planning import Ranks
    from specbind.generated import SPECS_SHA256
    from specbind.runtime.bind.bind import bind_checkpoint
    from specbind.runtime.binder.backends import NUMPY
    from specbind.runtime.bound.bound_format import BoundMeta
    from specbind.runtime.bound.stream_out import StreamWriter
    from specbind.runtime.layout.config import values_from_config

    ck = CheckpointDir(ckpt)
    head = BoundMeta(
        table.name, SPECS_SHA256, Ranks(tp, 0, ep, 0), values_from_config(table, ck.config)
    )
    out.unlink(missing_ok=True)
    with StreamWriter(out, head, NUMPY, ck.files(), ck.dirs()) as w:
        bind_checkpoint(ck, table, tp_size=tp, ep_size=ep, progress=False, sink=w)
    return w.bytes


def _dd(src: Path, dst: Path) -> None:
    dst.unlink(missing_ok=True)
    cmd = ["dd", f"if={src}", f"of={dst}", "bs=64M", "conv=fdatasync", "status=none"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SpecbindError(f"bench: {' '.join(cmd)} failed: {proc.stderr.strip()[-200:]}")


def out_row(
    ckpt: Path, table: ModelTable[Any], tp: int, ep: int, repeat: int, where: Path
) -> dict[str, Any]:
    """``bind --out`` of one rank beside ``dd ... conv=fdatasync`` of the same bytes."""
    where.mkdir(parents=True, exist_ok=True)
    src, out, dd = (where / f"{k}.safetensors" for k in ("src", "out", "dd"))
    try:
        nbytes = _bind_out(ckpt, table, tp, ep, src)  # dd's input: the very bytes --out writes
        times = interleaved(
            {
                "out": lambda: _bind_out(ckpt, table, tp, ep, out),
                "dd": lambda: _dd(src, dd),
            },
            repeat,
            f"--out tp {tp} x ep {ep} vs dd",
        )
        same = out.read_bytes() == src.read_bytes() if nbytes < 1 << 30 else None
    finally:
        for f in (src, out, dd):
            f.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # the folder, when nothing else is in it
            where.rmdir()
    s = _stats(times)
    return {
        "tp": tp, "ep": ep, "bytes": nbytes, "times": s, "dd_over_out": _ratio(s, "dd", "out"),
        "out_gbps": nbytes / s["out"]["median_s"] / 1e9,
        "dd_gbps": nbytes / s["dd"]["median_s"] / 1e9,
        "deterministic": same,  # two --out runs wrote the same bytes (None: not compared)
    }  # fmt: skip


def plan_child(ckpt: str, tp: int, ep: int) -> dict[str, Any]:
    """One planning pass over every tensor of ``ckpt`` in this (fresh) process."""
    from specbind.api import model_table
    from specbind.core.planning import Ranks
    from specbind.runtime.bind.preamble import refuse_problems
    from specbind.runtime.layout.config import values_from_config
    from specbind.runtime.layout.slots import layout

    ck = CheckpointDir(Path(ckpt))
    table = model_table(None, "--model", ck.config)
    t0 = time.perf_counter()
    geometry = table.make_geometry(values_from_config(table, ck.config))
    lay = layout(table, ck.names(), ck.config)
    refuse_problems(lay)
    ranks = Ranks(tp, 0, ep, 0)
    for name in {f.block.name for x in lay.layers.values() for f in x.slots.values() if f.block}:
        table.block(name).plan(geometry, ranks)
        table.block(name).check(geometry, ranks)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "tensors": len(ck.names())}


def planning_row(table: ModelTable[Any], cache: Path, layers: int, repeat: int) -> dict[str, Any]:
    from benchmarks.scale import ensure_sparse

    ckpt = ensure_sparse(table, cache, layers)
    tp, ep = PLAN_RANKS
    code = (
        "import json; from benchmarks.limits import plan_child; "
        f"print(json.dumps(plan_child({str(ckpt)!r}, {tp}, {ep})))"
    )
    runs: list[dict[str, Any]] = []

    def one() -> None:
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=lab_env()
        )
        if proc.returncode != 0:
            raise SpecbindError(f"bench planning child failed: {proc.stderr.strip()[-300:]}")
        runs.append(json.loads(proc.stdout))

    interleaved({"planning": one}, repeat, f"planning, {layers} layers sparse")
    runs = runs[1:]  # the warm-up round
    tensors = runs[0]["tensors"]
    us = [r["seconds"] / tensors * 1e6 for r in runs]
    return {"layers": layers, "tp": tp, "ep": ep, "tensors": tensors,
            "us_per_tensor_median": statistics.median(us), "us_per_tensor_min": min(us),
            "runs": len(us)}  # fmt: skip


# --- runai-model-streamer, then NumPy as a user would -----------------------------------


def runai_missing() -> str | None:
    """Why the runai row cannot run here, or None."""
    for module, package in (("runai_model_streamer", "runai-model-streamer"), ("torch", "torch")):
        if importlib.util.find_spec(module) is None:
            return f"{package} is not installed (pip install 'specbind[loaders]')"
    return None


def _streamed(ckpt: Path, names: Collection[str]) -> Any:
    """A vLLM-style loader whose tensors come from runai-model-streamer (only ``names``)."""
    import torch
    from runai_model_streamer import SafetensorsStreamer

    from benchmarks.baselines.vllm_style import _DTYPES, Loader

    class Streamed(Loader):
        def __init__(self) -> None:
            super().__init__(ckpt)
            files = sorted({self._where[n] for n in names})
            self._got: dict[str, Array] = {}
            with SafetensorsStreamer() as s:
                s.stream_files([str(ckpt / f) for f in files], tensor_names=list(names))
                for name, t in s.get_tensors():
                    head = self._files[self._where[name]].head[name]
                    flat = t.reshape(-1).view(torch.uint8).numpy()  # its bytes, no copy
                    self._got[name] = flat.view(_DTYPES[head["dtype"]]).reshape(head["shape"])

        def _slice(self, name: str) -> Array:
            return self._got[name]

    return Streamed()


def _loader_fields(loader: Any, layers: list[tuple[int, str]], tp: int, ep: int,
                   moe: Collection[str]) -> dict[str, Array]:  # fmt: skip
    out: dict[str, Array] = {}
    for index, block in layers:
        e = ep if block in moe else 1  # the loader splits experts only
        got = loader.load(block, index, tp, 0, e, 0)
        out |= {f"{index}.{block}.{k}": v for k, v in got.items()}
    return out


def runai_row(ckpt: Path, table: ModelTable[Any], tp: int, ep: int, repeat: int) -> dict[str, Any]:
    """specbind beside the vLLM-style loader on the map and on runai's streamed tensors."""
    why = runai_missing()
    if why is not None:
        return {"tp": tp, "ep": ep, "skipped": why}
    from benchmarks.baselines.vllm_style import Loader
    from benchmarks.common import filled
    from benchmarks.equal import check_equal, computed_fields

    p = parts(table)
    kinds = p["attention"] | p["experts"]
    layers = [(i, b) for i, _, b in filled(CheckpointDir(ckpt), table, kinds)]

    class Recorder(Loader):  # which whole tensors the hand loader reads for this rank
        def __init__(self, ckpt: Path) -> None:
            super().__init__(ckpt)
            self.seen: set[str] = set()

        def _slice(self, name: str) -> Array:
            self.seen.add(name)
            return super()._slice(name)

    rec = Recorder(ckpt)
    ours = _specbind_load(ckpt, table, tp, ep, kinds)
    nbytes = sum(a.nbytes for a in ours.values())
    if nbytes > RUNAI_LIMIT:  # three loaders' outputs, the streamed tensors and the arena
        return {"tp": tp, "ep": ep, "bytes": nbytes,
                "skipped": f"{nbytes / 2**20:.0f} MiB rank is over the runai row's "
                           f"{RUNAI_LIMIT / 2**20:.0f} MiB in-memory limit"}  # fmt: skip
    theirs = _loader_fields(rec, layers, tp, ep, p["experts"])
    names = sorted(rec.seen)
    streamed = _loader_fields(_streamed(ckpt, names), layers, tp, ep, p["experts"])

    def keyed(d: dict[str, Array]) -> dict[str, Array]:  # layer.(slot|block).field -> layer.field
        return {f"{k.split('.')[0]}.{k.split('.', 2)[2]}": v for k, v in d.items()}

    loose = computed_fields(table, kinds)
    check_equal(keyed(ours), keyed(theirs), loose)
    check_equal(keyed(ours), keyed(streamed), loose)
    offsets = [rec._files[rec._where[n]].head[n]["data_offsets"] for n in names]
    read = sum(e - b for b, e in offsets)
    del ours, theirs, streamed
    arena = np.zeros(nbytes, dtype=np.uint8)

    def run(load: Callable[[], dict[str, Array]]) -> Callable[[], int]:
        return lambda: _into(list(load().values()), arena)

    times = interleaved(
        {
            "specbind": run(lambda: _specbind_load(ckpt, table, tp, ep, kinds)),
            "vllm_style": run(lambda: _loader_fields(Loader(ckpt), layers, tp, ep, p["experts"])),
            "runai_numpy": run(
                lambda: _loader_fields(_streamed(ckpt, names), layers, tp, ep, p["experts"])
            ),
        },
        repeat,
        f"runai tp {tp} x ep {ep}",
    )
    s = _stats(times)
    return {
        "tp": tp, "ep": ep, "bytes": nbytes, "streamed_bytes": read, "tensors": len(names),
        "blocks": sorted(kinds), "times": s,
        "specbind_over_runai": _ratio(s, "specbind", "runai_numpy"),
        "specbind_over_vllm_style": _ratio(s, "specbind", "vllm_style"),
    }  # fmt: skip


def run(
    ckpt: Path, table: ModelTable[Any], cache: Path, sizes: list[tuple[int, int]],
    out_size: tuple[int, int], plan_layers: int, repeat: int,
) -> dict[str, Any]:  # fmt: skip
    """Every row of this module: ``rank`` at each of ``sizes``, ``runai`` at the last of them,
    ``out`` at ``out_size``, ``planning`` on a sparse checkpoint of ``plan_layers`` layers."""
    rows: dict[str, Any] = {"rank": [], "runai": []}
    for tp, ep in sizes:
        say(f"rank tp {tp} x ep {ep} in memory vs memcpy")
        rows["rank"].append(rank_row(ckpt, table, tp, ep, repeat))
        if "skipped" in rows["rank"][-1]:
            say(f"rank tp {tp} x ep {ep} skipped: {rows['rank'][-1]['skipped']}")
    tp, ep = out_size
    say(f"--out tp {tp} x ep {ep} vs dd conv=fdatasync")
    rows["out"] = out_row(ckpt, table, tp, ep, repeat, cache / "limits-out")
    say(f"planning, sparse {plan_layers} layers, tp {PLAN_RANKS[0]} x ep {PLAN_RANKS[1]}")
    rows["planning"] = planning_row(table, cache, plan_layers, repeat)
    for tp, ep in sizes[-1:]:
        say(f"runai-model-streamer + NumPy, tp {tp} x ep {ep}")
        r = runai_row(ckpt, table, tp, ep, repeat)
        if "skipped" in r:
            say(f"runai row skipped: {r['skipped']}")
        rows["runai"].append(r)
    return rows


RUNAI_HEAD = (
    "| runai rank | MB bound | MB streamed | specbind s | vllm-style s | runai + NumPy s "
    "| specbind / runai | specbind / vllm-style |"
)


def _ms(t: dict[str, Any]) -> str:
    return f"{t['median_s']:.3f} ({t['min_s']:.3f})"


def _rat(r: dict[str, float]) -> str:
    return f"{r['median']:.2f} ({r['min']:.2f})"


def render(r: dict[str, Any]) -> list[str]:
    def head(h: str) -> list[str]:
        return [h, "|" + "---:|" * (h.count("|") - 1)]

    lines = ["", "what the machine limits (median (min) s; every byte touched):", ""]
    lines += head("| rank | MB | specbind bind + copy s | memcpy s | memcpy speed share |")
    for x in r["rank"]:
        if "skipped" in x:
            lines.append(f"| tp {x['tp']} x ep {x['ep']} | {x['bytes'] / 1e6:.0f} | skipped: "
                         f"{x['skipped']} | | |")  # fmt: skip
            continue
        t = x["times"]
        cells = [f"tp {x['tp']} x ep {x['ep']}", f"{x['bytes'] / 1e6:.0f}", _ms(t["specbind"]),
                 _ms(t["memcpy"]), _rat(x["memcpy_share"])]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    o = r["out"]
    lines += ["", *head("| --out rank | MB | --out s | dd conv=fdatasync s | dd s / --out s "
                        "| --out GB/s | dd GB/s |")]  # fmt: skip
    t = o["times"]
    lines.append(f"| tp {o['tp']} x ep {o['ep']} | {o['bytes'] / 1e6:.0f} | {_ms(t['out'])} | "
                 f"{_ms(t['dd'])} | {_rat(o['dd_over_out'])} | {o['out_gbps']:.2f} | "
                 f"{o['dd_gbps']:.2f} |")  # fmt: skip
    p = r["planning"]
    lines.append("")
    lines.append(
        f"planning, sparse {p['layers']}-layer checkpoint ({p['tensors']} tensors), tp {p['tp']} "
        f"x ep {p['ep']}, fresh process per run: {p['us_per_tensor_median']:.1f} us/tensor "
        f"(min {p['us_per_tensor_min']:.1f}, {p['runs']} runs)"
    )
    lines += ["", *head(RUNAI_HEAD)]
    for x in r["runai"]:
        if "skipped" in x:
            lines.append(f"| tp {x['tp']} x ep {x['ep']} | skipped: {x['skipped']} | | | | | | |")
            continue
        t = x["times"]
        lines.append(
            f"| tp {x['tp']} x ep {x['ep']} | {x['bytes'] / 1e6:.0f} | "
            f"{x['streamed_bytes'] / 1e6:.0f} | {_ms(t['specbind'])} | {_ms(t['vllm_style'])} | "
            f"{_ms(t['runai_numpy'])} | {_rat(x['specbind_over_runai'])} | "
            f"{_rat(x['specbind_over_vllm_style'])} |"
        )
    return lines
