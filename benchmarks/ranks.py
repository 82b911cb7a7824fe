"""``python -m benchmarks`` rows for many ranks on one host, and for the loaders users pick
for speed.

- ranks: N worker processes, each binding one tp rank of N of the whole slice (every block)
  and copying every bound field into its own arena, as an upload would. Each round releases
  them all at once (concurrent: one shared page cache, N cores' worth of copies) and then one
  after another (sequential); a round's time is, concurrently, the last finish less the first
  start, and sequentially the sum of each rank's own time. The workers start, import and warm
  up before timing, so process start-up is in neither figure.
- loaders: one process reading every tensor of the same files, tp 1, each tensor then copied
  into a scratch buffer (so every byte is touched, as a weight loader's copy into a parameter
  would): specbind's bind; fastsafetensors (``fastsafe_open(..., nogds=True, device="cpu")``,
  its CPU path without GPUDirect Storage); runai-model-streamer (``SafetensorsStreamer``).
  A loader whose package is absent is skipped with a note; both are optional extras.
All rows are interleaved rounds (every method once per round), reported as median and minimum.
Trap: the clocks compared across processes are ``time.monotonic`` (CLOCK_MONOTONIC, one
system-wide clock on Linux), never ``perf_counter`` offsets of different processes.
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from specbind.core.errors import SpecbindError
from specbind.runtime.binder.tables import ModelTable
from specbind.runtime.io.checkpoint import CheckpointDir

SCRATCH = 64 << 20  # bytes of the loaders' reusable copy target (larger tensors go in pieces)


def _bind_fields(ckpt: Path, table: ModelTable[Any], tp: int, rank: int) -> list[Any]:
    from specbind.runtime.bind.bind import bind_checkpoint

    result = bind_checkpoint(CheckpointDir(ckpt), table, tp_size=tp, tp_rank=rank, progress=False)
    return [a for _, a in result.fields().values()]


def _into_arena(arrays: list[Any], arena: np.ndarray[Any, Any]) -> int:
    pos = 0
    for a in arrays:
        flat = np.ascontiguousarray(a).reshape(-1).view(np.uint8)  # any shape -> [bytes]
        arena[pos : pos + flat.nbytes] = flat
        pos += flat.nbytes
    return pos


def worker(ckpt: str, tp: int, rank: int) -> None:
    """A bench rank: bind once to warm up, say ready, then bind on each ``go`` line."""
    from specbind.api import model_table
    from specbind.runtime.io.checkpoint import CheckpointDir

    table = model_table(None, "--model", CheckpointDir(Path(ckpt)).config)  # as the CLI picks
    fields = _bind_fields(Path(ckpt), table, tp, rank)
    arena = np.empty(sum(a.nbytes for a in fields), dtype=np.uint8)
    del fields
    print(json.dumps({"ready": int(arena.nbytes)}), flush=True)
    for line in sys.stdin:
        if line.strip() != "go":
            break
        t0 = time.monotonic()
        n = _into_arena(_bind_fields(Path(ckpt), table, tp, rank), arena)
        print(json.dumps({"t0": t0, "t1": time.monotonic(), "bytes": n}), flush=True)


def _ask(p: subprocess.Popen[str]) -> dict[str, Any]:
    assert p.stdout is not None
    line = p.stdout.readline()
    if not line:
        raise SpecbindError(f"bench rank worker exited early (rc {p.wait()})")
    out: dict[str, Any] = json.loads(line)
    return out


def _go(p: subprocess.Popen[str]) -> None:
    assert p.stdin is not None
    p.stdin.write("go\n")
    p.stdin.flush()


def ranks_row(ckpt: Path, n: int, repeat: int) -> dict[str, Any]:
    """N ranks binding concurrently beside the same N ranks one after another."""
    from benchmarks.common import lab_env

    code = f"from benchmarks.ranks import worker; worker({str(ckpt)!r}, {n}, %d)"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code % r],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=lab_env(),
        )
        for r in range(n)
    ]
    try:
        rank_bytes = [_ask(p)["ready"] for p in procs]
        conc: list[float] = []
        seq: list[float] = []
        for _ in range(repeat):
            for p in procs:
                _go(p)
            done = [_ask(p) for p in procs]
            conc.append(max(d["t1"] for d in done) - min(d["t0"] for d in done))
            total = 0.0
            for p in procs:
                _go(p)
                d = _ask(p)
                total += d["t1"] - d["t0"]
            seq.append(total)
    finally:
        for p in procs:
            if p.stdin is not None:
                p.stdin.close()
        for p in procs:
            p.wait(timeout=60)
    return {
        "ranks": n,
        "bytes_per_rank": rank_bytes,
        "concurrent_s": statistics.median(conc),
        "concurrent_min_s": min(conc),
        "sequential_s": statistics.median(seq),
        "sequential_min_s": min(seq),
        "concurrent_over_sequential": statistics.median(conc) / statistics.median(seq),
    }


def _touch(t: Any, scratch: np.ndarray[Any, Any]) -> int:
    """Copy a tensor's bytes (NumPy array or CPU torch tensor) through ``scratch``."""
    if not isinstance(t, np.ndarray):
        t = t.contiguous().view(-1).view(dtype=_torch_u8()).numpy()  # [n] of bytes, no copy
    flat = np.ascontiguousarray(t).reshape(-1).view(np.uint8)  # any shape -> [bytes]
    for lo in range(0, flat.nbytes, scratch.nbytes):
        piece = flat[lo : lo + scratch.nbytes]
        scratch[: piece.nbytes] = piece
    return int(flat.nbytes)


def _torch_u8() -> Any:
    import torch

    return torch.uint8


def _specbind(ckpt: Path, table: ModelTable[Any], scratch: np.ndarray[Any, Any]) -> int:
    return sum(_touch(a, scratch) for a in _bind_fields(ckpt, table, 1, 0))


def _fastsafetensors(ckpt: Path, _: Any, scratch: np.ndarray[Any, Any]) -> int:
    from fastsafetensors import fastsafe_open

    files = [str(f) for f in sorted(ckpt.glob("*.safetensors"))]
    n = 0
    with fastsafe_open(filenames=files, nogds=True, device="cpu") as f:
        for k in f.keys():  # noqa: SIM118 (its handle is not a mapping)
            n += _touch(f.get_tensor(k), scratch)
    return n


def _runai(ckpt: Path, _: Any, scratch: np.ndarray[Any, Any]) -> int:
    from runai_model_streamer import SafetensorsStreamer

    n = 0
    with SafetensorsStreamer() as s:
        s.stream_files([str(f) for f in sorted(ckpt.glob("*.safetensors"))])
        for _name, t in s.get_tensors():
            n += _touch(t, scratch)
    return n


LOADERS: dict[str, tuple[str, Callable[[Path, Any, np.ndarray[Any, Any]], int]]] = {
    "fastsafetensors": ("fastsafetensors", _fastsafetensors),
    "runai-model-streamer": ("runai_model_streamer", _runai),
}


def loader_rows(ckpt: Path, table: ModelTable[Any], repeat: int) -> dict[str, Any]:
    """specbind (tp 1, every tensor) beside each installed fast loader, interleaved."""
    from benchmarks.common import interleaved

    scratch = np.empty(SCRATCH, dtype=np.uint8)
    fns: dict[str, Callable[[], int]] = {"specbind": lambda: _specbind(ckpt, table, scratch)}
    skipped = []
    for name, (module, fn) in LOADERS.items():
        if importlib.util.find_spec(module) is None or importlib.util.find_spec("torch") is None:
            skipped.append(f"{name}: not installed (pip install {name}); row skipped")
            continue
        fns[name] = lambda fn=fn: fn(ckpt, table, scratch)  # type: ignore[misc]
    read = {k: fn() for k, fn in fns.items()}  # bytes each one hands over
    times = interleaved(fns, repeat)
    rows = []
    ours = statistics.median(times["specbind"])
    for k, ts in times.items():
        med = statistics.median(ts)
        rows.append(
            {"loader": k, "bytes": read[k], "median_s": med, "min_s": min(ts),
             "gb_per_s": read[k] / med / 1e9, "specbind_over_it": ours / med}
        )  # fmt: skip
    return {"rows": rows, "skipped": skipped}


RANKS_HEAD = (
    "| ranks | MB per rank | concurrent s (min) | sequential s (min) | concurrent / sequential |"
)
LOADERS_HEAD = "| loader (tp 1, every tensor) | GB | s (min) | GB/s | specbind s / its s |"


def render(ranks: list[dict[str, Any]], loaders: dict[str, Any] | None) -> list[str]:
    def head(h: str) -> list[str]:
        return [h, "|" + "---:|" * (h.count("|") - 1)]

    lines: list[str] = []
    if ranks:
        lines += ["", "N ranks on one host (one page cache), every block, tp N:", ""]
        lines += head(RANKS_HEAD)
        for x in ranks:
            mb = "/".join(f"{b / 1e6:.0f}" for b in sorted(set(x["bytes_per_rank"])))
            lines.append(
                f"| {x['ranks']} | {mb} | {x['concurrent_s']:.3f} ({x['concurrent_min_s']:.3f}) "
                f"| {x['sequential_s']:.3f} ({x['sequential_min_s']:.3f}) "
                f"| {x['concurrent_over_sequential']:.2f} |"
            )
    if loaders is not None:
        lines += ["", "the same files through the loaders users pick for speed:", ""]
        lines += head(LOADERS_HEAD)
        for r in loaders["rows"]:
            lines.append(
                f"| {r['loader']} | {r['bytes'] / 1e9:.2f} | {r['median_s']:.3f} "
                f"({r['min_s']:.3f}) | {r['gb_per_s']:.2f} | {r['specbind_over_it']:.2f} |"
            )
        lines += [f"skipped: {s}" for s in loaders["skipped"]]
    return lines
